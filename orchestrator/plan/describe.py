"""A plan shown to a user: the JSON document (`--dry-run --json`) and the readable form
(`--dry-run`), every command line shell-quoted so it can be pasted, in full: one too long
for a terminal (the inline node agent, tens of KiB) is a `CommandFile` the CLI writes, and
the text says `sh FILE`. Paths of the plan are marked "(not written)". Secrets redacted.
Pure."""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.plan.agent_command import kill_command
from orchestrator.plan.dry_checks import DryFinding
from orchestrator.plan.launch_plan import (
    HEAD_LAUNCHER_NAME,
    Destination,
    LaunchPlan,
    PlannedFile,
)
from orchestrator.plan.launchers.pdsh import PDSH_SPEC_NAME, SHIM_DIR
from orchestrator.plan.launchers.standard import standard_spec_name
from orchestrator.plan.pdsh_command import SHIM_CONFIG_NAME, node_launch_words
from orchestrator.remote.agent_spec import RANK_PROGRAM, node_dir_shown
from orchestrator.remote.procs import NODE_DIR_VAR, NODE_RANK_VAR
from orchestrator.specs.constants import (
    LAUNCHER_SHUTDOWN_VAR,
    PDSH_CONFIG_NAME,
    standard_config_name,
)
from orchestrator.specs.jobenv import redact
from orchestrator.specs.recipe import AccelerateOptions
from orchestrator.specs.units import format_bytes
from orchestrator.specs.words import Fanout

DEEPSPEED_WINDOW = 1024  # the -f DeepSpeed's pdsh runner passes (deepspeed/launcher/constants.py)
# Longer command lines (the inline agent) are written to a file rather than printed.
LONG_COMMAND = 2000
NOT_WRITTEN = "(not written)"
HEAD_FILE = "head.sh"
TEARDOWN_FILE = "teardown.sh"


@dataclass(frozen=True)
class CommandFile:
    """A command line too long to print, as the shell script the dry run writes."""

    name: str
    text: str


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
        "checkpoints": None if plan.checkpoints is None else plan.checkpoints.to_dict(),
        "files": _files_summary(plan),
    }


def dry_run_document(plan: LaunchPlan, findings: Sequence[DryFinding]) -> dict:
    """What `--dry-run --json` prints: the plan, and what the dry run found on the head."""
    return {**plan_summary(plan), "findings": [finding.to_dict() for finding in findings]}


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
    exports of the head's environment), run as the agent runs it (its KILL wait given the
    stop's grace)."""
    world = {h.host: list(range(plan.job.nproc)) for h in plan.hostfile.hosts}
    world_info = base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
    return shlex.join(node_launch_words(plan.python, [
        f"--world_info={world_info}", f"--node_rank={node_rank}",
        f"--master_addr={plan.main_host}", f"--master_port={plan.main_port}", "--no_python",
        "--no_local_rank", RANK_PROGRAM,
    ]))  # fmt: skip


