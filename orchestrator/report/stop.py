"""A stop (the first Ctrl-C, `orch stop`, the time limit, Slurm) as the job's page draws it:
across every lane, the moment it was asked and the grace the ranks had to save (shaded, to
its end, or to the job's end when the ranks were done sooner); on each rank's row when its
signal was sent and how it ended (by itself, killed at the grace's end, ended by the signal
itself, never reported), each with a tooltip; past FOLD_RANKS_ABOVE ranks, the same on each
node's row, the ranks that ended alike in one mark. The summary's sentence is the record's
own (`StopSummary.lines()`), as the head printed it. Pure: a summary and an x scale in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.outcome.stop import RankStop, RankStopEnd, StopSummary
from orchestrator.report.checkpoints import CHAR_PX
from orchestrator.report.clock import since
from orchestrator.stacks.fold import rank_ranges

SIGNALLED = "signalled"  # the mark of the moment a rank was sent the stop signal
LINES_SHOWN = 12  # the summary's lines on the page; a stop of 1000 failed ranks says how many more


@dataclass(frozen=True)
class StopMark:
    """A point on a rank's (or a folded node's) row: its signal sent, or its end."""

    x: float
    kind: str  # signalled, unreached, or a RankStopEnd (exited, failed, stop-signal, killed,
    # unknown)
    title: str
    count: int = 1  # folded: how many ranks it stands for


@dataclass(frozen=True)
class StopBand:
    """The stop across every lane: when it was asked, and the grace while the ranks save."""

    asked_x: float
    grace_x: float
    grace_w: float  # to the grace's end, or the axis's end when the job ended before it
    grace_end_x: float | None  # None: the grace would have ended after the job did
    label: str  # "stop asked (Ctrl-C)", drawn right of the moment on the stop's own row
    asked_title: str
    grace_title: str
    label_x: float = 0.0  # where the label starts: moved left where the axis ends first
    grace_label: str | None = None  # "grace ends +13.0s", left of its line when there is room


def band(stop: StopSummary, x: Callable[[float], float], start: float | None,
         end: float) -> StopBand:  # fmt: skip
    grace_end = stop.asked_at + stop.grace
    right = min(grace_end, end)
    asked = x(stop.asked_at)
    signal = f"{stop.signal} to every rank, {stop.grace:g} s to save"
    grace = (f"the grace: {stop.grace:g} s from {since(start, stop.asked_at)} to "
             f"{since(start, grace_end)}, while the ranks may save")  # fmt: skip
    if grace_end > end:
        grace += " (the job had ended before it ran out)"
    if stop.torn_down_at is not None:
        grace += f"; torn down {since(start, stop.torn_down_at)}"
    label = f"stop asked ({stop.cause.said})"
    end_x = x(grace_end) if grace_end <= end else None
    label_x = min(asked + 6, x(end) - CHAR_PX * len(label))
    grace_label = f"grace ends {since(start, grace_end)}"
    # The grace's end is named only where it does not run into the ask's label.
    after = label_x + CHAR_PX * len(label)
    room = end_x is not None and end_x - CHAR_PX * len(grace_label) - 6 > after
    return StopBand(asked, asked, max(round(x(right) - asked, 1), 1.0), end_x, label,
                    f"stop asked by {stop.cause.said} {since(start, stop.asked_at)}: {signal}",
                    grace, round(label_x, 1), grace_label if room else None)  # fmt: skip


def end_words(stop: StopSummary, rank: RankStop) -> str:
    """How the rank ended after the stop, in words."""
    if rank.end == RankStopEnd.EXITED:
        return "exited by itself (exit code 0)"
    if rank.end == RankStopEnd.FAILED:
        return f"exited by itself with code {rank.exit_code}"
    if rank.end == RankStopEnd.STOP_SIGNAL:
        return f"ended by {stop.signal} itself (the script had no handler for it)"
    if rank.end == RankStopEnd.KILLED:
        return f"killed {stop.killed_when}"
    return "never reported an end (its node was lost)"


def rank_title(stop: StopSummary, rank: RankStop, start: float | None) -> str:
    """The tooltip of a rank's part in the stop."""
    where = f"rank {rank.rank}" + (f" on {rank.node}" if rank.node else "")
    sent = (f"{stop.signal} sent {since(start, rank.signalled_at)}"
            if rank.signalled_at is not None else f"{stop.signal} not sent")  # fmt: skip
    ended = end_words(stop, rank)
    if rank.ended_at is not None:
        ended += f" {since(start, rank.ended_at)}"
        if rank.signalled_at is not None:
            ended += f", {max(0.0, rank.ended_at - rank.signalled_at):.1f} s after its signal"
    return f"{where}: {sent}; {ended}"


