"""The job verdict as a table: events with their times in, decisions and outcome out."""

from __future__ import annotations

import signal

import pytest

from orchestrator.outcome.events import (
    HeadExited,
    Interrupted,
    NodeExited,
    NodeHeard,
    OutputEnded,
    RankOutput,
    SshEnded,
    TeardownDone,
    Tick,
    WatchSettings,
)
from orchestrator.outcome.hang import hang_culprit
from orchestrator.outcome.states import HANG_EXIT_CODE, Failure, FailureKind, JobState
from orchestrator.outcome.verdict import Decision, JobVerdict
from orchestrator.remote.channel import HEARTBEAT_S
from orchestrator.stacks.fold import FoldedStacks, Outlier
from orchestrator.stacks.model import Frame, NodeReport, RankStacks, ThreadStack
from orchestrator.stacks.report import StacksResult, analyse

HOSTS = ("n1", "n2", "n3")
SETTINGS = WatchSettings(
    heartbeat_timeout=15, start_timeout=120, settle=1, drain_after_teardown=30, head_wind_down=60
)


def _verdict(head_launcher: bool = False) -> JobVerdict:
    return JobVerdict(HOSTS, SETTINGS, head_launcher=head_launcher)


def _exit(node: str, at: float, code: int = 0, **fields: object) -> NodeExited:
    return NodeExited(node, {"code": code, **fields}, at=at, wall_time=1000.0 + at)


def _feed(verdict: JobVerdict, *events) -> list[Decision]:
    return [verdict.feed(event) for event in events]


def _teardowns(decisions: list[Decision]) -> list:
    return [d.tear_down for d in decisions if d.tear_down is not None]


def _all_heard(at: float = 0.0) -> list[NodeHeard]:
    return [NodeHeard(h, at) for h in HOSTS]


def test_every_node_exits_zero_the_job_succeeds():
    verdict = _verdict()
    decisions = _feed(verdict, *_all_heard(), *(_exit(h, 5) for h in HOSTS),
                      OutputEnded(6), HeadExited(0, 6))  # fmt: skip
    assert _teardowns(decisions) == []
    assert decisions[-1].stop_reading
    outcome = verdict.outcome(0, stopped_by_us=False)
    assert (outcome.state, outcome.exit_code, outcome.failure) == (JobState.SUCCEEDED, 0, None)
    assert outcome.node_exit_codes == dict.fromkeys(HOSTS, 0)


def test_the_earliest_failure_within_the_settle_window_is_the_jobs():
    verdict = _verdict()
    _feed(verdict, *_all_heard())
    # n2 reports first, but n3's rank failed earlier by the agents' own clocks.
    first = verdict.feed(_exit("n2", 10, 1, rank=3, failed_at=1010.5))
    assert first.tear_down is None  # an earlier failure may still be on its way
    second = verdict.feed(_exit("n3", 10.4, 7, rank=5, rank_code=7, failed_at=1010.2))
    assert second.tear_down is None
    [failure] = _teardowns(_feed(verdict, Tick(11.0)))
    assert (failure.node, failure.rank, failure.exit_code) == ("n3", 5, 7)
    # A failure reported after the window does not replace the verdict.
    assert _teardowns(_feed(verdict, _exit("n1", 12, 9, rank=0, failed_at=1000.0))) == []
    outcome = verdict.outcome(1, stopped_by_us=True)
    assert (outcome.state, outcome.exit_code) == (JobState.FAILED, 7)
    assert outcome.failure is not None and outcome.failure.node == "n3"


def test_a_rank_whose_exit_code_went_unseen_takes_the_nodes_code():
    verdict = _verdict()
    _feed(verdict, *_all_heard(), _exit("n2", 4, 7, rank=3))
    [failure] = _teardowns(_feed(verdict, Tick(5.1)))
    assert (failure.node, failure.rank, failure.exit_code) == ("n2", 3, 7)
    assert failure.reason == "exited with code 7"


def test_the_agents_error_is_the_reason():
    verdict = _verdict()
    _feed(verdict, *_all_heard(), _exit("n1", 1, 127, error="working directory /w does not exist"))
    [failure] = _teardowns(_feed(verdict, Tick(2.5)))
    assert failure.reason == "working directory /w does not exist" and failure.exit_code == 127