# ----- the readable form ------------------------------------------------------------------
def plan_text(plan: LaunchPlan, commands_dir: str = "<dry-run dir>") -> str:
    """What `orch launch --dry-run` prints: the plan in the order it runs. A command longer
    than LONG_COMMAND is shown as `sh <commands_dir>/<file>` (command_files gives them)."""
    head = plan.launch.head_process
    place = f"{plan.job.run_dir} {NOT_WRITTEN}"
    lines = [
        f"job {plan.job_id}: {plan.launcher} launcher, {plan.shape_text} = {plan.world_size} "
        f"ranks, main {plan.main_host}:{plan.main_port}",
        *(["  (main port picked by orch: free on node 0 and reserved there for this job; a "
           "dry run shows the first one it tries)"] if plan.main_port_chosen else []),
        *([f"accelerate: {accelerate_settings(plan.job.accelerate)}"]
          if plan.launcher in ("pdsh", "standard") else []),
        *checkpoints_lines(plan),
        f"record: {place}",
        "",
        f"files {NOT_WRITTEN}: a launch writes them before it starts",
        *(f"  {_file_place(plan, f)}" for f in plan.files),
        "",
        f"the head runs, in {head.cwd}:",
        f"  {_shown_command(_head_command_line(plan), HEAD_FILE, commands_dir)}",
    ]  # fmt: skip
    if head.drop_env:
        lines.append(f"  (not passed on from the head: {', '.join(head.drop_env)})")
    if plan.launch.head_command:
        pdsh = shlex.join([_shim_real_pdsh(plan), "-S", "-f", str(DEEPSPEED_WINDOW), "-w",
                           ",".join(plan.hosts)])  # fmt: skip
        lines += [
            "",
            f"DeepSpeed's runner then calls pdsh, and orch's shim runs `{pdsh}` with orch's "
            "inline agent in place of the runner's command; the agent runs the node's command "
            "below.",
        ]
    env = " ".join(f"{name}={shlex.quote(value)}" for name, value in plan.redacted_env.items())
    runs = (
        "DeepSpeed's per-node launcher, as DeepSpeed's runner writes it (with accelerate's "
        "ACCELERATE_* settings added to the environment; its wait between the TERM and the "
        f"KILL of a rank is {LAUNCHER_SHUTDOWN_VAR} s, not its fixed 30)"
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
    lines += ["", "teardown (every node, by job id):",
              f"  {_shown_command(teardown_line(plan), TEARDOWN_FILE, commands_dir)}"]  # fmt: skip
    if plan.job.fanout == Fanout.SRUN:
        step = f"{plan.job.slurm_job}.<step>"
        lines.append(f"  then `scancel {step}`: what Slurm still runs of the step")
    lines += ["", "(--dry-run --json prints the whole plan, every file and command line in full)"]
    return "\n".join(lines) + "\n"


def command_files(plan: LaunchPlan) -> tuple[CommandFile, ...]:
    """The command lines plan_text shows as `sh FILE`, each as the script to write."""
    head = plan.launch.head_process
    wanted = ((HEAD_FILE, _head_command_line(plan), head.cwd),
              (TEARDOWN_FILE, teardown_line(plan), None))  # fmt: skip
    return tuple(
        CommandFile(name, _script(plan, command, cwd))
        for name, command, cwd in wanted
        if len(command) > LONG_COMMAND
    )


def _script(plan: LaunchPlan, command: str, cwd: str | None) -> str:
    where = f"cd {shlex.quote(cwd)} || exit\n" if cwd else ""
    return (f"#!/bin/sh\n# orch dry run of job {plan.job_id}: a command of its plan, in full\n"
            f"{where}{command}\n")  # fmt: skip


def _shown_command(command: str, name: str, commands_dir: str) -> str:
    if len(command) <= LONG_COMMAND:
        return command
    path = shlex.quote(f"{commands_dir}/{name}")
    return f"sh {path}   (the command in full, {format_bytes(len(command))}, written there)"


def teardown_line(plan: LaunchPlan) -> str:
    """The teardown as one command the head can run: pdsh runs the node program on every
    node (filling in %h)."""
    kill = kill_command(plan.python, plan.job_id, plan.job.grace)
    return shlex.join([_pdsh_of(plan), "-R", "ssh", "-w", ",".join(plan.hosts), kill])


def _pdsh_of(plan: LaunchPlan) -> str:
    argv = plan.launch.head_process.argv
    if argv and argv[0].endswith("pdsh"):
        return argv[0]
    return _shim_real_pdsh(plan) if plan.launch.head_command else "pdsh"


def checkpoints_lines(plan: LaunchPlan) -> list[str]:
    """`checkpoints: /data/ckpt, 1 copy on another node, at most 200 MB/s`, and what orch
    does with them; nothing for a job without --checkpoint-dir."""
    if plan.checkpoints is None:
        return []
    return [f"checkpoints: {plan.checkpoints.words}",
            "  (copied only where the nodes do not all see that directory: no shared "
            "filesystem)"]  # fmt: skip


def accelerate_settings(options: AccelerateOptions) -> str:
    """The accelerate / DeepSpeed settings in one line: the ZeRO stage, precision, offload."""
    if options.distributed_type == "DEEPSPEED":
        parts = [f"DeepSpeed ZeRO stage {options.zero_stage}"]
        for what, device in (("optimizer", options.offload_optimizer_device),
                             ("parameters", options.offload_param_device)):  # fmt: skip
            if device != "none":
                parts.append(f"{what} offloaded to {device}")
        if options.zero_stage == 3:
            parts += [name for name in ("zero3_init_flag", "zero3_save_16bit_model")
                      if getattr(options, name)]  # fmt: skip
    else:
        parts = [f"{options.distributed_type} (DDP, no DeepSpeed)"]
    parts.append(f"mixed precision {options.mixed_precision}")
    parts.append(f"gradient accumulation {options.gradient_accumulation_steps}")
    if options.gradient_clipping is not None:
        parts.append(f"gradient clipping {options.gradient_clipping:g}")
    if options.dynamo is not None and options.dynamo.backend != "NO":
        parts.append(f"dynamo {options.dynamo.backend} ({options.dynamo.mode})")
    return ", ".join(parts)


def _file_place(plan: LaunchPlan, planned: PlannedFile) -> str:
    note = {
        Destination.PRIVATE: " (private, removed when the job ends)",
        Destination.NODE: " (also sent to every node, in its agent's spec)",
    }.get(planned.where, "")
    return f"{plan.file_path(planned)} {NOT_WRITTEN}{note}"


def _head_command_line(plan: LaunchPlan) -> str:
    head = plan.launch.head_process
    env = redact(dict(head.set_env))
    words = [f"{name}={value}" for name, value in env.items()]
    if head.path_prepend:
        words.append("PATH=" + ":".join([*map(shlex.quote, head.path_prepend), '"$PATH"']))
    assignments = " ".join(
        w if w.startswith("PATH=") else shlex.quote(w) for w in words
    )
    command = shlex.join(head.argv)
    return f"env {assignments} {command}" if assignments else command


def _shim_real_pdsh(plan: LaunchPlan) -> str:
    config = json.loads(plan.file(f"{SHIM_DIR}/{SHIM_CONFIG_NAME}").content)
    return str(config["real_pdsh"])
