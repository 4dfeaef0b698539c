"""Asking Slurm, now and then while the job runs, what is left of its allocation: the answers
go to the verdict (outcome/allocation.py), which stops the job when Slurm has brought the
end forward (a preemption's grace) without a word to any process of it."""

from __future__ import annotations

import time

from orchestrator.nodes import slurm
from orchestrator.outcome.events import AllocationLeft
from orchestrator.run.background import OneAtATime


class AllocationWatch:
    """One `squeue` at a time, `every` seconds, from a thread of its own (it never holds the
    watch loop up); nothing where the job is not in an allocation."""

    def __init__(self, slurm_job: str | None, every: float) -> None:
        self.slurm_job = slurm_job
        self.every = every
        self._asked: float | None = None
        self._work: OneAtATime[AllocationLeft | None] = OneAtATime()

    def events(self, now: float) -> list[AllocationLeft]:
        """What Slurm answered since the last call; a new question when one is due."""
        job = self.slurm_job
        due = job is not None and (self._asked is None or now - self._asked >= self.every)
        if due and self._work.start(lambda: _ask(str(job))):
            self._asked = now
        return [answer for answer in self._work.results() if answer is not None]


def _ask(slurm_job: str) -> AllocationLeft | None:
    asked = time.monotonic()
    left = slurm.end_left(slurm_job)
    # The answer stands for the middle of the question: a slow squeue must not move the end.
    return None if left is None else AllocationLeft(left, (asked + time.monotonic()) / 2)
