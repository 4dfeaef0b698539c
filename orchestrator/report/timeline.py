"""The timeline's geometry: one lane per node, its own row (start to end, first and last
output, last heartbeat) and under it one row per rank (or, past FOLD_RANKS_ABOVE ranks, one
strip of small cells per node), on one time axis from the pre-flight to the end; lines
across every lane where the first failure, the hang detection, the teardown, an interrupt
and each restart's attempt happened; with --checkpoint-dir, a lane of the job's checkpoints
above the nodes' (report/checkpoints.py); after a stop, the moment it was asked and its
grace across every lane, and on each rank's row its signal and its end (report/stop.py).
Computed here, on values, so that the template only places what it is given (each lane is
an SVG of its own, inside a <details> that opens it to its ranks: no script)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.outcome.rank_ends import Role
from orchestrator.records.job import RankRecord
from orchestrator.records.moments import MomentKind
from orchestrator.report.checkpoints import Mark as CheckpointMark
from orchestrator.report.checkpoints import lane_marks
from orchestrator.report.clock import since
from orchestrator.report.model import OPEN_NODES_UP_TO, NodeRow, ReportModel, how
from orchestrator.report.stop import (
    StopBand,
    StopMark,
    band,
    end_words,
    node_marks,
    rank_marks,
    unreached_mark,
)

LABEL_W = 170  # the names' column
PLOT_W = 880
NODE_H, RANK_H, GAP = 20, 14, 4
AXIS_H = 24
CELL_MAX = 10  # a folded rank's cell, at most this wide
TICKS = 6
RIGHT_PAD = 30  # room for the last tick's label
WIDTH = LABEL_W + PLOT_W + RIGHT_PAD

# Job-wide moments drawn across every lane, and their labels.
LINE_KINDS: dict[str, str] = {
    MomentKind.HANG: "hang detected",
    MomentKind.QUIET: "quiet",
    MomentKind.PROFILE: "profiled",
    MomentKind.INTERRUPT: "interrupted",
    MomentKind.STOP: "stop: ranks signalled",
    MomentKind.TEARDOWN_START: "teardown",
    MomentKind.TEARDOWN_END: "teardown done",
    MomentKind.ATTEMPT: "restart",
}
FIRST_FAILURE = "first-failure"


def _past(label: str, detail: str) -> str:
    """The moment's words after the word its label already says (the live view's "profile:
    no rank stands apart" after "profiled +40s")."""
    first, space, rest = detail.partition(" ")
    word = first.rstrip(":,")
    return rest if space and word and label.startswith(word) else detail


@dataclass(frozen=True)
class Cell:
    x: float
    width: float
    rank: int
    role: str
    title: str
    stop_end: str | None = None  # how the rank ended after a stop (RankStopEnd)


@dataclass(frozen=True)
class Mark:
    """A point on a row: its first or last output, its last heartbeat."""

    x: float
    kind: str  # first-output, last-output, last-heartbeat
    title: str


@dataclass(frozen=True)
class Row:
    y: float  # within its lane's part (the node's own row, or its ranks)
    height: float
    label: str
    node: str
    rank: int | None  # None: the node's own row (or its folded strip)
    css: str  # node, rank role-<role>, strip
    title: str
    bar: tuple[float, float] | None  # x and width; None when its times are unknown
    at_fault: bool
    cells: tuple[Cell, ...] = ()
    marks: tuple[Mark, ...] = ()
    stop: tuple[StopMark, ...] = ()  # its signal and end after a stop (a folded node's: its ranks')


@dataclass(frozen=True)
class Lane:
    """One node: its own row (the <summary>), and its ranks' rows under it."""

    node: str
    head: Row
    ranks: tuple[Row, ...]
    ranks_height: float
    at_fault: bool
    open: bool

    @property
    def head_height(self) -> float:
        return NODE_H + 2 * GAP


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Line:
    """A moment of the whole job, drawn across every lane."""

    x: float
    kind: str
    label: str
    title: str


@dataclass(frozen=True)
class Timeline:
    width: float
    ticks: tuple[Tick, ...]
    lanes: tuple[Lane, ...]
    lines: tuple[Line, ...]
    preflight: tuple[float, float] | None  # x and width of the pre-flight, when it ran
    # The checkpoints' lane (--checkpoint-dir): each where it became complete, restores.
    checkpoints: tuple[CheckpointMark, ...] = ()
    stop: StopBand | None = None  # the stop asked of the job and its grace
    plot_x: float = LABEL_W
    plot_w: float = PLOT_W
    axis_h: float = AXIS_H

    @property
    def rows(self) -> tuple[Row, ...]:
        return tuple(row for lane in self.lanes for row in (lane.head, *lane.ranks))

    def line(self, kind: str) -> Line | None:
        return next((line for line in self.lines if line.kind == kind), None)