def test_a_failure_with_the_output_ended_needs_no_settle_wait():
    verdict = _verdict()
    _feed(verdict, *_all_heard(), _exit("n1", 1, 3))
    [failure] = _teardowns(_feed(verdict, OutputEnded(1.1)))
    assert failure.node == "n1"


@pytest.mark.parametrize(("silent_for", "torn_down"), [(14.9, False), (15.1, True)])
def test_a_silent_node_is_torn_down_after_the_heartbeat_timeout(silent_for, torn_down):
    verdict = _verdict()
    # n2 was last heard at 0; n1 and n3 keep talking.
    _feed(verdict, *_all_heard(0), NodeHeard("n1", 10), NodeHeard("n3", 10))
    failures = _teardowns(
        _feed(verdict, NodeHeard("n1", silent_for), NodeHeard("n3", silent_for), Tick(silent_for))
    )
    assert bool(failures) is torn_down
    if torn_down:
        assert failures[0].node == "n2" and failures[0].kind == FailureKind.SILENT
        assert failures[0].reason == "stopped answering (no heartbeat for 15 s)"


def _others_until(at: float) -> list[NodeHeard]:
    """n1 and n3 heard every second up to `at`."""
    times = [float(t) for t in range(1, int(at) + 1)] + [at]
    return [NodeHeard(node, t) for t in times for node in ("n1", "n3")]


@pytest.mark.parametrize(("silent_for", "torn_down"), [(19.9, False), (20.1, True)])
def test_a_node_whose_heartbeats_come_late_has_that_much_longer(silent_for, torn_down):
    # n2's last heartbeat arrived 5 s after it was sent: its output waits on the way (a flood
    # through a busy head), and as much of its silence is that wait.
    verdict = _verdict()
    _feed(verdict, *_all_heard(0), NodeHeard("n2", 0.5, behind=5.0), *_others_until(20))
    at = 0.5 + silent_for
    failures = _teardowns(_feed(verdict, *_others_until(at), Tick(at)))
    assert bool(failures) is torn_down
    if torn_down:
        assert (failures[0].node, failures[0].kind) == ("n2", FailureKind.SILENT)


def test_late_heartbeats_put_a_silence_off_by_30_s_at_most():
    verdict = _verdict()
    _feed(verdict, *_all_heard(0), NodeHeard("n2", 1, behind=600.0))
    assert _teardowns(_feed(verdict, *_others_until(45.9), Tick(45.9))) == []
    [failure] = _teardowns(_feed(verdict, *_others_until(46.1), Tick(46.1)))
    assert failure.node == "n2"


def test_after_a_frozen_node_reading_ends_once_every_other_node_has_stopped():
    verdict = _verdict()
    _feed(verdict, *_all_heard(0), NodeHeard("n1", 15), NodeHeard("n3", 15))
    [failure] = _teardowns(_feed(verdict, Tick(15.1)))
    assert failure.node == "n2"
    _feed(verdict, _exit("n1", 16, -15), TeardownDone(16.5))
    assert not verdict.feed(Tick(16.6)).stop_reading  # n3 may still say something
    assert verdict.feed(_exit("n3", 16.7, -15)).stop_reading  # no drain: n2 will not answer
    assert verdict.outcome(-15, stopped_by_us=True).failure == failure


def test_by_default_a_node_is_torn_down_at_its_fifth_missed_heartbeat():
    # The agent beats every HEARTBEAT_S seconds: four missed beats are a busy node, not a
    # lost one; the fifth is.
    verdict = JobVerdict(HOSTS, WatchSettings(), head_launcher=False)
    _feed(verdict, *_all_heard(0))
    four, five = 4 * HEARTBEAT_S + 0.4, 5 * HEARTBEAT_S + 0.4
    others = [NodeHeard(node, at) for at in (four, five) for node in ("n1", "n3")]
    assert _teardowns(_feed(verdict, *others[:2], Tick(four))) == []
    [failure] = _teardowns(_feed(verdict, *others[2:], Tick(five)))
    assert (failure.node, failure.kind) == ("n2", FailureKind.SILENT)
    assert failure.reason == "stopped answering (no heartbeat for 10 s)"


def test_a_node_that_never_started_fails_after_the_start_timeout():
    verdict = _verdict()
    _feed(verdict, NodeHeard("n1", 0), NodeHeard("n2", 0))
    for at in range(5, 121, 5):  # n1 and n2 keep talking
        assert _teardowns(_feed(verdict, NodeHeard("n1", at), NodeHeard("n2", at))) == []
    [failure] = _teardowns(_feed(verdict, Tick(120.5)))
    assert (failure.node, failure.reason) == ("n3", "never started")
    assert failure.kind == FailureKind.SILENT


