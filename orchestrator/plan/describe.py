"""A plan shown to a user: the JSON document (`--dry-run --json`) and the readable form
(`--dry-run`), every command line shell-quoted so it can be pasted. Secrets redacted. Pure."""

from __future__ import annotations

import base64
import json
import shlex

from orchestrator.plan.agent_command import kill_command
from orchestrator.plan.launch_plan import (
    HEAD_LAUNCHER_NAME,
    Destination,
    LaunchPlan,
    PlannedFile,
)
from orchestrator.plan.launchers.pdsh import PDSH_SPEC_NAME, SHIM_DIR
from orchestrator.plan.launchers.standard import standard_spec_name
from orchestrator.plan.pdsh_command import SHIM_CONFIG_NAME
from orchestrator.remote.agent_spec import RANK_PROGRAM, node_dir_shown
from orchestrator.remote.procs import NODE_DIR_VAR, NODE_RANK_VAR
from orchestrator.specs.constants import PDSH_CONFIG_NAME, standard_config_name
from orchestrator.specs.jobenv import redact
from orchestrator.specs.units import format_bytes
from orchestrator.specs.words import Fanout

DEEPSPEED_WINDOW = 1024  # the -f DeepSpeed's pdsh runner passes (deepspeed/launcher/constants.py)
_AGENT_WORD_LIMIT = 200  # longer words (the inline agent) are abbreviated in the readable form


# ----- the JSON document ------------------------------------------------------------
def plan_summary(plan: LaunchPlan) -> dict:
    """The plan as one JSON-able document (what --dry-run --json prints); secrets redacted."""
    head = plan.launch.head_process
    return {
        "job_id": plan.job_id,
        "launcher": plan.launcher,
        "hosts": [{"host": h.host, "slots": h.slots} for h in plan.hostfile.hosts],
        "nproc_per_node": plan.job.nproc,
        "world_size": plan.world_size,
        "ranks_per_node": list(plan.job.ranks_per_node),
        "python": plan.python,
        "workdir": plan.workdir,
        "main": f"{plan.main_host}:{plan.main_port}",
        "main_port_chosen": plan.main_port_chosen,
        "script": plan.job.script,
        "args": list(plan.job.args),
        "run_dir": plan.job.run_dir,
        "private_dir": plan.job.private_dir,
        "fanout": plan.job.fanout,
        "transport": plan.transport,
        "slurm_job": plan.job.slurm_job or None,
        "head_process": {
            "argv": list(head.argv),
            "cwd": head.cwd,
            "set_env": redact(dict(head.set_env)),
            "drop_env": list(head.drop_env),
            "path_prepend": list(head.path_prepend),
        },
        "head_command": list(plan.launch.head_command),
        "node_command": list(plan.launch.node_command),
        "rank_command": list(plan.job.rank_command),
        "nodes": [
            {"node": node, "node_rank": rank, "runs": node_runs(plan, rank)}
            for rank, node in enumerate(plan.hosts)
        ],
        "agent_spec": plan.launch.agent_spec.to_dict(),  # holds no value of the job's env
        "node_private": {"env": plan.redacted_env, "rank_argv": list(plan.job.rank_command)},
        "teardown_command": kill_command(plan.python, plan.job_id, plan.job.grace),
        "workers_wait_for_main_port": plan.launch.wait_for_main,
        "env": plan.redacted_env,
        "files": _files_summary(plan),
    }




def _files_summary(plan: LaunchPlan) -> dict[str, str]:
    files = {}
    for planned in plan.files:
        files[planned.name] = _shown_content(planned)
    if plan.launcher == "pdsh":
        files[PDSH_CONFIG_NAME] = rendered_pdsh_config(plan)
    if plan.launcher == "standard":
        for rank in range(len(plan.hosts)):
            files[standard_config_name(rank)] = rendered_config(
                plan.file(standard_spec_name(rank))
            )
    return files


def _shown_content(planned: PlannedFile) -> str:
    if planned.name == HEAD_LAUNCHER_NAME:
        return f"(orch's head launcher: writes {PDSH_CONFIG_NAME}, then runs accelerate launch)"
    return planned.content


def rendered_pdsh_config(plan: LaunchPlan) -> str:
    """The accelerate config the head's launcher will write (imports accelerate)."""
    return rendered_config(plan.file(PDSH_SPEC_NAME))


def rendered_config(spec_file: PlannedFile) -> str:
    """The accelerate config the head launcher program writes from this spec (imports
    accelerate: only the JSON form of a dry run shows it)."""
    from orchestrator.remote.accelerate_head import config_text

    spec = json.loads(spec_file.content)
    return config_text(spec["fields"], spec["header"])




# ----- what each node runs ------------------------------------------------------------
def node_runs(plan: LaunchPlan, node_rank: int) -> str:
    """The command the agent on the node with this rank runs, shell-quoted, its variables
    filled in."""
    node, root = plan.hosts[node_rank], plan.job.node_root
    if plan.launch.node_command:
        words = list(plan.command_of(node_rank))
        if words[:2] == ["/bin/sh", "-c"]:
            return (
                words[2]
                .replace(f'"${NODE_DIR_VAR}', f'"{node_dir_shown(plan.job_id, node, root)}')
                .replace(f"${NODE_RANK_VAR}", str(node_rank))
                .removeprefix("exec ")
            )
        return shlex.join(words)
    return _deepspeed_node_command(plan, node_rank)


