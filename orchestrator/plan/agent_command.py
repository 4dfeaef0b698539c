"""The head's half of the node agent: the shell command that starts remote/agent.py on a
node, with the remote/ modules it imports beside it, inline (`python -c <zlib+base64
blob>`), so a node needs no orch install. Pure: builds strings from the shipped sources and
the agent's spec.
"""

from __future__ import annotations

import shlex

from orchestrator.remote import agent_spec
from orchestrator.remote import boot_blob as _boot_blob
from orchestrator.remote import boot_code as _boot_code
from orchestrator.remote.agent_spec import AgentSpec

# The agent's parts (a part after those it imports), and the per-rank program and
# sitecustomize it writes for the ranks.
_AGENT_PARTS = (
    "logwire", "owned", "agent_spec", "procs", "main_port", "sweep", "rank_watch", "channel",
    "rank_streams", "flight_recorder", "rank", "rank_site", "env_lock",
)  # fmt: skip


def _blob() -> str:
    return _boot_blob(_AGENT_PARTS, "agent")


def _stacks_blob() -> str:
    # `orch stacks`: procs finds the ranks; rank_site says where a rank's faulthandler writes.
    return _boot_blob(("owned", "agent_spec", "procs", "rank_site"), "stacks")


def _python_c(python: str, blob: str) -> str:
    code = _boot_code(blob)
    interpreter = '"$P"' if python == "$P" else shlex.quote(python)
    return f"{interpreter} -c {shlex.quote(code)}"


def _with_any_python3(python: str, blob: str, words: tuple[str, ...]) -> str:
    """A standard-library program run with the job's interpreter, or any python3 on the
    node when that one is missing; `words` its arguments, each shell-quoted."""
    fallback = f'P={shlex.quote(python)}; [ -x "$P" ] || P=python3; '
    return fallback + f"{_python_c('$P', blob)} " + " ".join(map(shlex.quote, words))


def agent_command(python: str, spec: AgentSpec) -> str:
    """The remote shell command (for pdsh) that runs the agent; %h/%n filled in by pdsh."""
    return f"{_python_c(python, _blob())} run {agent_spec.encode(spec)} %h %n"


def agent_argv(python: str, spec: AgentSpec) -> list[str]:
    """The agent as an argv, for srun (no shell on the node): node name and node rank `-`
    are Slurm's (SLURMD_NODENAME, its place in the spec's `hosts`)."""
    return [python, "-c", _boot_code(_blob()), "run", agent_spec.encode(spec), "-", "-"]


def kill_command(python: str, job_id: str, grace: float, node: str = "%h") -> str:
    """The remote shell command that stops every process of the job on a node, and only
    that node's: nodes may share one kernel. `node`: pdsh fills in %h; under srun, `-` is
    Slurm's name for the node (remote/procs.py's SLURM_NODE).

    The sweep program needs only the standard library: when the job's interpreter
    is missing on a node, any python3 there does.
    """
    return _with_any_python3(python, _boot_blob(("procs",), "sweep"),
                             (job_id, f"{grace:g}", node))  # fmt: skip


def stop_command(python: str, job_id: str, node: str, signum: int, grace: float) -> str:
    """The remote shell command that stops the job's ranks on `node` (`-` under srun: Slurm's
    name for it): its stop file for the keepers, then `signum` to every rank's own process
    (remote/rank_stop.py); one JSON line back. Any python3 runs it."""
    parts = ("owned", "agent_spec", "procs", "rank")
    return _with_any_python3(python, _boot_blob(parts, "rank_stop"),
                             (job_id, node, str(signum), f"{grace:g}"))  # fmt: skip


def stacks_command(
    python: str, job_id: str, node: str, *, seconds: float, rate: int, method: str = "auto",
    root: str = "",
) -> str:
    """The remote shell command that prints the stacks (seconds 0) or a sampling profile of
    the job's ranks on `node` as one JSON document. Like the kill program it needs only the
    standard library, so any python3 runs it when the job's interpreter is missing; py-spy
    is looked for beside the job's interpreter first (method: auto, py-spy, faulthandler).
    `root`: the user's ORCH_NODE_ROOT, where the job's node directory is."""
    words = (job_id, node, python, f"{seconds:g}", str(rate), method, *([root] if root else []))
    return _with_any_python3(python, _stacks_blob(), words)


def look_command(python: str, job_id: str, node: str, seconds: float, root: str = "") -> str:
    """The remote shell command that looks at the job's ranks on `node` for `seconds`: each
    rank's CPU time, storage I/O and state, and its stack at both ends (remote/look.py),
    as one JSON document. Any python3 runs it."""
    words = (job_id, node, python, f"{seconds:g}", *([root] if root else []))
    parts = ("owned", "agent_spec", "procs", "rank_site", "stacks")
    return _with_any_python3(python, _boot_blob(parts, "look"), words)


def node_files_command(python: str, action: str, job_id: str, node: str,
                       root: str = "") -> str:  # fmt: skip
    """The remote shell command that writes (`write`, the settings on its stdin) or removes
    (`remove`) the job's private settings on `node`, in the node directory of the user's
    own there (remote/node_files.py; `root`: the user's ORCH_NODE_ROOT); any python3 runs
    it."""
    words = (action, job_id, node, *([root] if root else []))
    return _with_any_python3(python, _boot_blob(("owned", "agent_spec"), "node_files"), words)


def port_command(python: str, job_id: str, directory: str, ttl: float,
                 candidates: tuple[int, ...]) -> str:  # fmt: skip
    """The remote shell command that picks (and with ttl > 0 reserves) a free main port on
    node 0 among `candidates`, in order; any python3 runs it."""
    words = (directory, job_id, f"{ttl:g}", *map(str, candidates))
    return _with_any_python3(python, _boot_blob(("owned", "procs", "main_port"), "ports"), words)


def program_command(python: str, parts: tuple[str, ...], program: str,
                    words: tuple[str, ...]) -> str:  # fmt: skip
    """The remote shell command that runs remote/<program>.py with its `parts` beside it
    and `words` as its arguments; any python3 runs it."""
    return _with_any_python3(python, _boot_blob(parts, program), words)
