"""The Slurm allocation's end as the head learns it while the job runs, and what a move of it
means. Slurm brings the end forward when it preempts the job with a grace (`GraceTime`: the
end becomes the preemption plus that grace) or an administrator shortens the limit. A
preemption signals the job's srun steps only: where the fan-out is not one (the pdsh
launcher's DeepSpeed runner reaches the nodes over ssh), nothing of the job hears it, and
the end moving is the only sign. Pure: answers in (seconds left, on the head's monotonic
clock), decisions out.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.outcome.stop import GraceInForce
from orchestrator.specs.slurm import SLURM_KILL_WAIT_KEPT_S, SLURM_STOP_MARGIN_S

# Earlier than the last answer by more than this: the end moved. squeue says whole seconds,
# and a slow answer puts its moment off: both are well under it.
MOVED_S = 15.0


@dataclass
class AllocationEnd:
    """Where the allocation's end stands: the last answer's, and the one it moved to."""

    last: float | None = None  # the end, as the last answer put it
    moved_to: float | None = None  # the end Slurm brought forward to (None: it did not)

    def answered(self, left: float, at: float) -> None:
        """Take in an answer: `left` seconds, asked at `at`."""
        ends = at + left
        if self.last is not None and ends < self.last - MOVED_S:
            self.moved_to = ends
        self.last = ends

    def stop_due(self, now: float, grace: float) -> bool:
        """The end moved: stop once what is left of it holds no more than the grace and the
        margin the allocation's own limit keeps (at once, after a preemption's short grace)."""
        return self.moved_to is not None and now >= self.moved_to - grace - SLURM_STOP_MARGIN_S

    def grace(self, asked: float, stop_at: float) -> GraceInForce | None:
        """The stop's grace, cut to end before the moved end (what the head keeps for the
        teardown and the record aside); None: nothing to cut."""
        if self.moved_to is None:
            return None
        left = self.moved_to - SLURM_KILL_WAIT_KEPT_S - stop_at
        if left >= asked:
            return None
        return GraceInForce(max(0.0, left), (
            f"cut from {asked:g} s: Slurm ends the allocation {self.moved_to - stop_at:.0f} s "
            "after the stop (a preemption's grace, or a shorter limit)"))  # fmt: skip