class Scale:
    """Seconds since the epoch to x, over the plot's width."""

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

    def ticks(self) -> tuple[Tick, ...]:
        """Round steps from the start (+0s, +5s, +10s...), at most TICKS of them."""
        step = nice_step(self.span / (TICKS - 1))
        count = int(self.span / step + 1e-9) + 1
        return tuple(Tick(self.x(self.start + i * step), f"+{_short(i * step)}")
                     for i in range(count))  # fmt: skip


def nice_step(rough: float) -> float:
    """The smallest of 1, 2, 5 (or 15, 30 for minutes and hours) times a power of ten at
    least `rough` seconds."""
    for step in (*(m * 10**e for e in range(-2, 2) for m in (1, 2, 5)), 60, 120, 300, 600,
                 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400):  # fmt: skip
        if step >= rough:
            return float(step)
    return 86400.0 * max(1, round(rough / 86400 + 0.5))


def timeline(model: ReportModel) -> Timeline | None:
    """None when the record holds no times to draw."""
    if model.start is None or model.end is None:
        return None
    scale = Scale(model.start, model.end)
    lanes = tuple(_lane(model, node, scale) for node in model.nodes)
    started, ended = model.first(MomentKind.PREFLIGHT_START), model.first(MomentKind.PREFLIGHT_END)
    marks = (lane_marks(model.checkpoints, scale.x, model.start, LABEL_W, WIDTH)
             if model.checkpoints is not None else ())  # fmt: skip
    stopped = band(model.stop, scale.x, model.start, model.end) if model.stop else None
    return Timeline(WIDTH, scale.ticks(), lanes, _lines(model, scale),
                    scale.bar(started, ended), marks, stopped)  # fmt: skip


def _lines(model: ReportModel, scale: Scale) -> tuple[Line, ...]:
    lines: list[Line] = []
    failure = _first_failure_at(model)
    if failure is not None:
        where = ""
        if model.cause is not None:
            rank = f"rank {model.cause.rank} on " if model.cause.rank is not None else ""
            where = f": {rank}{model.cause.node}"
        lines.append(Line(scale.x(failure), FIRST_FAILURE, "first failure",
                          f"first failure {since(model.start, failure)}{where}"))  # fmt: skip
    for moment in model.moments:
        label = LINE_KINDS.get(moment.kind)  # a str enum: its members hash as their values
        if moment.kind == MomentKind.STOP and model.stop is not None:
            continue  # the stop's own band says when it was asked, each rank's row when signalled
        if label is not None:
            what = f": {_past(label, moment.detail)}" if moment.detail else ""
            title = f"{label} {since(model.start, moment.t)}{what}"
            lines.append(Line(scale.x(moment.t), moment.kind, label, title))
    return tuple(lines)


def _first_failure_at(model: ReportModel) -> float | None:
    """The earlier of when the cause rank ended (a crash: before the head hears of it) and
    when the head learnt of the failure (a hang: the rank at fault ends when torn down)."""
    if model.cause is None:
        return None
    known = [t for t in (model.cause.at, model.first(MomentKind.FIRST_FAILURE)) if t is not None]
    return min(known) if known else None


def _lane(model: ReportModel, node: NodeRow, scale: Scale) -> Lane:
    head = _node_row(model, node, scale)
    ranks: list[Row] = []
    y = float(GAP)
    if model.folded and node.ranks:
        ranks.append(_strip(model, node, y))
        y += RANK_H + GAP
    elif not model.folded:
        cause = model.cause.rank if model.cause is not None else None
        for rank in node.ranks:
            at_fault = node.is_cause and (rank.role == Role.CAUSE or rank.rank == cause)
            ranks.append(_rank_row(model, rank, scale, y, at_fault))
            y += RANK_H + GAP
    show_open = node.is_cause or (len(model.nodes) <= OPEN_NODES_UP_TO and not model.folded)
    return Lane(node.node, head, tuple(ranks), y, node.is_cause, show_open)


