"""pdsh's command line and environment, as values: what the plan records and the executor
runs (nodes/pdsh.py). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from orchestrator.errors import OrchError
from orchestrator.remote.agent_spec import AgentSpec
from orchestrator.specs.constants import LAUNCHER_SHUTDOWN_VAR

DEFAULT_WINDOW = 64  # pdsh -f: how many nodes it runs a command on at once
DEFAULT_CONNECT_TIMEOUT = 10
# Keepalives make ssh itself notice a node that stops answering.
SSH_ARGS_APPEND = "-o BatchMode=yes -o ServerAliveInterval=5 -o ServerAliveCountMax=3"


def job_window(host_count: int) -> int:
    """pdsh's window (-f) for a command that runs until the job ends.

    The window slides: with fewer slots than nodes, the nodes
    past the window start only when a running one finishes, which for a
    training job is never. Short commands keep the default window.
    """
    return max(DEFAULT_WINDOW, host_count)


def build_pdsh_argv(
    hosts: Sequence[str],
    remote_command: str,
    window: int = DEFAULT_WINDOW,
    *,
    connect_timeout: int | None = DEFAULT_CONNECT_TIMEOUT,
    command_timeout: int | None = None,
    pdsh: str = "pdsh",
) -> list[str]:
    """pdsh over ssh on `hosts`; -S: exit with the largest remote exit code."""
    if not hosts:
        raise OrchError("no hosts to run on", "check the hostfile")
    argv = [pdsh, "-R", "ssh", "-S", "-f", str(window)]
    if connect_timeout is not None:
        argv += ["-t", str(connect_timeout)]
    if command_timeout is not None:
        argv += ["-u", str(command_timeout)]
    return [*argv, "-w", ",".join(hosts), remote_command]


def pdsh_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment pdsh runs in: ssh rcmd, batch mode and keepalives added."""
    env = dict(base)
    env["PDSH_RCMD_TYPE"] = "ssh"
    extra = env.get("PDSH_SSH_ARGS_APPEND", "")
    if SSH_ARGS_APPEND not in extra:
        env["PDSH_SSH_ARGS_APPEND"] = f"{extra} {SSH_ARGS_APPEND}".strip()
    return env


# pdsh options that take a value (the ones DeepSpeed passes and a few common ones).
_OPTIONS_WITH_VALUE = {"-f", "-w", "-x", "-R", "-l", "-t", "-u", "-g", "-X", "-N"}


def split_pdsh_args(args: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """(options, hosts, remote command words) of a pdsh command line."""
    options: list[str] = []
    hosts: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg == "-":
            break
        if arg in _OPTIONS_WITH_VALUE and i + 1 < len(args):
            if arg == "-w":
                hosts += [h for h in args[i + 1].split(",") if h]
            else:
                options += [arg, args[i + 1]]
            i += 2
        elif arg.startswith("-w") and len(arg) > 2:
            hosts += [h for h in arg[2:].split(",") if h]
            i += 1
        else:
            options.append(arg)
            i += 1
    return options, hosts, list(args[i:])


# ----- the pdsh shim on DeepSpeed's PATH (pdsh launcher) ---------------------------
SHIM_NAME = "pdsh"
SHIM_CONFIG_NAME = "pdsh-shim.json"


def shim_script(config_path: str, orch_python: str) -> str:
    """The `pdsh` orch puts first on DeepSpeed's PATH: nodes/pdsh.py's shim_main rewrites the
    runner's call so each node's launcher runs under the agent, then execs the real pdsh."""
    return (
        f"#!{orch_python}\n"
        "# Written by orch for one job: wraps DeepSpeed's per-node command in the orch agent.\n"
        "import sys\n"
        "from orchestrator.nodes.pdsh import shim_main\n"
        f"sys.exit(shim_main({config_path!r}, sys.argv[1:]))\n"
    )


# What the ranks of the pdsh launcher get from the head besides the job's own variables:
# the settings accelerate hands its ranks (ACCELERATE_*) and the NCCL ones it may add.
LAUNCHER_ENV_PREFIXES = ("ACCELERATE_", "NCCL_")
_NODE_LAUNCH_MODULE = "deepspeed.launcher.launch"
# DeepSpeed's per-node launcher, run as itself but for one thing: on a SIGTERM (a Slurm
# preemption or time limit reaches every process of the step) it TERMs each rank's process
# tree and KILLs it 30 s later (`terminate_process_tree`, fixed), cutting the stop's grace.
# Here that wait is the one torchrun and accelerate are given (LAUNCHER_SHUTDOWN_VAR: the grace
# and a margin, or the user's own value). One line, so that a dry run shows it as it runs.
NODE_LAUNCH_CODE = (
    "import os, sys, psutil; from deepspeed.launcher import launch; wait = psutil.wait_procs; "
    f'least = float(os.getenv("{LAUNCHER_SHUTDOWN_VAR}") or 30); '
    "psutil.wait_procs = lambda procs, timeout=None, callback=None: wait(procs, "
    "timeout if timeout is None else max(timeout, least), callback); "
    "sys.argv[0] = launch.__file__; launch.main()"
)


def node_launch_words(python: str, launcher_args: Sequence[str]) -> tuple[str, ...]:
    """DeepSpeed's per-node launcher with its arguments, as orch's agent runs it."""
    return (python, "-u", "-c", NODE_LAUNCH_CODE, *launcher_args)


def node_launcher_spec(
    agent: AgentSpec, words: Sequence[str], environ: Mapping[str, str]
) -> AgentSpec:
    """The agent's spec for DeepSpeed's per-node launcher, from the words DeepSpeed's runner
    gave pdsh: `export ...; ` (the head's whole environment), `cd DIR;`, then the launcher's
    argv. The launcher's argv is kept as words (pdsh's `%n` becomes the node's rank in the
    agent); the exports are dropped: the agent sets the job's environment itself (from the
    file orch wrote on the node), plus accelerate's settings for its ranks, read from this
    process's environment (which is the runner's) rather than parsed out of a shell string."""
    start = _launcher_start(words)
    env = tuple((k, v) for k, v in environ.items() if k.startswith(LAUNCHER_ENV_PREFIXES))
    # accelerate puts the working directory first on the ranks' PYTHONPATH.
    shape = replace(agent, env=env, path_first=(("PYTHONPATH", agent.workdir),))
    if start is None:
        # Not the runner's usual words: run them as DeepSpeed meant (a shell string).
        return replace(shape, shell=" ".join(words).replace("%n", "$ORCH_NODE_RANK"))
    python, launcher_args = start
    return replace(shape, command=node_launch_words(python, launcher_args), node_rank_word="%n")


def _launcher_start(words: Sequence[str]) -> tuple[str, Sequence[str]] | None:
    """The interpreter that runs `[-u] -m deepspeed.launcher.launch` in `words`, and the
    launcher's own arguments after it."""
    for index in range(len(words)):
        after = list(words[index + 1 : index + 4])
        if after[:2] == ["-m", _NODE_LAUNCH_MODULE]:
            return words[index], words[index + 3 :]
        if after == ["-u", "-m", _NODE_LAUNCH_MODULE]:
            return words[index], words[index + 4 :]
    return None
