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


def build_srun_argv(
    hosts: Sequence[str],
    agent_argv: Sequence[str],
    *,
    slurm_job: str,
    job_id: str,
    environ: Mapping[str, str],
    srun: str = "srun",
) -> list[str]:
    """One task per node on exactly `hosts` of allocation `slurm_job`. Counts are given in
    full: the allocation's own SLURM_NTASKS (inherited from salloc) would otherwise win.
    A node whose agent fails ends the step on every node (--kill-on-bad-exit)."""
    exported = [name for name in EXPORTED if name in environ]
    return [
        srun,
        f"--jobid={slurm_job}",
        f"--nodes={len(hosts)}",
        f"--ntasks={len(hosts)}",
        "--ntasks-per-node=1",
        f"--nodelist={fold_nodeset(hosts)}",
        "--kill-on-bad-exit=1",
        "--input=none",
        f"--job-name=orch-{job_id}",
        f"--export={','.join(exported) or 'NONE'}",
        "--",
        *agent_argv,
    ]


# The first thing a node command's step prints on stderr: without it, srun never started
# the command (the node is down, the step was refused), and its stderr says why.
STEP_STARTED = "orch-step-started"
# Runs the command as ssh would (a shell's -c), after saying the step started.
_STEP_SHELL = f'echo {STEP_STARTED} >&2; exec /bin/sh -c "$1"'


def node_step_argv(
    node: str,
    command: str,
    *,
    slurm_job: str,
    environ: Mapping[str, str],
    srun: str = "srun",
) -> list[str]:
    """One orch command on one node of allocation `slurm_job`, where ssh into compute nodes
    is refused: its own one-task step beside the job's (--overlap), stdin passed through,
    lines as the command wrote them. `command` is orch's own shell command (as ssh would run
    it); nothing the user typed is in it."""
    exported = [name for name in EXPORTED if name in environ]
    return [
        srun,
        f"--jobid={slurm_job}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--input=all",
        "--quiet",
        "--job-name=orch-node",
        f"--export={','.join(exported) or 'NONE'}",
        "--",
        "/bin/sh",
        "-c",
        _STEP_SHELL,
        "orch-node",
        command,
    ]