@pytest.mark.parametrize(
    ("ssh_code", "exit_code", "reason"),
    [
        (255, 1, "lost its ssh connection (ssh exit 255)"),
        (127, 127, "the remote command failed with exit code 127"),
    ],
)
def test_a_node_whose_ssh_ended_before_it_reported_failed(ssh_code, exit_code, reason):
    verdict = _verdict()
    [failure] = _teardowns(_feed(verdict, *_all_heard(), SshEnded("n3", ssh_code, 2)))
    assert (failure.node, failure.exit_code, failure.reason) == ("n3", exit_code, reason)
    assert verdict.outcome(1, stopped_by_us=True).state == JobState.FAILED


def test_an_ssh_end_after_the_nodes_exit_is_no_failure():
    verdict = _verdict()
    decisions = _feed(verdict, *_all_heard(), _exit("n3", 1), SshEnded("n3", 255, 2))
    assert _teardowns(decisions) == []


def test_head_launcher_exits_first_before_any_node_was_heard_is_the_heads_failure():
    verdict = _verdict(head_launcher=True)
    decisions = _feed(verdict, OutputEnded(3), HeadExited(2, 3))
    [failure] = _teardowns(decisions)
    assert (failure.node, failure.kind, failure.exit_code) == ("", FailureKind.HEAD, 2)
    assert failure.reason == "the head launcher exited with code 2"
    assert decisions[-1].stop_reading


def test_head_launcher_exits_first_after_nodes_were_heard_names_a_missing_node():
    verdict = _verdict(head_launcher=True)
    decisions = _feed(verdict, *_all_heard(), _exit("n1", 2), OutputEnded(3), HeadExited(1, 3))
    [failure] = _teardowns(decisions)
    assert (failure.node, failure.reason) == (
        "n2", "ended without reporting an exit code (the fan-out: exited with code 1)")


def test_a_fan_out_killed_before_a_node_reported_says_the_signal():
    verdict = _verdict(head_launcher=True)
    decisions = _feed(verdict, *_all_heard(), _exit("n1", 0), OutputEnded(3), HeadExited(-9, 3))
    [failure] = _teardowns(decisions)
    assert failure.reason == "ended without reporting an exit code (the fan-out: killed by SIGKILL)"


def test_every_node_exited_zero_but_the_head_launcher_failed():
    verdict = _verdict(head_launcher=True)
    _feed(verdict, *_all_heard(), *(_exit(h, 5) for h in HOSTS), OutputEnded(6), HeadExited(2, 6))
    outcome = verdict.outcome(2, stopped_by_us=False)
    assert (outcome.state, outcome.exit_code) == (JobState.FAILED, 2)
    assert outcome.failure is not None and outcome.failure.kind == FailureKind.HEAD


@pytest.mark.parametrize(
    ("signals", "killed", "state", "code", "reason"),
    [
        # The first Ctrl-C is a stop (tests/outcome/test_stop_verdict.py); the second ends
        # the job at once.
        ((signal.SIGINT, signal.SIGINT), False, JobState.INTERRUPTED, 130,
         "interrupted by SIGINT"),
        ((signal.SIGTERM,), False, JobState.INTERRUPTED, 143, "interrupted by SIGTERM"),
        ((signal.SIGTERM,), True, JobState.KILLED, 143, "killed by `orch kill`"),
    ],
)  # fmt: skip
def test_ctrl_c_and_orch_kill(signals, killed, state, code, reason):
    verdict = _verdict()
    interrupts = [Interrupted(signum, killed, 4 + i) for i, signum in enumerate(signals)]
    [failure] = _teardowns(_feed(verdict, *_all_heard(), *interrupts))
    assert failure.reason == reason
    outcome = verdict.outcome(-15, stopped_by_us=True)
    assert (outcome.state, outcome.exit_code) == (state, code)


def test_an_interrupt_wins_over_a_pending_failure():
    verdict = _verdict()
    _feed(verdict, *_all_heard(), _exit("n1", 1, 3))
    [failure] = _teardowns(_feed(verdict, Interrupted(signal.SIGTERM, False, 1.2)))
    assert failure.kind == FailureKind.SIGNAL