def _marks(model: ReportModel, scale: Scale, node: str, rank: int | None) -> tuple[Mark, ...]:
    kinds = [MomentKind.FIRST_OUTPUT, MomentKind.LAST_OUTPUT]
    if rank is None:
        kinds.append(MomentKind.LAST_HEARTBEAT)
    marks = []
    for kind in kinds:
        t = model.at(kind, node, rank)
        if t is not None:
            who = node if rank is None else f"rank {rank}"
            marks.append(
                Mark(
                    scale.x(t),
                    str(kind),
                    f"{who}: {kind.value.replace('-', ' ')} {since(model.start, t)}",
                )
            )
    return tuple(marks)  # fmt: skip


def _node_row(model: ReportModel, node: NodeRow, scale: Scale) -> Row:
    code = "-" if node.exit_code is None else node.exit_code
    title = (f"{node.node}: {len(node.ranks)} ranks, exit {code}, "
             f"{since(model.start, node.start)} to {since(model.start, node.end)}")  # fmt: skip
    return Row(float(GAP), NODE_H, node.node, node.node, None, "node", title,
               scale.bar(node.start, node.end), node.is_cause,
               marks=_marks(model, scale, node.node, None),
               stop=_node_stop(model, node, scale))  # fmt: skip


def _node_stop(model: ReportModel, node: NodeRow, scale: Scale) -> tuple[StopMark, ...]:
    """Folded, a node's own row carries its ranks' part in the stop; open, only a node the
    signal could not reach says so there (its ranks' rows say the rest)."""
    stop = model.stop
    if stop is None or model.end is None:
        return ()
    if not model.folded:
        return unreached_mark(stop, node.node, scale.x)
    ranks = [model.rank_stops[r.rank] for r in node.ranks if r.rank in model.rank_stops]
    return node_marks(stop, node.node, ranks, scale.x, model.start, model.end)


def _rank_row(
    model: ReportModel, rank: RankRecord, scale: Scale, y: float, at_fault: bool
) -> Row:
    local = f" (local {rank.local_rank})" if rank.local_rank is not None else ""
    title = (f"rank {rank.rank} on {rank.node}: {how(rank)}, {rank.role}, "
             f"{since(model.start, rank.start)} to {since(model.start, rank.end)}")  # fmt: skip
    return Row(
        y, RANK_H, f"rank {rank.rank}{local}", rank.node, rank.rank, f"rank role-{rank.role}",
        title, scale.bar(rank.start, rank.end), at_fault,
        marks=_marks(model, scale, rank.node, rank.rank), stop=_rank_stop(model, rank, scale),
    )  # fmt: skip


def _rank_stop(model: ReportModel, rank: RankRecord, scale: Scale) -> tuple[StopMark, ...]:
    part = model.rank_stops.get(rank.rank)
    if model.stop is None or part is None or model.end is None:
        return ()
    return rank_marks(model.stop, part, scale.x, model.start, model.end)


def _strip(model: ReportModel, node: NodeRow, y: float) -> Row:
    """A node's ranks folded: one small cell each, coloured by how it ended (and after a
    stop, underlined by how it ended after the signal)."""
    width = min(CELL_MAX, PLOT_W / max(len(node.ranks), 1))
    cells = tuple(
        _cell(model, rank, round(LABEL_W + i * width, 1), round(max(width - 1, 1), 1))
        for i, rank in enumerate(node.ranks)
    )
    return Row(y, RANK_H, f"{len(node.ranks)} ranks", node.node, None, "strip",
               role_counts(node.ranks), None, False, cells)  # fmt: skip


def _cell(model: ReportModel, rank: RankRecord, x: float, width: float) -> Cell:
    title = f"rank {rank.rank} on {rank.node}: {how(rank)}, {rank.role}"
    part = model.rank_stops.get(rank.rank)
    if model.stop is None or part is None:
        return Cell(x, width, rank.rank, rank.role, title)
    return Cell(x, width, rank.rank, rank.role, f"{title}; after the stop: "
                f"{end_words(model.stop, part)}", str(part.end))  # fmt: skip


def role_counts(ranks: tuple[RankRecord, ...]) -> str:
    """ "6 consequence, 1 cause, 1 succeeded"."""
    roles = sorted({rank.role for rank in ranks})
    return ", ".join(f"{sum(r.role == role for r in ranks)} {role}" for role in roles)


def _short(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.2g}s" if seconds < 1 else f"{seconds:g}s"
    if seconds < 7200:
        return f"{seconds / 60:.3g}m"
    return f"{seconds / 3600:.3g}h"
