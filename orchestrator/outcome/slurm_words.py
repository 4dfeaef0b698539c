"""A failure of a job whose nodes srun started, told in Slurm's words. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from orchestrator.outcome.states import Failure, FailureKind

SRUN_ERROR = "srun: error: "


def in_slurm_words(
    failure: Failure,
    head_lines: tuple[str, ...],
    heard_any: bool,
    node_problems: Mapping[str, str],
) -> Failure:
    """A failure of a job whose nodes srun started, as Slurm tells it: srun's own refusal
    when no node ever answered (no allocation left, too few nodes, a node not in it), and
    a node Slurm took out (`node_problems`: node -> its state and reason) named first."""
    refusals = [line.split(SRUN_ERROR, 1)[1] for line in head_lines if SRUN_ERROR in line]
    if not heard_any and refusals:
        return replace(failure, node="", reason=f"srun refused the step: {refusals[0]}",
                       rank=None, kind=FailureKind.HEAD)  # fmt: skip
    for node, problem in node_problems.items():
        # A drained node keeps its running jobs: a rank's own exit stays the cause then.
        if failure.kind != FailureKind.RANK or "DOWN" in problem.upper():
            return replace(failure, node=node, rank=None, kind=FailureKind.LOST,
                           reason=f"Slurm took {node} out: {problem}")  # fmt: skip
    return failure
