"""The verdict's stops as a table: the first Ctrl-C, `orch stop` and the time limit give the
ranks their grace (nothing a node does then is a failure), a second Ctrl-C or `orch kill`
ends the job at once, the grace's end tears it down."""

from __future__ import annotations

import signal
from datetime import datetime

import pytest

from orchestrator.outcome.events import (
    AllocationLeft,
    HeadExited,
    Interrupted,
    NodeExited,
    NodeHeard,
    OutputEnded,
    SshEnded,
    StopAsked,
    Tick,
    WatchSettings,
)
from orchestrator.outcome.states import FailureKind, JobState, StopCause
from orchestrator.outcome.verdict import Decision, JobVerdict
from orchestrator.specs.slurm import (
    SLURM_KILL_WAIT_KEPT_S,
    SLURM_STOP_MARGIN_S,
    parse_kill_wait,
    slurm_end_left,
    slurm_time_left,
    stop_before_the_end,
)

HOSTS = ("n1", "n2")
SETTINGS = WatchSettings(heartbeat_timeout=10, settle=1, rank_grace=120, hang_timeout=30)
CTRL_C = Interrupted(signal.SIGINT, False, 5)


def _verdict(**changes: float | bool | str | None) -> JobVerdict:
    settings = WatchSettings(**{**SETTINGS.__dict__, **changes})
    verdict = JobVerdict(HOSTS, settings, head_launcher=False)
    for node in HOSTS:
        verdict.feed(NodeHeard(node, 0.0))
    return verdict


def _exit(node: str, at: float, code: int = 0, **fields: object) -> NodeExited:
    return NodeExited(node, {"code": code, **fields}, at=at, wall_time=1000.0 + at)


def _feed(verdict: JobVerdict, *events) -> list[Decision]:
    return [verdict.feed(event) for event in events]


def _begun(decisions: list[Decision]) -> list[StopCause]:
    return [d.begin_stop for d in decisions if d.begin_stop is not None]


def _teardowns(decisions: list[Decision]) -> list:
    return [d.tear_down for d in decisions if d.tear_down is not None]


@pytest.mark.parametrize(
    ("asked", "cause", "state", "code"),
    [
        (CTRL_C, StopCause.CTRL_C, JobState.INTERRUPTED, 130),
        (StopAsked(StopCause.ORCH_STOP, 5), StopCause.ORCH_STOP, JobState.STOPPED, 143),
    ],
)
def test_a_stop_signals_the_ranks_once_and_ranks_that_exit_end_the_job_by_its_cause(
    asked, cause, state, code
):
    verdict = _verdict()
    decisions = _feed(verdict, asked, Tick(6), StopAsked(StopCause.ORCH_STOP, 7), Tick(50),
                      _exit("n1", 41), _exit("n2", 42), OutputEnded(43), HeadExited(0, 43))
    assert _begun(decisions) == [cause]  # once, whatever is asked again
    assert _teardowns(decisions) == []
    assert decisions[-1].stop_reading
    outcome = verdict.outcome(0, stopped_by_us=False)
    assert (outcome.state, outcome.exit_code) == (state, code)
    assert outcome.failure is not None and outcome.failure.kind == FailureKind.STOPPED
    assert outcome.failure.reason == f"stopped by {cause.said}"


def test_during_the_grace_no_failure_silence_or_hang_tears_the_job_down():
    verdict = _verdict()
    decisions = _feed(
        verdict, CTRL_C,
        _exit("n1", 6, 1, rank=0, rank_code=-15),  # a rank without a handler: the signal ended it
        SshEnded("n2", 255, 7), Tick(100),  # n2 silent, its ssh gone, no output: still waiting
    )  # fmt: skip
    assert _teardowns(decisions) == []
    assert verdict.stopping


