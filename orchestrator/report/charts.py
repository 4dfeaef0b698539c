"""Progress per rank as SVG geometry, computed in Python: a line per rank (share of its
steps done, over the timeline's own time axis), or past FOLD_RANKS_ABOVE ranks a line per
node (its slowest rank) and a heatmap of every rank's step time against the median, one
row per node. Drawn by the template as plain SVG: no script, nothing to fetch, and the page
reads the same in any browser years later."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.report.model import ReportModel, Series
from orchestrator.report.timeline import LABEL_W, PLOT_W, WIDTH, Scale, Tick

CHART_H = 200  # the plot's height
TOP, BOTTOM = 24, 8  # room for the axis' labels above it
HEAT_ROW, HEAT_GAP, HEAT_CELL_MAX = 12, 2, 14
WORST_RATIO = 2.0  # a cell this much slower than the median is the darkest


@dataclass(frozen=True)
class Polyline:
    node: str
    rank: int | None  # None: a node's own line (its slowest rank), when folded
    points: str  # "x,y x,y ..."
    css: str
    title: str


@dataclass(frozen=True)
class HeatCell:
    x: float
    width: float
    rank: int
    fill: str
    title: str


@dataclass(frozen=True)
class HeatRow:
    y: float
    node: str
    cells: tuple[HeatCell, ...]


@dataclass(frozen=True)
class ProgressChart:
    width: float
    height: float
    ticks: tuple[Tick, ...]
    y_ticks: tuple[tuple[float, str], ...]  # (y, "50%")
    lines: tuple[Polyline, ...]
    heat: tuple[HeatRow, ...]  # only when folded
    heat_height: float
    plot_x: float = LABEL_W
    plot_w: float = PLOT_W
    top: float = TOP


def progress_chart(model: ReportModel) -> ProgressChart | None:
    """None without samples, or without times to draw them on."""
    if not model.series or model.start is None or model.end is None:
        return None
    start = min([model.start, *(s.points[0][0] for s in model.series)])
    end = max([model.end, *(s.points[-1][0] for s in model.series)])
    scale = Scale(start, end)
    slowest = model.slowest.rank if model.slowest and model.slowest.stands_apart else None
    drawn = _per_node(model.series) if model.folded else model.series
    most = most_steps(model.series)
    lines = tuple(_polyline(series, scale, series.total or most, slowest, model.folded)
                  for series in drawn)  # fmt: skip
    heat = _heat(model.series) if model.folded else ()
    heat_height = (heat[-1].y + HEAT_ROW + HEAT_GAP) if heat else 0.0
    y_ticks = tuple((_y(share), f"{share:.0%}") for share in (0.0, 0.5, 1.0))
    return ProgressChart(WIDTH, TOP + CHART_H + BOTTOM, scale.ticks(), y_ticks, lines, heat,
                         heat_height)  # fmt: skip


def _y(share: float) -> float:
    return round(TOP + CHART_H * (1.0 - min(max(share, 0.0), 1.0)), 1)


def most_steps(every: Sequence[Series]) -> int:
    """What 100% is for a series without a bar's total: the most steps any such rank made."""
    return max((n for s in every if not s.total for _t, n in s.points), default=1) or 1


def _polyline(series: Series, scale: Scale, full: int, slowest: int | None,
              folded: bool) -> Polyline:  # fmt: skip
    points = " ".join(f"{scale.x(t)},{_y(n / full)}" for t, n in series.points)
    pace = f", {series.step_s:.3g} s per step" if series.step_s else ""
    done = series.points[-1][1]
    of = f"/{series.total}" if series.total else ""
    if folded:
        title = f"{series.node}: its slowest rank, {series.rank}: {done}{of} steps{pace}"
        return Polyline(series.node, None, points, "node-line", title)
    css = "rank-line slowest" if series.rank == slowest else "rank-line"
    title = f"rank {series.rank} on {series.node}: {done}{of} steps{pace}"
    return Polyline(series.node, series.rank, points, css, title)


def _per_node(series: Sequence[Series]) -> tuple[Series, ...]:
    """Each node's slowest rank (the longest step time; without one, the least done)."""
    by_node: dict[str, list[Series]] = {}
    for one in series:
        by_node.setdefault(one.node, []).append(one)
    return tuple(
        max(group, key=lambda s: (s.step_s or 0.0, -s.points[-1][1])) for group in by_node.values()
    )


def _heat(series: Sequence[Series]) -> tuple[HeatRow, ...]:
    """One row per node, one cell per rank, coloured by its step time over the median."""
    times = [s.step_s for s in series if s.step_s]
    median = statistics.median(times) if times else None
    by_node: dict[str, list[Series]] = {}
    for one in series:
        by_node.setdefault(one.node, []).append(one)
    rows = []
    for index, (node, group) in enumerate(by_node.items()):
        width = min(HEAT_CELL_MAX, PLOT_W / max(len(group), 1))
        cells = tuple(
            HeatCell(round(LABEL_W + i * width, 1), round(max(width - 1, 1), 1), one.rank,
                     heat_fill(one.step_s, median), _heat_title(one, median))
            for i, one in enumerate(sorted(group, key=lambda s: s.rank))
        )  # fmt: skip
        rows.append(HeatRow(float(index * (HEAT_ROW + HEAT_GAP)), node, cells))
    return tuple(rows)


def _heat_title(series: Series, median: float | None) -> str:
    if series.step_s is None or not median:
        return f"rank {series.rank} on {series.node}: step time unknown"
    return (f"rank {series.rank} on {series.node}: {series.step_s:.3g} s per step, "
            f"{series.step_s / median:.2f}x the median")  # fmt: skip


def heat_fill(step_s: float | None, median: float | None) -> str:
    """Grey: unknown; green at the median or faster, through yellow, to red at WORST_RATIO
    times the median and beyond."""
    if step_s is None or not median:
        return "#c8ccd1"
    share = min(max((step_s / median - 1.0) / (WORST_RATIO - 1.0), 0.0), 1.0)
    green, yellow, red = (44, 160, 44), (230, 194, 0), (214, 39, 40)
    low, high, part = (green, yellow, share * 2) if share < 0.5 else (yellow, red, share * 2 - 1)
    r, g, b = (round(a + (z - a) * part) for a, z in zip(low, high, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"
