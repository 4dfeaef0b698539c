"""A sampling profile of every rank, taken now and then while the job runs: the rank the
others wait for, named without being asked.

In synchronous training every rank moves at the slowest rank's pace, so step times hide
the straggler: the others reach each collective first and wait in it. A profile tells them
apart (stacks/profile.py). Once a rank has shown a step, the job is profiled FIRST_AFTER_S
later and then every EVERY_S, for PROFILE_S at RATE samples a second (py-spy record
--nonblocking: the ranks are not paused; the rank's own faulthandler where py-spy is
missing), through the job's own transport. Each profile is kept in the record's stacks/
as `orch stacks --profile` keeps one (the job's page shows the latest), and its verdict
goes to the live view. Never during a stop or a teardown; a profile that fails is said,
never raised.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.errors import OrchError
from orchestrator.nodes.transport import plan_transport
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.records.job import now_iso
from orchestrator.records.rundir import RunDir
from orchestrator.run.background import OneAtATime
from orchestrator.run.stacks import gather_stacks, save_stacks
from orchestrator.stacks.model import NodeReport
from orchestrator.stacks.report import analyse, profile_words, result_json

FIRST_AFTER_S = 30.0  # after a rank's first step: past the first, compiled, steps
EVERY_S = 600.0
PROFILE_S = 5.0
RATE = 20  # samples a second and rank: enough to tell 20-point differences in 5 s
TIMEOUT_S = 30.0  # a node's answer, beyond the profile's own seconds
TAKEN_BY = "orch, while the job ran"


def profile_every_rank(plan: LaunchPlan) -> list[NodeReport]:
    """Every node's profile of its ranks, through the job's own transport."""
    return gather_stacks(plan.hosts, plan.job_id, plan.python, TIMEOUT_S,
                         profile_seconds=PROFILE_S, rate=RATE, transport=plan_transport(plan),
                         node_root=plan.job.node_root)  # fmt: skip


class StragglerWatch:
    """At most one profile at a time, taken by `take`; `said()` hands over what finished
    ones found."""

    def __init__(self, job_id: str, take: Callable[[], list[NodeReport]], run: RunDir,
                 taken_at: Callable[[], str]) -> None:  # fmt: skip
        self.job_id, self.take, self.run, self.taken_at = job_id, take, run, taken_at
        self.next_at: float | None = None  # None: no rank has shown a step yet
        self._profiles: OneAtATime[str] = OneAtATime()

    def tick(self, now: float, stepped: bool, busy: bool) -> None:
        """Start a profile when one is due; `busy`: the job is stopping or torn down."""
        if stepped and self.next_at is None:
            self.next_at = now + FIRST_AFTER_S
        if busy or self.next_at is None or now < self.next_at:
            return
        if self._profiles.start(self._profile):
            self.next_at = now + EVERY_S

    def _profile(self) -> str:
        try:
            result = analyse(self.job_id, self.taken_at(), PROFILE_S, self.take())
            save_stacks(self.run, {**result_json(result), "taken_by": TAKEN_BY})
            return profile_words(result)
        except (OrchError, OSError) as err:  # a profile is a help: what it meets is said
            return f"profile: could not be taken ({err})"

    def said(self) -> list[str]:
        return self._profiles.results()


def straggler_watch_for(plan: LaunchPlan, run: RunDir) -> StragglerWatch:
    """The watch of a launched job: its every rank profiled through its own transport."""
    return StragglerWatch(plan.job_id, lambda: profile_every_rank(plan), run, now_iso)
