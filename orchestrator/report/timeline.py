"""The timeline's geometry: one row per node, and under it one per rank (or, past
FOLD_RANKS_ABOVE ranks, one strip of small cells per node), each bar from its start to its
end. Computed here, on values, so that the template only places what it is given."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.report.model import NodeRow, ReportModel, how
from orchestrator.run.rank_ends import Role
from orchestrator.run.records import RankRecord

LABEL_W = 170  # the names' column
PLOT_W = 880
NODE_H, RANK_H, GAP = 20, 14, 4
AXIS_H = 24
CELL_MAX = 10  # a folded rank's cell, at most this wide
TICKS = 6
RIGHT_PAD = 30  # room for the last tick's label
MARKER_H = 16  # room under the rows for the first failure's label


@dataclass(frozen=True)
class Cell:
    x: float
    width: float
    rank: int
    role: str
    title: str


@dataclass(frozen=True)
class Row:
    y: float
    height: float
    label: str
    node: str
    rank: int | None  # None: the node's own row (or its folded strip)
    css: str  # node, rank role-<role>, strip
    title: str
    bar: tuple[float, float] | None  # x and width; None when its times are unknown
    at_fault: bool
    cells: tuple[Cell, ...] = ()


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Timeline:
    width: float
    height: float
    rows: tuple[Row, ...]
    ticks: tuple[Tick, ...]
    marker: tuple[float, str] | None  # x of the first failure, and its label
    plot_x: float = LABEL_W
    plot_w: float = PLOT_W


class _Scale:
    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.span = max(end - start, 1e-6)

    def x(self, t: float) -> float:
        return round(LABEL_W + PLOT_W * (t - self.start) / self.span, 1)

    def bar(self, start: float | None, end: float | None) -> tuple[float, float] | None:
        if start is None or end is None:
            return None
        left = self.x(start)
        return left, max(round(self.x(end) - left, 1), 2.0)  # an instant stays visible


def timeline(model: ReportModel) -> Timeline | None:
    """None when the record holds no times to draw."""
    if model.start is None or model.end is None:
        return None
    scale = _Scale(model.start, model.end)
    rows = list(_rows(model, scale))
    height = (rows[-1].y + rows[-1].height if rows else AXIS_H) + GAP
    marker = None
    if model.cause is not None and model.cause.at is not None:
        marker = (scale.x(model.cause.at), "first failure")
        height += MARKER_H
    return Timeline(LABEL_W + PLOT_W + RIGHT_PAD, height, tuple(rows), _ticks(scale), marker)


def _rows(model: ReportModel, scale: _Scale) -> Iterator[Row]:
    y = float(AXIS_H)
    for node in model.nodes:
        yield _node_row(node, scale, y)
        y += NODE_H + GAP
        if model.folded:
            if node.ranks:
                yield _strip(node, y)
                y += RANK_H + GAP
            continue
        for rank in node.ranks:
            yield _rank_row(rank, scale, y, node.is_cause)
            y += RANK_H + GAP


def _node_row(node: NodeRow, scale: _Scale, y: float) -> Row:
    code = "-" if node.exit_code is None else node.exit_code
    title = f"{node.node}: {len(node.ranks)} ranks, exit {code}"
    bar = scale.bar(node.start, node.end)
    return Row(y, NODE_H, node.node, node.node, None, "node", title, bar, node.is_cause)


def _rank_row(rank: RankRecord, scale: _Scale, y: float, node_at_fault: bool) -> Row:
    local = f" (local {rank.local_rank})" if rank.local_rank is not None else ""
    title = f"rank {rank.rank} on {rank.node}: {how(rank)}, {rank.role}"
    return Row(
        y, RANK_H, f"rank {rank.rank}{local}", rank.node, rank.rank, f"rank role-{rank.role}",
        title, scale.bar(rank.start, rank.end), node_at_fault and rank.role == Role.CAUSE,
    )  # fmt: skip


def _strip(node: NodeRow, y: float) -> Row:
    """A node's ranks folded: one small cell each, coloured by how it ended."""
    width = min(CELL_MAX, PLOT_W / max(len(node.ranks), 1))
    cells = tuple(
        Cell(round(LABEL_W + i * width, 1), round(max(width - 1, 1), 1), rank.rank, rank.role,
             f"rank {rank.rank} on {rank.node}: {how(rank)}, {rank.role}")
        for i, rank in enumerate(node.ranks)
    )  # fmt: skip
    roles = sorted({rank.role for rank in node.ranks})
    counts = ", ".join(f"{sum(r.role == role for r in node.ranks)} {role}" for role in roles)
    label = f"{len(node.ranks)} ranks"
    return Row(y, RANK_H, label, node.node, None, "strip", counts, None, False, cells)


def _ticks(scale: _Scale) -> tuple[Tick, ...]:
    return tuple(
        Tick(scale.x(scale.start + scale.span * i / (TICKS - 1)),
             f"+{_short(scale.span * i / (TICKS - 1))}")
        for i in range(TICKS)
    )  # fmt: skip


def _short(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"