def test_the_graces_end_tears_down_what_is_left_with_the_causes_exit_code():
    verdict = _verdict()
    decisions = _feed(verdict, StopAsked(StopCause.ORCH_STOP, 5), _exit("n1", 30),
                      Tick(124.9), Tick(125))  # fmt: skip
    [failure] = _teardowns(decisions)
    assert failure.kind == FailureKind.STOPPED
    assert failure.reason == "stopped by `orch stop`: the 120 s grace ran out"
    assert not verdict.stopping
    outcome = verdict.outcome(-15, stopped_by_us=True)
    assert (outcome.state, outcome.exit_code) == (JobState.STOPPED, 143)


@pytest.mark.parametrize(
    ("second", "state", "code", "kind"),
    [
        (Interrupted(signal.SIGINT, False, 9), JobState.INTERRUPTED, 130, FailureKind.SIGNAL),
        (Interrupted(signal.SIGTERM, True, 9), JobState.KILLED, 143, FailureKind.KILLED),
    ],
)
def test_a_second_ctrl_c_or_orch_kill_during_the_grace_ends_the_job_at_once(
    second, state, code, kind
):
    verdict = _verdict()
    assert _teardowns(_feed(verdict, CTRL_C, Tick(8))) == []
    [failure] = _teardowns(_feed(verdict, second))
    assert failure.kind == kind
    outcome = verdict.outcome(-15, stopped_by_us=True)
    assert (outcome.state, outcome.exit_code) == (state, code)


def test_the_time_limit_stops_the_job_from_its_first_event():
    verdict = JobVerdict(HOSTS, WatchSettings(time_limit=60, rank_grace=20), head_launcher=False)
    beats = [NodeHeard(node, at) for at in range(10, 71, 5) for node in HOSTS]
    decisions = _feed(verdict, *beats[:-2], Tick(69.9), *beats[-2:])
    assert _begun(decisions) == [StopCause.TIME_LIMIT]
    assert [d.begin_stop for d in decisions][-2] == StopCause.TIME_LIMIT  # at 70 s, not before
    decisions = _feed(verdict, _exit("n1", 75), _exit("n2", 76), Tick(200))
    assert _teardowns(decisions) == [] and decisions[-1].stop_reading
    outcome = verdict.outcome(0, stopped_by_us=True)
    assert (outcome.state, outcome.exit_code) == (JobState.STOPPED, 124)


def test_no_time_limit_means_the_job_runs_on():
    verdict = JobVerdict(HOSTS, WatchSettings(), head_launcher=False)
    decisions = _feed(verdict, NodeHeard("n1", 0), NodeHeard("n2", 0), Tick(10**6))
    assert _begun(decisions) == []


def test_a_stop_asked_once_the_job_is_torn_down_changes_nothing():
    verdict = _verdict()
    [failure] = _teardowns(_feed(verdict, _exit("n1", 3, 7, rank=0, rank_code=7), Tick(5)))
    assert failure.kind == FailureKind.RANK
    # Ctrl-C now is an interrupt of a teardown under way, not a stop: nothing is begun.
    assert _begun(_feed(verdict, StopAsked(StopCause.ORCH_STOP, 6), CTRL_C, Tick(7))) == []
    outcome = verdict.outcome(7, stopped_by_us=True)
    assert (outcome.state, outcome.exit_code) == (JobState.FAILED, 7)


def test_a_job_that_ended_before_the_stop_reached_it_is_the_stops_all_the_same():
    verdict = _verdict()
    decisions = _feed(verdict, _exit("n1", 4), CTRL_C, _exit("n2", 6), OutputEnded(7),
                      HeadExited(0, 7))  # fmt: skip
    assert _begun(decisions) == [StopCause.CTRL_C] and _teardowns(decisions) == []
    assert verdict.outcome(0, stopped_by_us=False).state == JobState.INTERRUPTED