def test_the_teardown_is_asked_for_once_and_reading_stops_after_the_drain():
    verdict = _verdict()
    decisions = _feed(
        verdict, *_all_heard(), SshEnded("n2", 255, 1), Tick(2), SshEnded("n1", 255, 2)
    )
    assert len(_teardowns(decisions)) == 1
    assert not verdict.feed(TeardownDone(10)).stop_reading
    assert not verdict.feed(Tick(40)).stop_reading
    assert verdict.feed(Tick(40.1)).stop_reading


def test_after_the_teardown_only_the_nodes_it_reached_are_waited_for():
    """Their agents' last words (the ends of the ranks the teardown killed) are read; a node
    the teardown could not reach is not waited for."""
    verdict = _verdict()
    assert len(_teardowns(_feed(verdict, *_all_heard(), _exit("n1", 3, 1), Tick(5)))) == 1
    assert not verdict.feed(TeardownDone(6)).stop_reading  # n2 and n3 answered the teardown
    assert not verdict.feed(_exit("n2", 8, 137)).stop_reading
    assert not verdict.feed(Tick(20)).stop_reading  # a loaded node's agent: seconds after
    assert verdict.feed(_exit("n3", 20.5, 137)).stop_reading
    verdict = _verdict()
    _feed(verdict, *_all_heard(), _exit("n1", 3, 1), Tick(5))
    assert not verdict.feed(TeardownDone(6, frozenset({"n3"}))).stop_reading
    assert verdict.feed(_exit("n2", 8, 137)).stop_reading  # n3 is not waited for


def test_after_every_node_exited_the_head_launcher_gets_its_wind_down_time():
    verdict = _verdict(head_launcher=True)
    _feed(verdict, *_all_heard(), *(_exit(h, 5) for h in HOSTS))
    assert not verdict.feed(Tick(5)).stop_reading
    assert not verdict.feed(Tick(65)).stop_reading
    assert verdict.feed(Tick(65.1)).stop_reading
    # orch stopped the head launcher itself after every node succeeded: not a failure.
    outcome = verdict.outcome(-15, stopped_by_us=True)
    assert (outcome.state, outcome.exit_code) == (JobState.SUCCEEDED, 0)


def test_events_of_nodes_outside_the_job_are_ignored():
    verdict = _verdict()
    decisions = _feed(verdict, NodeHeard("other", 0), _exit("other", 1, 9),
                      SshEnded("other", 255, 1), Tick(200))  # fmt: skip
    assert _teardowns(decisions) == []


def _hang_verdict(timeout: float | None) -> JobVerdict:
    settings = WatchSettings(heartbeat_timeout=15, hang_timeout=timeout, look_seconds=0)
    return JobVerdict(HOSTS, settings, head_launcher=False)


@pytest.mark.parametrize(("quiet_for", "hung"), [(29.0, False), (30.5, True)])
def test_a_job_whose_ranks_stop_writing_while_every_node_answers_hung(quiet_for, hung):
    verdict = _hang_verdict(30)
    _feed(verdict, *_all_heard(0), RankOutput(5))
    decisions = []
    for at in range(6, int(5 + quiet_for) + 1):  # heartbeats keep coming, no output
        decisions += _feed(verdict, *_all_heard(at))
    decisions += _feed(verdict, Tick(5 + quiet_for))
    failures = _teardowns(decisions)
    assert bool(failures) is hung
    if hung:
        [failure] = failures
        assert failure.kind == FailureKind.HANG and failure.exit_code == HANG_EXIT_CODE == 124
        assert failure.reason == "hang: no rank wrote anything for 30 s"
        outcome = verdict.outcome(-15, stopped_by_us=True)
        assert (outcome.state, outcome.exit_code) == (JobState.FAILED, 124)


def test_output_keeps_a_job_from_counting_as_hung_and_no_timeout_means_never():
    talking = _hang_verdict(30)
    for at in range(0, 200, 10):
        assert _teardowns(_feed(talking, *_all_heard(at), RankOutput(at))) == []
    silent_but_unchecked = _hang_verdict(None)
    for at in range(0, 200, 10):
        assert _teardowns(_feed(silent_but_unchecked, *_all_heard(at))) == []


def test_a_job_that_never_wrote_anything_hangs_from_its_start():
    verdict = _hang_verdict(30)
    decisions = []
    for at in (0, 5, 10, 15, 20, 25, 30, 30.5):  # heartbeats only
        decisions += _feed(verdict, *_all_heard(at))
    [failure] = _teardowns(decisions)
    assert failure.kind == FailureKind.HANG