def _end_at(stop: StopSummary, rank: RankStop, end: float) -> float:
    """Where a rank's end is drawn: when it ended; a rank never heard of, at the teardown."""
    if rank.ended_at is not None:
        return rank.ended_at
    return min(stop.torn_down_at or end, end)


def rank_marks(stop: StopSummary, rank: RankStop, x: Callable[[float], float],
               start: float | None, end: float) -> tuple[StopMark, ...]:  # fmt: skip
    """A rank's row: its signal sent, and its end, both saying the whole of its part."""
    title = rank_title(stop, rank, start)
    marks = ([StopMark(x(rank.signalled_at), SIGNALLED, title)]
             if rank.signalled_at is not None else [])  # fmt: skip
    return (*marks, StopMark(x(_end_at(stop, rank, end)), str(rank.end), title))


def node_marks(stop: StopSummary, node: str, ranks: Sequence[RankStop],
               x: Callable[[float], float], start: float | None,
               end: float) -> tuple[StopMark, ...]:  # fmt: skip
    """A folded node's row: when its ranks were sent the signal, then one mark per way its
    ranks ended, at the last of them: eight marks of 1000 ranks' ends say nothing."""
    if not ranks and node not in stop.unreached:
        return ()
    marks: list[StopMark] = []
    sent = sorted(r.signalled_at for r in ranks if r.signalled_at is not None)
    if sent:
        spread = (since(start, sent[0]) if sent[0] == sent[-1]
                  else f"{since(start, sent[0])} to {since(start, sent[-1])}")  # fmt: skip
        marks.append(StopMark(x(sent[0]), SIGNALLED,
                              f"{node}: {stop.signal} sent to {len(sent)} of {len(ranks)} "
                              f"ranks {spread}", len(sent)))  # fmt: skip
    marks += unreached_mark(stop, node, x)
    for kind in RankStopEnd:
        alike = [r for r in ranks if r.end == kind]
        if alike:
            marks.append(_alike(stop, node, kind, alike, x, start, end, len(ranks)))
    return tuple(marks)


def unreached_mark(stop: StopSummary, node: str,
                   x: Callable[[float], float]) -> tuple[StopMark, ...]:  # fmt: skip
    """A node the stop signal could not be sent to: a mark where it was asked, saying why."""
    if node not in stop.unreached:
        return ()
    return (StopMark(x(stop.asked_at), "unreached",
                     f"{node}: the stop signal was not sent: {stop.unreached[node]}"),)


def _group_words(stop: StopSummary, kind: RankStopEnd) -> str:
    """How several ranks of a node ended alike, in words."""
    if kind == RankStopEnd.EXITED:
        return "exited by themselves (exit code 0)"
    if kind == RankStopEnd.FAILED:
        return "exited by themselves with another code than 0"
    if kind == RankStopEnd.STOP_SIGNAL:
        return f"were ended by {stop.signal} itself (no handler for it)"
    if kind == RankStopEnd.KILLED:
        return f"were killed {stop.killed_when}"
    return "never reported an end"


def _alike(stop: StopSummary, node: str, kind: RankStopEnd, alike: Sequence[RankStop],
           x: Callable[[float], float], start: float | None, end: float,
           of: int) -> StopMark:  # fmt: skip
    last = max(_end_at(stop, r, end) for r in alike)
    if len(alike) == 1:  # one rank: its own tooltip, as on an open row
        return StopMark(x(last), str(kind), rank_title(stop, alike[0], start))
    when = f", the last {since(start, last)}" if kind != RankStopEnd.UNKNOWN else ""
    ranks = rank_ranges(r.rank for r in alike)
    return StopMark(x(last), str(kind),
                    f"{node}: {len(alike)} of {of} ranks {_group_words(stop, kind)}{when}: "
                    f"ranks {ranks}", len(alike))  # fmt: skip


@dataclass(frozen=True)
class StopLines:
    """The summary's lines as the head printed them: its sentence, then the ranks that did
    otherwise (at most LINES_SHOWN, then how many more)."""

    sentence: str
    details: tuple[str, ...]
    more: int

    @classmethod
    def of(cls, stop: StopSummary) -> StopLines:
        first, *rest = stop.lines()
        shown = tuple(line.strip() for line in rest[:LINES_SHOWN])
        return cls(first, shown, max(0, len(rest) - LINES_SHOWN))


def settings_words(stop: StopSummary, start: float | None) -> str:
    """The header's facts of the stop: `SIGTERM to every rank +10.0s, 60 s grace (to
    +70.0s); torn down +70.1s`."""
    said = (f"{stop.signal} to every rank {since(start, stop.asked_at)}, {stop.grace:g} s "
            f"grace (to {since(start, stop.asked_at + stop.grace)})")  # fmt: skip
    if stop.torn_down_at is not None:
        said += f"; torn down {since(start, stop.torn_down_at)}"
    return said
