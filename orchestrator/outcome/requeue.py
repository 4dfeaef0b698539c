"""Whether a batch job (`orch submit --sbatch --requeue`) goes on in another allocation once
its attempts in this one have ended. Pure: the job's end, the stop's cause, the allocation's
number and what Slurm says of the job now in; a decision and its reason in words out.

Who requeues: orch, in the batch shell (`scontrol requeue`), after the record is written.
Slurm never requeues a job for its time limit, and only orch knows why the job stopped: its
time limit or a preemption (requeued), the user (`orch stop`, Ctrl-C, `scancel`: not), or
the script's own end (not). A script that requeues itself (Lightning's
`SLURMEnvironment(auto_requeue=True)` runs `scontrol requeue` on SIGUSR1), or Slurm's own
requeue of a preempted job, shows in Slurm's restart count before orch decides: the job is
then not requeued a second time, and still goes on in the next allocation.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.outcome.states import JobState, StopCause
from orchestrator.specs.slurm import RequeueSettings, SlurmJobView
from orchestrator.specs.words import StrEnum

_SLURM_STOPS = (StopCause.SLURM_LIMIT, StopCause.SLURM_SIGNAL)
_USER_STOPS = (StopCause.CTRL_C, StopCause.ORCH_STOP)
# Slurm's words for a job it has put back in the queue itself.
_REQUEUED_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT")


class RequeueBy(StrEnum):
    """Who puts the job back in Slurm's queue."""

    ORCH = "orch"  # orch runs `scontrol requeue` now
    SLURM = "slurm"  # already done: the script's own `scontrol requeue`, or Slurm's
    NONE = "none"  # nobody: the job ends with this allocation


@dataclass(frozen=True)
class RequeueFacts:
    """The job's end in this allocation, as orch and Slurm know it."""

    state: JobState  # how its last attempt here ended
    stop_cause: StopCause | None  # what asked it to stop (None: it ended by itself)
    allocation: int  # this allocation's number: 1 for the first
    restarts_at_start: int  # Slurm's restart count when this allocation started the job
    slurm: SlurmJobView | None  # what Slurm says of the job now (None: it did not answer)


@dataclass(frozen=True)
class RequeueDecision:
    by: RequeueBy
    why: str  # in words: requeued or not, and why

    @property
    def goes_on(self) -> bool:
        """The job runs again in another allocation, whoever requeued it."""
        return self.by != RequeueBy.NONE

    def to_json(self) -> dict[str, str]:
        return {"by": str(self.by), "why": self.why}

    @classmethod
    def from_json(cls, doc: dict | None) -> RequeueDecision | None:
        return None if not doc else cls(RequeueBy(doc["by"]), str(doc["why"]))


def decide_requeue(facts: RequeueFacts, settings: RequeueSettings) -> RequeueDecision | None:
    """Whether the job goes on in another allocation; None when --requeue was not asked for."""
    if not settings.requeue:
        return None
    view = facts.slurm
    if view is not None and (view.restarts > facts.restarts_at_start
                             or view.state in _REQUEUED_STATES):  # fmt: skip
        return RequeueDecision(RequeueBy.SLURM, (
            "Slurm has requeued the job already (the script's own `scontrol requeue`, or "
            "Slurm's on a preemption): not requeued a second time; it goes on in allocation "
            f"{facts.allocation + 1}"))  # fmt: skip
    return _by_orch(facts, settings)


def _by_orch(facts: RequeueFacts, settings: RequeueSettings) -> RequeueDecision:
    cause, view = facts.stop_cause, facts.slurm
    if cause is None:
        return _not(_own_end(facts.state))
    if cause in _USER_STOPS:
        return _not(f"stopped by {cause.said}: a stop the user asked for is not requeued")
    if cause not in _SLURM_STOPS:
        return _not(f"stopped by {cause.said} (--time-limit, the job's own): not requeued")
    if view is None:
        return _not("Slurm did not say the job's state, so whether it was cancelled is "
                    "unknown: not requeued (`scontrol requeue` it by hand to go on)")  # fmt: skip
    if view.state != "RUNNING":
        return _not(f"Slurm is ending the job itself ({view.state}: `scancel`, or a "
                    "preemption that cancels): not requeued")  # fmt: skip
    done = facts.allocation - 1
    if done >= settings.max_requeues:
        return _not(f"stopped by {cause.said}, but it was requeued {done} time(s) already, "
                    f"the most --max-requeues allows ({settings.max_requeues}): not requeued")
    return RequeueDecision(RequeueBy.ORCH, (
        f"stopped by {cause.said}: requeued (`scontrol requeue`), it goes on in allocation "
        f"{facts.allocation + 1} (requeue {done + 1} of at most {settings.max_requeues})"))


def _own_end(state: JobState) -> str:
    if state == JobState.SUCCEEDED:
        return "the job succeeded: nothing to requeue"
    if state == JobState.KILLED:
        return "killed by `orch kill`: not requeued"
    if state == JobState.INTERRUPTED:
        return "interrupted on the head: not requeued"
    return f"the job {state} for its own reasons (no time limit, no preemption): not requeued"


def _not(why: str) -> RequeueDecision:
    return RequeueDecision(RequeueBy.NONE, why)


def requeue_failed(decision: RequeueDecision, problem: str, slurm_job: str) -> RequeueDecision:
    """orch's own requeue, refused by Slurm: the job ends here, and the summary says why."""
    return _not(f"{decision.why.split(':')[0]}: but `scontrol requeue {slurm_job}` failed: "
                f"{problem}; requeue it by hand to go on")  # fmt: skip
