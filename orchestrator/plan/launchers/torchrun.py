"""The torchrun launcher: every node's agent runs torchrun, c10d rendezvous at node 0.
Nodes may hold different rank counts: each node's agent starts its own. ColossalAI's
recipes run on it as they are (its `colossalai run` is torchrun underneath). Pure."""

from __future__ import annotations

from orchestrator.plan.launch_plan import HeadContext, JobShape, Launch, node_side
from orchestrator.remote.agent_spec import RANK_PROGRAM


def launch(job: JobShape, head: HeadContext) -> Launch:
    commands = tuple(_torchrun_command(job, count) for count in job.ranks_per_node)
    per_node = commands if len(set(job.ranks_per_node)) > 1 else ()
    return node_side(job, commands[0], (), wait_for_main=False, pdsh=head.pdsh,
                     environ=head.environ, per_node=per_node)  # fmt: skip


def _torchrun_command(job: JobShape, nproc: int) -> tuple[str, ...]:
    return (
        job.python, "-m", "torch.distributed.run",
        f"--nnodes={len(job.hostfile.hosts)}",
        f"--nproc_per_node={nproc}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={job.hostfile.names[0]}:{job.main_port}",
        f"--rdzv_id={job.rdzv_id or job.job_id}",
        *job.torchrun_args,
        "--no-python", RANK_PROGRAM,
    )  # fmt: skip