# ----- Slurm: its warning, its SIGTERM inside an allocation, the allocation's end ---------
@pytest.mark.parametrize(
    ("signum", "in_slurm", "stops"),
    [(signal.SIGUSR1, False, True), (signal.SIGUSR1, True, True),
     (signal.SIGTERM, True, True), (signal.SIGTERM, False, False)],
)  # fmt: skip
def test_slurms_warning_and_its_term_inside_an_allocation_give_the_ranks_their_grace(
    signum, in_slurm, stops
):
    verdict = _verdict(slurm_job="7" if in_slurm else None)
    decisions = _feed(verdict, Interrupted(signum, False, 5), Tick(6))
    if stops:
        assert _begun(decisions) == [StopCause.SLURM_SIGNAL] and _teardowns(decisions) == []
        if in_slurm:  # Slurm's TERM at the limit, during the stop: the ranks keep their grace
            term = _feed(verdict, Interrupted(signal.SIGTERM, False, 30), Tick(31))
            assert _teardowns(term) == []
        _feed(verdict, _exit("n1", 40), _exit("n2", 41), OutputEnded(42), HeadExited(0, 42))
        outcome = verdict.outcome(0, stopped_by_us=False)
        assert (outcome.state, outcome.exit_code) == (JobState.STOPPED, 143)
        assert outcome.failure.reason == "stopped by Slurm (its warning, or a preemption)"
    else:  # a TERM outside Slurm ends the job at once, as ever
        [failure] = _teardowns(decisions)
        assert failure.kind == FailureKind.SIGNAL


@pytest.mark.parametrize("term_first", [True, False])
def test_once_slurm_terms_the_head_the_grace_ends_before_its_kill_wait(term_first):
    """A requeue or `scancel` (the TERM reaches orch's batch shell) leaves KillWait seconds
    before Slurm's SIGKILL: the grace is cut so that the teardown and the record are done by
    then, whether the TERM began the stop or came during one (Slurm's warning first)."""
    verdict = _verdict(slurm_job="7", slurm_kill_wait=30, hang_timeout=None,
                       heartbeat_timeout=1000)  # fmt: skip
    if not term_first:
        assert _begun(_feed(verdict, Interrupted(signal.SIGUSR1, False, 5))) == [
            StopCause.SLURM_SIGNAL]
    assert _teardowns(_feed(verdict, Interrupted(signal.SIGTERM, False, 10))) == []
    cut_at = 10 + 30 - SLURM_KILL_WAIT_KEPT_S
    assert verdict.grace.seconds == cut_at - (10 if term_first else 5)
    assert _teardowns(_feed(verdict, Tick(cut_at - 0.5))) == []
    [failure] = _teardowns(_feed(verdict, Tick(cut_at + 0.5)))
    assert failure.kind == FailureKind.STOPPED
    assert failure.reason == (
        f"stopped by Slurm (its warning, or a preemption): the {verdict.grace.seconds:.0f} s "
        "grace ran out (cut from 120 s: Slurm ends the job 30 s after its SIGTERM, its "
        "KillWait)")


def test_a_stop_keeps_its_whole_grace_when_slurm_terms_only_the_steps_or_says_no_kill_wait():
    """A preemption TERMs the job's steps, not the batch shell (the agents tell the head):
    Slurm's GraceTime is the ranks' then, until Slurm TERMs the head in turn."""
    verdict = _verdict(slurm_job="7", slurm_kill_wait=30, hang_timeout=None,
                       heartbeat_timeout=1000)  # fmt: skip
    _feed(verdict, StopAsked(StopCause.SLURM_SIGNAL, 5))
    assert verdict.grace.seconds == 120 and _teardowns(_feed(verdict, Tick(120))) == []
    unknown = _verdict(slurm_job="7", hang_timeout=None, heartbeat_timeout=1000)
    _feed(unknown, Interrupted(signal.SIGTERM, False, 5))
    assert unknown.grace.seconds == 120 and _teardowns(_feed(unknown, Tick(120))) == []


@pytest.mark.parametrize(
    ("config", "seconds"),
    [("KillOnBadExit           = 0\nKillWait                = 30 sec\nLaunchType = x", 30.0),
     ("KillWait=45 sec", 45.0), ("Killwait nothing", None), ("", None)],
)  # fmt: skip
def test_slurms_kill_wait_is_read_from_its_config(config, seconds):
    assert parse_kill_wait(config) == seconds


