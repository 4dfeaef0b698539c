"""`orch submit RECIPE --sbatch`: the batch script that runs the same submit inside a new
Slurm allocation, as text. Pure."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import UsageError

SCRIPT_NAME = "sbatch.sh"
OUTPUT_NAME = "sbatch.out"


@dataclass(frozen=True)
class BatchRequest:
    """What the allocation holds and what runs in it (`command`: orch itself, which takes
    the nodes from the allocation and starts them with srun)."""

    job_id: str
    name: str
    nodes: int
    ntasks_per_node: int
    workdir: str
    output: str
    command: tuple[str, ...]
    gpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None


def batch_request(
    *,
    job_id: str,
    name: str,
    nodes: int | None,
    ntasks_per_node: int | None,
    gpus_per_node: int | None,
    workdir: str,
    output: str,
    command: Sequence[str],
    time: str | None = None,
    partition: str | None = None,
    account: str | None = None,
) -> BatchRequest:
    if nodes is None:
        raise UsageError(
            "--sbatch needs a node count",
            "pass --nodes N, or set `slurm: {nodes: N}` in the recipe",
        )
    return BatchRequest(
        job_id=job_id, name=name, nodes=nodes,
        ntasks_per_node=ntasks_per_node or gpus_per_node or 1, workdir=workdir, output=output,
        command=tuple(command), gpus_per_node=gpus_per_node, time=time, partition=partition,
        account=account,
    )  # fmt: skip


def render_batch_script(request: BatchRequest) -> str:
    """The script sbatch runs on the allocation's first node. One task per rank is asked
    for, so SLURM_TASKS_PER_NODE tells the inner orch the ranks per node."""
    lines = [
        "#!/bin/sh",
        f"# orch job {request.job_id}: written by `orch submit --sbatch`.",
        f"#SBATCH --job-name={request.name}",
        f"#SBATCH --nodes={request.nodes}",
        f"#SBATCH --ntasks-per-node={request.ntasks_per_node}",
        f"#SBATCH --chdir={request.workdir}",
        f"#SBATCH --output={request.output}",
    ]
    if request.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={request.gpus_per_node}")
    for option, value in (("time", request.time), ("partition", request.partition),
                          ("account", request.account)):  # fmt: skip
        if value:
            lines.append(f"#SBATCH --{option}={value}")
    lines.append("exec " + " ".join(shlex.quote(word) for word in request.command))
    return "\n".join(lines) + "\n"