def test_a_job_whose_nodes_all_exited_is_quiet_not_hung():
    verdict = _hang_verdict(30)
    _feed(verdict, *_all_heard(0), RankOutput(1), *(_exit(h, 2) for h in HOSTS))
    assert _teardowns(_feed(verdict, Tick(40), Tick(61))) == []
    assert verdict.outcome(0, stopped_by_us=True).state == JobState.SUCCEEDED


def _stacks_with(outliers: tuple[Outlier, ...]) -> StacksResult:
    folded = FoldedStacks(blocks=(), majority=None, outliers=outliers, failed=())
    return StacksResult("j1", "2026-11-23T00:00:00Z", None, (), folded=folded)


def test_a_hang_names_the_rank_that_stands_apart_and_where():
    reason = "hang: no rank wrote anything for 31 s"
    hang = Failure("", reason, HANG_EXIT_CODE, kind=FailureKind.HANG)
    stuck = Outlier(rank=3, node="n2", frame=Frame("load_batch", "/work/train.py", 42))
    named = hang_culprit(hang, _stacks_with((stuck,)))
    assert (named.node, named.rank, named.exit_code) == ("n2", 3, 124)
    assert named.reason.endswith("; stands apart: rank 3 on n2 at /work/train.py:42 load_batch")
    two = hang_culprit(hang, _stacks_with((stuck, Outlier(4, "n3", None))))
    assert two.rank is None and two.reason.endswith("rank 3 on n2 at /work/train.py:42 "
                                                    "load_batch, rank 4 on n3")  # fmt: skip
    assert hang_culprit(hang, _stacks_with(())).reason.endswith("no rank's stack stands apart")
    assert hang_culprit(hang, None).reason.endswith("the ranks' stacks could not be taken")


def test_the_heads_own_backlog_is_not_a_nodes_silence():
    # Every node beats every 2 s, but the head fell behind reading: at 40 s it has read
    # only what arrived up to 14 s. The beats of 14..40 s wait in its backlog, unread.
    verdict = _verdict()
    beats = [NodeHeard(h, at) for at in range(0, 15, 2) for h in HOSTS]
    decisions = _feed(verdict, *beats, Tick(40.0, read_up_to=14.0), Tick(60.0, read_up_to=20.0))
    assert _teardowns(decisions) == []
    # Caught up, with n2's beats ending at 14 s: n2 is silent, counted from what was read.
    decisions = _feed(verdict, NodeHeard("n1", 61), NodeHeard("n3", 61), Tick(62.0))
    [failure] = _teardowns(decisions)
    assert (failure.node, failure.kind) == ("n2", "silent")
    assert failure.reason == "stopped answering (no heartbeat for 48 s)"


def test_a_backlog_does_not_look_like_a_hang():
    verdict = JobVerdict(HOSTS, WatchSettings(hang_timeout=10, look_seconds=0),
                         head_launcher=False)  # fmt: skip
    decisions = _feed(verdict, *_all_heard(), RankOutput(1.0), Tick(30.0, read_up_to=8.0))
    assert _teardowns(decisions) == []
    [failure] = _teardowns(_feed(verdict, *_all_heard(30.0), Tick(30.5)))
    assert failure.kind == "hang"


def test_a_hang_says_whose_stacks_could_not_be_taken():
    hang = Failure("", "hang: no rank wrote anything for 31 s", HANG_EXIT_CODE,
                   kind=FailureKind.HANG)  # fmt: skip
    waiting = RankStacks(0, "n1", 11, threads=(ThreadStack("MainThread", 11, True, True, ()),))
    timed_out = RankStacks(1, "n1", 12, error="no stack within 5s of SIGUSR2", kind="timeout")
    nodes = (NodeReport("n1", (waiting, timed_out)),
             NodeReport("n2", error="n2: no answer within 15 s", kind="timeout"))  # fmt: skip
    result = analyse("j1", "2026-11-23T00:00:00Z", None, nodes)
    named = hang_culprit(hang, result)
    assert named.rank is None
    assert named.reason.endswith(
        "; no rank's stack stands apart; n2 did not answer (n2: no answer within 15 s); "
        "the stacks of rank(s) 1 could not be taken (no stack within 5s of SIGUSR2)"
    )