def test_orch_kill_inside_an_allocation_still_ends_the_job_at_once():
    verdict = _verdict(slurm_job="7")
    [failure] = _teardowns(_feed(verdict, Interrupted(signal.SIGTERM, True, 5)))
    assert failure.kind == FailureKind.KILLED


def test_the_allocations_end_stops_the_job_in_time_for_its_grace():
    verdict = _verdict(slurm_job="7", slurm_stop_after=300, hang_timeout=None,
                       heartbeat_timeout=1000)  # fmt: skip
    assert _begun(_feed(verdict, Tick(100), Tick(299))) == []
    assert _begun(_feed(verdict, Tick(300.5))) == [StopCause.SLURM_LIMIT]
    [failure] = _teardowns(_feed(verdict, Tick(421)))  # the 120 s grace ran out
    assert failure.reason == "stopped by the Slurm allocation's time limit: the 120 s grace ran out"
    assert verdict.outcome(-15, stopped_by_us=True).exit_code == 124


def test_an_allocations_end_brought_forward_by_a_preemption_stops_the_job_at_once():
    """A preemption signals the job's srun steps only: with the pdsh launcher's ssh fan-out no
    process of the job hears it, and Slurm's answer (the end moved to the preemption plus its
    GraceTime) is the only sign. The stop begins at once and keeps its grace where it fits."""
    verdict = _verdict(slurm_job="7", slurm_stop_after=478, hang_timeout=None,
                       heartbeat_timeout=1000, rank_grace=50)  # fmt: skip
    assert _begun(_feed(verdict, AllocationLeft(598, 1), AllocationLeft(588, 11.5))) == []
    assert _begun(_feed(verdict, AllocationLeft(90, 21))) == [StopCause.SLURM_SIGNAL]
    assert verdict.grace.seconds == 50 and not verdict.grace.cut
    assert _teardowns(_feed(verdict, Tick(70))) == []
    [failure] = _teardowns(_feed(verdict, Tick(71.5)))
    assert failure.reason == (
        "stopped by Slurm (its warning, or a preemption): the 50 s grace ran out")
    assert verdict.outcome(-15, stopped_by_us=True).exit_code == 143


def test_a_grace_longer_than_what_a_preemption_leaves_is_cut_to_end_before_it():
    verdict = _verdict(slurm_job="7", hang_timeout=None, heartbeat_timeout=1000)
    _feed(verdict, AllocationLeft(3600, 1), AllocationLeft(90, 21))
    assert verdict.grace.seconds == 90 - SLURM_KILL_WAIT_KEPT_S
    assert verdict.grace.cut == ("cut from 120 s: Slurm ends the allocation 90 s after the "
                                 "stop (a preemption's grace, or a shorter limit)")  # fmt: skip


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1-02:03:04", 93784.0), ("02:03:04", 7384.0), ("03:04", 184.0), ("0:00", 0.0),
     ("UNLIMITED", None), ("NOT_SET", None), ("INVALID", None), ("", None)],
)  # fmt: skip
def test_the_time_an_allocation_has_left_is_read_from_squeue(text, seconds):
    assert slurm_time_left(text) == seconds


def test_a_job_stops_its_grace_and_a_margin_before_the_allocation_ends():
    assert stop_before_the_end(3600.0, 120.0) == 3600.0 - 120.0 - SLURM_STOP_MARGIN_S
    assert stop_before_the_end(100.0, 120.0) == 0.0  # at once: the grace does not fit
    assert stop_before_the_end(None, 120.0) is None


def test_the_allocations_end_is_read_from_squeue_in_local_time():
    now = datetime(2026, 12, 2, 18, 44, 51).timestamp()
    assert slurm_end_left("2026-12-02T18:46:21", now) == 90.0
    assert slurm_end_left("N/A", now) is None and slurm_end_left("Unknown", now) is None
