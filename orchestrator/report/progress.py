"""Progress per rank, on values: the samples the job kept (logs/progress.py) turned into one
series per rank, each rank's step time, and the slowest rank in words."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence

from orchestrator.logs.progress import Sample
from orchestrator.report.model import Series, Slowest

MAX_POINTS = 240  # per series drawn: the chart is 880 px wide


def rank_series(samples: Iterable[Sample]) -> tuple[Series, ...]:
    """One series per rank that left samples, by rank."""
    by_rank: dict[int, list[Sample]] = {}
    for sample in samples:
        by_rank.setdefault(sample.rank, []).append(sample)
    return tuple(_series(by_rank[rank]) for rank in sorted(by_rank))


def _series(samples: Sequence[Sample]) -> Series:
    ordered = sorted(samples, key=lambda s: s.t)
    points = tuple((s.t, s.n) for s in ordered)
    totals = [s.total for s in ordered if s.total]
    return Series(
        node=ordered[-1].node, rank=ordered[-1].rank, points=thin(points),
        total=totals[-1] if totals else None, step_s=step_time(ordered),
    )  # fmt: skip


def thin(points: tuple[tuple[float, int], ...]) -> tuple[tuple[float, int], ...]:
    """At most MAX_POINTS, evenly chosen, the first and the last kept."""
    if len(points) <= MAX_POINTS:
        return points
    step = (len(points) - 1) / (MAX_POINTS - 1)
    return tuple(points[round(i * step)] for i in range(MAX_POINTS))


def step_time(samples: Sequence[Sample]) -> float | None:
    """Seconds per step: the time over the steps made between consecutive samples where the
    count moved on (a bar that starts again, a new epoch, is not counted backwards); from
    the bars' own rates when the samples never moved on."""
    seconds = steps = 0.0
    for before, after in itertools.pairwise(samples):
        moved = after.n - before.n
        if moved > 0:
            seconds += after.t - before.t
            steps += moved
    if steps > 0 and seconds > 0:
        return seconds / steps
    rates = [s.rate for s in samples if s.rate]
    return 1.0 / statistics.median(rates) if rates else None


def slowest_rank(series: Sequence[Series]) -> Slowest | None:
    """The rank with the longest step time, against the median of all ranks; None with
    fewer than two ranks whose step time is known."""
    timed = [s for s in series if s.step_s is not None]
    if len(timed) < 2:
        return None
    median = statistics.median(s.step_s for s in timed if s.step_s is not None)
    worst = max(timed, key=lambda s: (s.step_s or 0.0, -s.rank))
    return Slowest(rank=worst.rank, node=worst.node, step_s=worst.step_s or 0.0, median_s=median)
