"""What a stop's summary says of each rank: exited by itself (and how long the ranks took),
ended by the stop signal it had no handler for, killed when the grace ran out, never heard
of; and what job.json keeps of it."""

from __future__ import annotations

import signal

from orchestrator.outcome.rank_ends import RankEnd
from orchestrator.outcome.states import StopCause
from orchestrator.outcome.stop import (
    GraceInForce,
    RankStopEnd,
    StopEnding,
    StopSummary,
    grace_in_force,
    stop_summary,
)
from orchestrator.specs.stop import StopSettings

ASKED = 1000.0


def _end(rank: int, node: str, after: float, code: int = 0) -> RankEnd:
    return RankEnd(node=node, rank=rank, end=ASKED + after, code=code)


def _summary(ends, *, ending=StopEnding.RANKS_EXITED, torn_down_after=None, world=6,
             unreached=None, cause=StopCause.CTRL_C) -> StopSummary:  # fmt: skip
    signalled = {e.rank: (e.node, ASKED + 0.5) for e in ends}
    torn = None if torn_down_after is None else ASKED + torn_down_after
    return stop_summary(cause, ASKED, StopSettings(), ending=ending, torn_down_at=torn,
                        world_size=world, ends=ends, signalled=signalled,
                        unreached=unreached or {})  # fmt: skip


def test_every_rank_that_saved_and_exited_is_counted_with_the_time_they_took() -> None:
    ends = [_end(r, f"n{r // 2}", 30 + r * 2) for r in range(6)]
    summary = _summary(ends)
    assert summary.lines() == ["stopped by Ctrl-C: 6 of 6 ranks exited by themselves within 40 s"]
    assert {r.end for r in summary.ranks} == {RankStopEnd.EXITED}
    assert summary.ranks[0].signalled_at == ASKED + 0.5


def test_ranks_still_running_at_the_graces_end_are_named_as_killed() -> None:
    ends = [_end(0, "n0", 20), _end(1, "n0", 25), _end(2, "n1", 90, 3),
            _end(3, "n1", 30, -signal.SIGTERM), _end(4, "n2", 120.4, -signal.SIGTERM),
            _end(5, "n2", 121, -signal.SIGKILL)]  # fmt: skip
    summary = _summary(ends, ending=StopEnding.GRACE_OVER, torn_down_after=120.0)
    assert [r.end for r in summary.ranks] == [
        RankStopEnd.EXITED, RankStopEnd.EXITED, RankStopEnd.FAILED, RankStopEnd.STOP_SIGNAL,
        RankStopEnd.KILLED, RankStopEnd.KILLED,
    ]  # fmt: skip
    assert summary.lines() == [
        "stopped by Ctrl-C: 3 of 6 ranks exited by themselves within 90 s",
        "  rank 2 on n1 exited with code 3",
        "  rank 3 on n1 was ended by SIGTERM itself: the script had no handler for it then",
        "  killed at the end of the 120 s grace: ranks 4, 5 on n2",
    ]


def test_a_stop_cut_short_and_ranks_never_heard_of() -> None:
    summary = _summary([_end(0, "n0", 5)], ending=StopEnding.CUT_SHORT, torn_down_after=8,
                       world=3, unreached={"n1": "n1: unreachable"},
                       cause=StopCause.ORCH_STOP)  # fmt: skip
    assert summary.lines() == [
        "stopped by `orch stop`: 1 of 3 ranks exited by themselves within 5 s "
        "(the stop was cut short)",
        "  never reported an end: ranks 1, 2",
        "  n1: the stop signal was not sent: n1: unreachable",
    ]


def test_job_json_keeps_the_cause_the_time_and_each_ranks_part() -> None:
    summary = _summary([_end(0, "n0", 5), _end(1, "n0", 130, -9)], world=2,
                       ending=StopEnding.GRACE_OVER, torn_down_after=120)  # fmt: skip
    doc = summary.to_json()
    assert (doc["cause"], doc["asked_at"], doc["signal"], doc["grace"]) == (
        "ctrl-c", ASKED, "SIGTERM", 120.0)
    assert doc["ranks"][1] == {"rank": 1, "node": "n0", "signalled_at": ASKED + 0.5,
                               "ended_at": ASKED + 130, "exit_code": 137, "end": "killed"}
    assert StopSummary.from_json(doc) == summary
    assert StopSummary.from_json(None) is None


def test_a_grace_slurm_cut_short_says_how_long_it_was_and_why() -> None:
    grace = grace_in_force(120.0, ASKED, ASKED + 15.0, 30.0)
    cut = grace.cut
    assert cut == "cut from 120 s: Slurm ends the job 30 s after its SIGTERM, its KillWait"
    assert grace.seconds == 15.0
    assert grace_in_force(120.0, ASKED, ASKED + 200.0, 30.0) == GraceInForce(120.0)
    assert grace_in_force(120.0, ASKED, None, None) == GraceInForce(120.0)
    assert grace.ran_out(StopCause.SLURM_SIGNAL) == (
        f"stopped by Slurm (its warning, or a preemption): the 15 s grace ran out ({cut})")
    assert GraceInForce(2.5).ran_out(StopCause.CTRL_C) == (
        "stopped by Ctrl-C: the 2.5 s grace ran out")  # a grace as given, not rounded
    ends = [_end(0, "n0", 15.2, -signal.SIGKILL), _end(1, "n1", 15.3, -signal.SIGKILL)]
    summary = stop_summary(StopCause.SLURM_SIGNAL, ASKED, StopSettings(grace=15.0),
                           ending=StopEnding.GRACE_OVER, torn_down_at=ASKED + 15.0, world_size=2,
                           ends=ends, signalled={}, unreached={}, cut=cut)  # fmt: skip
    assert summary.lines()[-1] == (f"  killed at the end of the 15 s grace ({cut}): rank 0 on n0; "
                                 "rank 1 on n1")
    assert StopSummary.from_json(summary.to_json()) == summary
