"""srun as the fan-out inside a Slurm allocation: the step that starts orch's agent once
on every node, as a value (the plan records it, run/launch.py runs it like pdsh). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.specs.inventory import fold_nodeset

# What the agent's own environment keeps from the head's (Slurm adds its SLURM_* names):
# nothing else of the head's environment reaches the node, as with ssh's login environment.
EXPORTED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "SHELL")
# How long a failed node's agent waits for the head to end the step before it exits (and
# Slurm's --kill-on-bad-exit ends every node's ranks): enough for the teardown's stacks.
LINGER_S = 30.0


def _one_task_per_node(
    hosts: Sequence[str],
    argv: Sequence[str],
    *,
    slurm_job: str,
    environ: Mapping[str, str],
    srun: str,
    job_name: str,
    options: Sequence[str],
    overlap: bool = False,
) -> list[str]:
    """srun of `argv` as one task on each of exactly `hosts` of allocation `slurm_job`, with
    only the EXPORTED part of the head's environment. Counts are given in full: the
    allocation's own SLURM_NTASKS (inherited from salloc) would otherwise win."""
    exported = [name for name in EXPORTED if name in environ]
    return [
        srun,
        f"--jobid={slurm_job}",
        *(["--overlap"] if overlap else []),
        f"--nodes={len(hosts)}",
        f"--ntasks={len(hosts)}",
        "--ntasks-per-node=1",
        f"--nodelist={fold_nodeset(hosts)}",
        *options,
        f"--job-name={job_name}",
        f"--export={','.join(exported) or 'NONE'}",
        "--",
        *argv,
    ]


def build_srun_argv(
    hosts: Sequence[str],
    agent_argv: Sequence[str],
    *,
    slurm_job: str,
    job_id: str,
    environ: Mapping[str, str],
    srun: str = "srun",
) -> list[str]:
    """The job's fan-out: orch's agent once on every node. A node whose agent fails ends the
    step on every node (--kill-on-bad-exit)."""
    return _one_task_per_node(
        hosts, agent_argv, slurm_job=slurm_job, environ=environ, srun=srun,
        job_name=f"orch-{job_id}", options=("--kill-on-bad-exit=1", "--input=none"),
    )  # fmt: skip


# The first thing a node command's step prints on stderr: without it, srun never started
# the command (the node is down, the step was refused), and its stderr says why.
STEP_STARTED = "orch-step-started"
# Runs the command as ssh would (a shell's -c), after saying the step started.
_STEP_SHELL = f'echo {STEP_STARTED} >&2; exec /bin/sh -c "$1"'
# One step for many nodes: each task says which node it is first and its command's exit
# code last, on stderr, so that one step gives one result per node. Its stdout goes as hex
# (od, 16 bytes a line): srun --label cuts lines at 1024 bytes, and a probe's JSON is longer.
STEP_EXIT = "orch-step-exit"
_TASK_SHELL = (
    f'echo "{STEP_STARTED} $SLURMD_NODENAME" >&2; exec 3>&1; '
    'code=$( { { /bin/sh -c "$1"; echo $? >&4; } | od -An -v -tx1 >&3; } 4>&1 ); '
    f'echo "{STEP_EXIT} $code" >&2; exit $code'
)


def node_step_argv(
    nodes: Sequence[str],
    command: str,
    *,
    slurm_job: str,
    environ: Mapping[str, str],
    srun: str = "srun",
) -> list[str]:
    """An orch command on `nodes` of allocation `slurm_job`, where ssh into compute nodes is
    refused: a step beside the job's (--overlap), one task per node, stdin passed through.
    On one node its lines are as the command wrote them; on several (Slurm's own tree
    fan-out, not one srun per node) each line is labelled with its task. `command` is orch's
    own shell command (as ssh would run it); nothing the user typed is in it."""
    one = len(nodes) == 1
    return _one_task_per_node(
        nodes, ["/bin/sh", "-c", _STEP_SHELL if one else _TASK_SHELL, "orch-node", command],
        slurm_job=slurm_job, environ=environ, srun=srun, job_name="orch-node",
        options=("--input=all", *(() if one else ("--label",)), "--quiet"), overlap=True,
    )  # fmt: skip
