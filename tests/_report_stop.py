"""A job stopped by Ctrl-C, for the page's tests: the failed job of _report_job.py turned
into one whose ranks were sent SIGTERM 8 s in with a 5 s grace; most saved and exited by
themselves, one failed its save, one had no handler, one was still saving when the grace ran
out and was killed, one never reported (its node lost)."""

from __future__ import annotations

from dataclasses import replace

from _report_job import T0, failed_job

from orchestrator.outcome.states import JobState, StopCause
from orchestrator.outcome.stop import RankStop, RankStopEnd, StopEnding, StopSummary
from orchestrator.records.moments import Moment, MomentKind, append_moments
from orchestrator.records.rundir import RunDir

ASKED, GRACE = T0 + 8.0, 5.0
TORN_DOWN = ASKED + GRACE
FAILED_RANK, NO_HANDLER, KILLED, UNKNOWN = 1, 3, 5, 6  # the rest exit 0 by themselves
SENTENCE = "stopped by Ctrl-C: 5 of 8 ranks exited by themselves within 4 s"


def _end(rank: int) -> tuple[RankStopEnd, float | None, int | None]:
    if rank == KILLED:
        return RankStopEnd.KILLED, TORN_DOWN + 0.2, 137
    if rank == UNKNOWN:
        return RankStopEnd.UNKNOWN, None, None
    if rank == NO_HANDLER:
        return RankStopEnd.STOP_SIGNAL, ASKED + 0.3, 143
    if rank == FAILED_RANK:
        return RankStopEnd.FAILED, ASKED + 2.0, 1
    return RankStopEnd.EXITED, ASKED + 1.0 + 0.4 * (rank % 8), 0


def stop_summary(nodes: int = 2, per_node: int = 4) -> StopSummary:
    ranks = []
    for rank in range(nodes * per_node):
        end, ended_at, code = _end(rank % 8)
        ranks.append(RankStop(rank, f"n{rank // per_node + 1}", ASKED + 0.1 + 0.01 * (rank % 8),
                              ended_at, code, end))  # fmt: skip
    return StopSummary(StopCause.CTRL_C, ASKED, "SIGTERM", GRACE, StopEnding.GRACE_OVER,
                       TORN_DOWN, tuple(ranks))  # fmt: skip


def stopped_job(runs, nodes: int = 2, per_node: int = 4) -> RunDir:
    run = failed_job(runs, nodes, per_node, stacks=False, kept=False)
    stop = stop_summary(nodes, per_node)
    by_rank = {part.rank: part for part in stop.ranks}
    ranks = tuple(
        replace(rank, end=by_rank[rank.rank].ended_at or TORN_DOWN + 0.5,
                exit_code=by_rank[rank.rank].exit_code, signal=None,
                role="succeeded" if by_rank[rank.rank].exit_code == 0 else "failed")
        for rank in run.load().ranks
    )  # fmt: skip
    run.save(replace(run.load(), state=JobState.INTERRUPTED, first_failure=None, exit_code=130,
                     ranks=ranks, stop=stop))  # fmt: skip
    moments = [Moment(T0 + 0.4, MomentKind.START)]
    moments += [Moment(T0 + 1.5, MomentKind.FIRST_OUTPUT, r.node, r.rank) for r in ranks]
    moments += [Moment(ASKED + 0.1, MomentKind.STOP, detail="ctrl-c"),
                Moment(TORN_DOWN, MomentKind.TEARDOWN_START),
                Moment(TORN_DOWN + 0.6, MomentKind.TEARDOWN_END)]  # fmt: skip
    append_moments(run, moments)
    return run
