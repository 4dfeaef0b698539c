"""Whether a batch job with --requeue goes on in another allocation, on values: the stop's
cause, the job's end, the allocation's number and what Slurm says of the job."""

from __future__ import annotations

import pytest

from orchestrator.outcome.requeue import (
    RequeueBy,
    RequeueDecision,
    RequeueFacts,
    decide_requeue,
    requeue_failed,
)
from orchestrator.outcome.states import JobState, StopCause
from orchestrator.specs.slurm import RequeueSettings, SlurmJobView, parse_job_view, restart_count

ASKED = RequeueSettings(requeue=True, max_requeues=3)
RUNNING = SlurmJobView("RUNNING", 0)


def _facts(cause: StopCause | None = StopCause.SLURM_LIMIT, *, state: JobState = JobState.STOPPED,
           allocation: int = 1, at_start: int = 0,
           slurm: SlurmJobView | None = RUNNING) -> RequeueFacts:  # fmt: skip
    return RequeueFacts(state, cause, allocation, at_start, slurm)


@pytest.mark.parametrize("cause", [StopCause.SLURM_LIMIT, StopCause.SLURM_SIGNAL])
def test_a_stop_for_the_time_limit_or_a_preemption_is_requeued_by_orch(cause: StopCause) -> None:
    decision = decide_requeue(_facts(cause), ASKED)
    assert decision is not None and decision.by == RequeueBy.ORCH and decision.goes_on
    assert decision.why.startswith(f"stopped by {cause.said}: requeued (`scontrol requeue`)")
    assert "allocation 2 (requeue 1 of at most 3)" in decision.why


def test_without_requeue_nothing_is_decided() -> None:
    assert decide_requeue(_facts(), RequeueSettings()) is None


@pytest.mark.parametrize(
    ("facts", "said"),
    [(_facts(None, state=JobState.SUCCEEDED), "the job succeeded: nothing to requeue"),
     (_facts(None, state=JobState.FAILED), "the job failed for its own reasons"),
     (_facts(None, state=JobState.KILLED), "killed by `orch kill`: not requeued"),
     (_facts(StopCause.CTRL_C, state=JobState.INTERRUPTED),
      "stopped by Ctrl-C: a stop the user asked for is not requeued"),
     (_facts(StopCause.ORCH_STOP), "stopped by `orch stop`: a stop the user asked for"),
     (_facts(StopCause.TIME_LIMIT), "(--time-limit, the job's own): not requeued"),
     # scancel: Slurm's SIGTERM starts the stop, and Slurm is ending the job meanwhile
     (_facts(StopCause.SLURM_SIGNAL, slurm=SlurmJobView("COMPLETING", 0)),
      "Slurm is ending the job itself (COMPLETING: `scancel`, or a preemption that cancels)"),
     (_facts(slurm=None), "Slurm did not say the job's state"),
     (_facts(allocation=4), "requeued 3 time(s) already, the most --max-requeues allows (3)")],
)  # fmt: skip
def test_what_is_not_requeued_says_why(facts: RequeueFacts, said: str) -> None:
    decision = decide_requeue(facts, ASKED)
    assert decision is not None and decision.by == RequeueBy.NONE and not decision.goes_on
    assert said in decision.why


@pytest.mark.parametrize("view", [SlurmJobView("COMPLETING", 1), SlurmJobView("PENDING", 1),
                                  SlurmJobView("REQUEUED", 0)])  # fmt: skip
def test_a_job_its_script_or_slurm_requeued_is_not_requeued_twice(view: SlurmJobView) -> None:
    # Lightning's auto_requeue: rank 0 ran `scontrol requeue` during the grace, so Slurm's
    # restart count is past the one this allocation started with.
    for cause in (StopCause.SLURM_SIGNAL, StopCause.SLURM_LIMIT, None):
        decision = decide_requeue(_facts(cause, slurm=view), ASKED)
        assert decision is not None and decision.by == RequeueBy.SLURM and decision.goes_on
        assert "not requeued a second time; it goes on in allocation 2" in decision.why


def test_slurms_restart_count_is_compared_with_the_one_the_allocation_started_with() -> None:
    view = SlurmJobView("RUNNING", 2)  # requeued twice before this allocation, not since
    decision = decide_requeue(_facts(allocation=3, at_start=2, slurm=view), ASKED)
    assert decision is not None and decision.by == RequeueBy.ORCH
    assert "allocation 4 (requeue 3 of at most 3)" in decision.why


def test_a_requeue_slurm_refused_ends_the_job_and_says_how_to_go_on() -> None:
    asked = decide_requeue(_facts(), ASKED)
    assert asked is not None
    failed = requeue_failed(asked, "Requested operation is presently disabled", "42")
    assert failed.by == RequeueBy.NONE
    assert failed.why == ("stopped by the Slurm allocation's time limit: but `scontrol requeue "
                          "42` failed: Requested operation is presently disabled; requeue it "
                          "by hand to go on")  # fmt: skip


def test_the_decision_round_trips_through_json() -> None:
    decision = RequeueDecision(RequeueBy.SLURM, "why")
    assert RequeueDecision.from_json(decision.to_json()) == decision
    assert RequeueDecision.from_json(None) is None


def test_scontrols_line_gives_the_state_and_restart_count() -> None:
    line = ("JobId=3 JobName=orch-x UserId=root(0) JobState=COMPLETING Reason=None "
            "Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 EndTime=Unknown")  # fmt: skip
    assert parse_job_view(line) == SlurmJobView("COMPLETING", 1)
    assert parse_job_view("slurm_load_jobs error: Invalid job id specified") is None
    assert restart_count({"SLURM_RESTART_COUNT": "2"}) == 2
    assert restart_count({}) == 0