def _deepspeed_node_command(plan: LaunchPlan, node_rank: int) -> str:
    """DeepSpeed's per-node launcher, as its pdsh runner writes it on the head (the runner
    builds it at run time; orch's shim hands its words to the agent, without the runner's
    exports of the head's environment)."""
    world = {h.host: list(range(plan.job.nproc)) for h in plan.hostfile.hosts}
    world_info = base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
    return shlex.join([
        plan.python, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info}",
        f"--node_rank={node_rank}", f"--master_addr={plan.main_host}",
        f"--master_port={plan.main_port}", "--no_python", "--no_local_rank", RANK_PROGRAM,
    ])  # fmt: skip


# ----- the readable form ------------------------------------------------------------------
def plan_text(plan: LaunchPlan) -> str:
    """What `orch launch --dry-run` prints: the plan in the order it runs."""
    head = plan.launch.head_process
    lines = [
        f"job {plan.job_id}: {plan.launcher} launcher, {plan.shape_text} = {plan.world_size} "
        f"ranks, main {plan.main_host}:{plan.main_port}",
        *(["  (main port picked by orch: free on node 0 and reserved there for this job; a "
           "dry run shows the first one it tries)"] if plan.main_port_chosen else []),
        f"record: {plan.job.run_dir}",
        "",
        "files:",
        *(f"  {_file_place(plan, f)}" for f in plan.files),
        "",
        f"the head runs, in {head.cwd}:",
        f"  {_head_command_line(plan)}",
    ]
    if head.drop_env:
        lines.append(f"  (not passed on from the head: {', '.join(head.drop_env)})")
    if plan.launch.head_command:
        hosts = ",".join(plan.hosts)
        pdsh = [_shim_real_pdsh(plan), "-S", "-f", str(DEEPSPEED_WINDOW), "-w", hosts]
        lines += [
            "",
            "DeepSpeed's runner then calls pdsh, which orch's shim runs as:",
            f"  {shlex.join(pdsh)} <orch's inline agent, running the node's command below>",
        ]
    env = " ".join(f"{name}={shlex.quote(value)}" for name, value in plan.redacted_env.items())
    runs = (
        "DeepSpeed's per-node launcher, as DeepSpeed's runner writes it (with accelerate's "
        "ACCELERATE_* settings added to the environment)"
        if plan.launch.head_command
        else "its command"
    )
    lines += [
        "",
        f"every node's agent, in {plan.workdir}, with {env}, runs {runs}:",
        *(f"  {node} (node rank {k}): {node_runs(plan, k)}" for k, node in enumerate(plan.hosts)),
        "",
        f"and the launcher starts every rank through {RANK_PROGRAM}, which runs exactly:",
        f"  {shlex.join(plan.job.rank_command)}",
    ]
    if plan.launch.wait_for_main:
        lines.append(f"  (nodes other than {plan.main_host} start once its port answers)")
    teardown = kill_command(plan.python, plan.job_id, plan.job.grace)
    lines += ["", "teardown (every node, by job id):", f"  {_abbreviated(teardown)}"]
    if plan.job.fanout == Fanout.SRUN:
        step = f"{plan.job.slurm_job}.<step>"
        lines.append(f"  then `scancel {step}`: what Slurm still runs of the step")
    lines += ["", "(--dry-run --json prints the whole plan, every file and command line in full)"]
    return "\n".join(lines) + "\n"


def _file_place(plan: LaunchPlan, planned: PlannedFile) -> str:
    note = {
        Destination.PRIVATE: " (private, removed when the job ends)",
        Destination.NODE: " (also sent to every node, in its agent's spec)",
    }.get(planned.where, "")
    return f"{plan.file_path(planned)}{note}"


def _head_command_line(plan: LaunchPlan) -> str:
    head = plan.launch.head_process
    env = redact(dict(head.set_env))
    words = [f"{name}={value}" for name, value in env.items()]
    if head.path_prepend:
        words.append("PATH=" + ":".join([*head.path_prepend, "$PATH"]))
    assignments = " ".join(
        w if w.startswith("PATH=") else shlex.quote(w) for w in words
    )
    command = " ".join(_abbreviated(word) for word in _quoted(list(head.argv)))
    return f"env {assignments} {command}" if assignments else command


def _quoted(argv: list[str]) -> list[str]:
    return [shlex.quote(word) for word in argv]


def _abbreviated(text: str) -> str:
    """An inline program (the agent, tens of KB) shown by its start and size."""
    if len(text) <= _AGENT_WORD_LIMIT:
        return text
    return f"{text[:60]}...<{format_bytes(len(text))}: orch's inline agent>...{text[-40:]}"


def _shim_real_pdsh(plan: LaunchPlan) -> str:
    config = json.loads(plan.file(f"{SHIM_DIR}/{SHIM_CONFIG_NAME}").content)
    return str(config["real_pdsh"])
