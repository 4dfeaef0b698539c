"""From a request's spec, where the job runs and what the head is, to the LaunchPlan: the
inputs checked, the job's spec resolved (JobShape), then its launcher's module
(plan/launchers/) makes the files and command lines. Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from orchestrator.errors import UsageError
from orchestrator.plan.launch_plan import (
    HeadContext,
    JobShape,
    Launch,
    LaunchPlan,
    Placement,
    PlannedFile,
    node_private_text,
)
from orchestrator.plan.launchers import pdsh, standard, torchrun
from orchestrator.plan.request import SRUN_CHECKPOINTS, LaunchSpec
from orchestrator.remote import owned
from orchestrator.specs.checkpoints import CheckpointSettings, resolved_dir
from orchestrator.specs.constants import HOSTFILE_NAME, Transport
from orchestrator.specs.inventory import Hostfile, ranks_per_node, render_hostfile, slot_listing
from orchestrator.specs.jobenv import build_job_env
from orchestrator.specs.options import check_launcher, check_port
from orchestrator.specs.words import Fanout, fanout_named

LAUNCHERS: dict[str, Callable[[JobShape, HeadContext], Launch]] = {
    "pdsh": pdsh.launch,
    "standard": standard.launch,
    "torchrun": torchrun.launch,
}


def build_plan(spec: LaunchSpec, place: Placement, head: HeadContext) -> LaunchPlan:
    """Everything a launch does, decided up front: `spec` what runs, `place` where (its
    `main_port` resolved), `head` what the plan needs to know of the head, its environment
    included (prepare.job.head_context); the head's interpreter and working directory stand
    in for those the spec leaves open."""
    hostfile = place.hostfile
    _check_launch_inputs(spec.launcher, hostfile, spec.script, place.main_port)
    fanout = _check_fanout(place.fanout, spec.launcher, place.slurm_job)
    _check_transport(place.transport, fanout, spec.launcher)
    counts = ranks_per_node(hostfile, spec.nproc_per_node)
    _check_uneven(hostfile, counts, spec.launcher)
    workdir = spec.workdir or head.cwd
    checkpoints = _resolved_checkpoints(spec.checkpoints, workdir, fanout, place.transport)
    env = build_job_env(place.job_id, dict(spec.env), spec.passthrough, head.environ,
                        restart_count=place.restart_count, stop=spec.stop,
                        checkpoint_dir=checkpoints.dir if checkpoints else None)  # fmt: skip
    job = JobShape(
        job_id=place.job_id, launcher=spec.launcher, hostfile=hostfile, ranks_per_node=counts,
        script=spec.script, args=spec.args, python=spec.python or head.orch_python,
        workdir=workdir, main_port=place.main_port, env=env,
        run_dir=place.run_dir, private_dir=head.private_dir, fanout=fanout,
        slurm_job=place.slurm_job, accelerate=spec.accelerate,
        torchrun_args=spec.torchrun_args, rdzv_id=spec.rdzv_id or "",
        private_nonce=head.private_nonce, node_root=owned.root_setting(head.environ),
        stop=spec.stop, checkpoints=checkpoints,
    )  # fmt: skip
    launch = LAUNCHERS[spec.launcher](job, head)
    return LaunchPlan(
        job=job,
        launch=launch,
        files=(PlannedFile(HOSTFILE_NAME, render_hostfile(hostfile)), *launch.files),
        node_private=node_private_text(job),
        forwarded=tuple(name for name in spec.passthrough if name in env),
        given=tuple(name for name, _ in spec.env),
        kept=spec.env_keep,
        main_port_chosen=place.main_port_chosen,
        slurm_batch=place.slurm_batch,
        recipe=spec.recipe,
        name=spec.name,
        transport=place.transport,
    )


def _check_launch_inputs(launcher: str, hostfile: Hostfile, script: str, main_port: int) -> None:
    check_launcher(launcher)
    if not hostfile.hosts:
        raise UsageError(f"{hostfile.source or 'hostfile'}: no hosts", "add `host slots=N` lines")
    if not script:
        raise UsageError("no training script given", "orch launch --hostfile F SCRIPT [ARGS...]")
    check_port(main_port)


def _check_fanout(word: str, launcher: str, slurm_job: str) -> Fanout:
    fanout = fanout_named(word)
    if fanout != Fanout.SRUN:
        return fanout
    if not slurm_job:
        raise UsageError(
            "--fanout srun runs inside a Slurm allocation, and there is none",
            "run inside `salloc`/`sbatch` (SLURM_JOB_ID set), or use --fanout pdsh",
        )
    if launcher == "pdsh":
        raise UsageError(
            "--fanout srun starts orch's agent on every node, but the pdsh launcher's nodes "
            "are started by DeepSpeed's runner (through pdsh)",
            "use --launcher standard or torchrun with srun, or --fanout pdsh",
        )
    return fanout


def _check_transport(transport: Transport, fanout: Fanout, launcher: str) -> None:
    """Nodes reached through Slurm only: srun must start them, not pdsh (SSH)."""
    if transport != Transport.SLURM:
        return
    if launcher == "pdsh":
        raise UsageError(
            "the nodes are reached through Slurm only, but the pdsh launcher's nodes are "
            "started by DeepSpeed's runner over SSH",
            "use --launcher standard or torchrun: srun starts their nodes",
        )
    if fanout != Fanout.SRUN:
        raise UsageError(
            f"the nodes are reached through Slurm only, but --fanout {fanout} starts them "
            "over SSH",
            "leave --fanout out (srun is the default inside an allocation), or --transport ssh",
        )


def _resolved_checkpoints(given: CheckpointSettings | None, workdir: str, fanout: Fanout,
                          transport: Transport) -> CheckpointSettings | None:  # fmt: skip
    """The checkpoint settings with their directory as every node sees it (a relative one
    in the workdir); refused where srun starts the nodes: orch copies over SSH."""
    if given is None:
        return None
    if fanout == Fanout.SRUN or transport == Transport.SLURM:
        raise UsageError(*SRUN_CHECKPOINTS)
    return replace(given, dir=resolved_dir(given.dir, workdir))


def _check_uneven(hostfile: Hostfile, counts: Sequence[int], launcher: str) -> None:
    """Nodes with different slot counts run as they are on torchrun (each node's agent
    starts its own count; c10d numbers the ranks). accelerate's launchers start the same
    number everywhere (num_processes // num_machines): refused, never run short."""
    if len(set(counts)) == 1 or launcher == "torchrun":
        return
    where = hostfile.source or "the hostfile"
    raise UsageError(
        f"hosts of {where} have different slot counts ({slot_listing(hostfile)}): the "
        f"{launcher} launcher "
        "starts the same number of ranks on every node (accelerate divides num_processes by "
        "num_machines), so some slots would stay idle",
        hint=f"--launcher torchrun runs each node's own count ({sum(counts)} ranks in all); "
        f"or --nproc-per-node N runs N on every node (at most {min(counts)} here)",
    )


