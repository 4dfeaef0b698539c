"""The job's checkpoints as its page shows them (`--checkpoint-dir`): the "Checkpoints"
section (how many, the newest complete one, the bytes copied, what each restart resumed
from) and their marks on the timeline (each where it became complete, its name above it when
there is room, a tooltip with its size, whether it is complete and which nodes hold
copies). Built from the record (records/checkpoints.py) on values; the restart's sentence is
the record's own, as the head printed it and `orch checkpoints JOB` shows it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from orchestrator.records.checkpoints import CheckpointEntry, CheckpointsRecord, RestoreRecord
from orchestrator.report.clock import since
from orchestrator.specs.inventory import nodes_text
from orchestrator.specs.units import format_bytes

ROWS_SHOWN = 20  # the table's newest checkpoints; `orch checkpoints JOB` lists every one
CLUSTER_PX = 7  # marks closer than this on the timeline fold into one
CHAR_PX = 6.2  # a label's width per character at the timeline's 11px font
NAMES_IN_TITLE = 6  # a folded mark's tooltip names this many of its checkpoints' names


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint as the page's table shows it. `state`: complete, incomplete or
    deleted; `at`: when it last became complete, and how many saves made it so."""

    name: str
    size: str
    state: str
    complete: str  # "yes (deepspeed latest)", "no: <why not yet>", "deleted by its writer"
    at: str  # "+12.3s", "+80.0s (3 saves)", "-"
    writers: str
    holders: str
    attempt: int


@dataclass(frozen=True)
class Point:
    """A moment of one checkpoint that the timeline marks: each save that made it complete
    (a name saved again and again has several), or when it was first seen if it never was.
    `kind`: complete, incomplete or deleted."""

    t: float
    kind: str
    name: str
    title: str


@dataclass(frozen=True)
class RestoreRow:
    """One restart: the record's sentence, and what each of its nodes was sent."""

    attempt: int
    at: float
    entry: str | None
    sentence: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class CheckpointsView:
    dir: str
    settings: str  # `checkpoints in /data/ckpt: 1 copy on another node, at most 200 MB/s`
    sharing: str
    summary: str  # how many, the newest complete, the bytes copied
    rows: tuple[CheckpointRow, ...]  # every checkpoint, oldest first
    restores: tuple[RestoreRow, ...]
    points: tuple[Point, ...] = ()  # every checkpoint's moments on the timeline
    problem: str | None = None  # the record could not be read: why

    @property
    def shown(self) -> tuple[CheckpointRow, ...]:
        """The newest ROWS_SHOWN, newest first: a job of a thousand checkpoints keeps a
        page one can scroll."""
        return tuple(reversed(self.rows[-ROWS_SHOWN:]))

    @property
    def times(self) -> tuple[float, ...]:
        """Every moment the timeline marks: its bounds must hold them."""
        return (*(point.t for point in self.points), *(r.at for r in self.restores))


def unreadable(problem: str) -> CheckpointsView:
    """The page of a job whose record of checkpoints cannot be read says so, and goes on."""
    return CheckpointsView("", "", "", "", (), (), problem=problem)


def checkpoints_view(record: CheckpointsRecord, start: float | None) -> CheckpointsView:
    rows = tuple(_row(entry, start) for entry in record.checkpoints)
    points = tuple(p for entry in record.checkpoints for p in _points(entry, record, start))
    restores = tuple(_restore(restore) for restore in record.restores)
    return CheckpointsView(record.dir, record.settings_words, record.sharing_words,
                           summary(record, start), rows, restores, points)  # fmt: skip


def summary(record: CheckpointsRecord, start: float | None = None) -> str:
    """`3 checkpoints (2 complete, 1 deleted by its writer); the newest complete:
    global_step200 (3.0 GiB); 6.0 GiB copied between nodes`."""
    entries = record.checkpoints
    if not entries:
        return "no checkpoint seen"
    counts = [(sum(e.complete for e in entries), "complete"),
              (sum(not e.complete and e.gone_at is None for e in entries), "not complete"),
              (sum(e.gone_at is not None for e in entries), "deleted by the job")]  # fmt: skip
    said = ", ".join(f"{count} {what}" for count, what in counts if count)
    plural = "checkpoint" if len(entries) == 1 else "checkpoints"
    newest = newest_complete(entries)
    latest = (f"the newest complete: {newest.name} ({format_bytes(newest.size)})"
              if newest is not None else _none_complete(entries, start))  # fmt: skip
    copied = ("nothing copied (every node sees the directory)" if record.shared
              else f"{format_bytes(record.copied_bytes)} copied between nodes")  # fmt: skip
    return f"{len(entries)} {plural} ({said}); {latest}; {copied}"


def _none_complete(entries: Sequence[CheckpointEntry], start: float | None) -> str:
    """None complete now; the one last complete, when the job is writing it again (a name
    saved in place: the job may well have ended in the middle of its last save)."""
    again = [e for e in entries if e.gone_at is None and e.became_complete is not None]
    if not again:
        return "none complete"
    last = max(again, key=lambda e: e.became_complete or 0.0)
    return (f"none complete now ({last.name} was complete {since(start, last.became_complete)}"
            ", then written again)")


def newest_complete(entries: Sequence[CheckpointEntry]) -> CheckpointEntry | None:
    complete = [e for e in entries if e.complete_at is not None]
    return max(complete, key=lambda e: e.complete_at or 0.0) if complete else None


def _row(entry: CheckpointEntry, start: float | None) -> CheckpointRow:
    state, complete = _state(entry, start)
    saves = len(_saves(entry))
    at = since(start, entry.became_complete) + (f" ({saves} saves)" if saves > 1 else "")
    return CheckpointRow(_shown_name(entry), format_bytes(entry.size), state, complete, at,
                         _nodes(entry.writers) or "-", _nodes(entry.holders) or "-",
                         entry.attempt)  # fmt: skip


def _shown_name(entry: CheckpointEntry) -> str:
    return entry.name + ("/" if entry.kind == "dir" else "")


def _state(entry: CheckpointEntry, start: float | None) -> tuple[str, str]:
    """(its css state, the table's words for whether it is complete)."""
    if entry.gone_at is not None:
        return "deleted", f"deleted by its writer {since(start, entry.gone_at)}"
    if entry.complete:
        return "complete", f"yes ({entry.how})" if entry.how else "yes"
    return "incomplete", f"no: {entry.how}" if entry.how else "no"


def _saves(entry: CheckpointEntry) -> tuple[float, ...]:
    """Each time it became complete (a record may name the last only in complete_at)."""
    last = entry.complete_at
    return entry.completions + ((last,) if last is not None and last not in entry.completions
                                else ())  # fmt: skip


def _points(entry: CheckpointEntry, record: CheckpointsRecord,
            start: float | None) -> list[Point]:  # fmt: skip
    """Where the timeline marks the checkpoint: at each save that made it complete; at
    when it was first seen if none did."""
    head = f"{_shown_name(entry)}: {format_bytes(entry.size)}"
    writers = f"written by {_nodes(entry.writers) or '-'}"
    saves = _saves(entry)
    if not saves:
        state = "deleted" if entry.gone_at is not None else "incomplete"
        title = f"{head}; {_never(entry, start)}; {writers}; {_copies(entry, record)}"
        return [Point(entry.first_seen, state, entry.name, title)]
    points = []
    for index, t in enumerate(saves):
        which = f" (save {index + 1} of {len(saves)})" if len(saves) > 1 else ""
        done = f"complete {since(start, t)}{which}"
        if index + 1 < len(saves):  # saved again since: its copies are of the later save
            points.append(Point(t, "complete", entry.name, f"{head}; {done}; {writers}"))
            continue
        kind = "deleted" if entry.gone_at is not None else "complete"
        title = f"{head}; {done}{_since(entry, start)}; {writers}; {_copies(entry, record)}"
        points.append(Point(t, kind, entry.name, title))
    return points


def _never(entry: CheckpointEntry, start: float | None) -> str:
    """The tooltip's words for a checkpoint that was never complete."""
    if entry.gone_at is not None:
        return f"deleted by its writer {since(start, entry.gone_at)}, never complete"
    why = f": {entry.how}" if entry.how else ""
    return f"NOT complete (first seen {since(start, entry.first_seen)}){why}"


def _since(entry: CheckpointEntry, start: float | None) -> str:
    """What became of its last save: deleted, written again, or complete still (how)."""
    if entry.gone_at is not None:
        return f", deleted by its writer {since(start, entry.gone_at)} (its copies too)"
    if entry.complete_at is None:
        return f"; being written again, NOT complete now: {entry.how or 'changed'}"
    return f" ({entry.how})" if entry.how else ""


def _copies(entry: CheckpointEntry, record: CheckpointsRecord) -> str:
    if record.shared:
        return "no copies: every node sees the directory"
    if entry.gone_at is not None:
        return "no copy left"
    return f"copies on {_nodes(entry.holders)}" if entry.holders else "no copy on another node"


@lru_cache(maxsize=1024)
def _nodes(names: tuple[str, ...]) -> str:
    """Node names folded (`n[1-125]`), once per list: a job's checkpoints are written by
    the same nodes over and over, and folding 125 names costs milliseconds."""
    return nodes_text(names)


def _restore(restore: RestoreRecord) -> RestoreRow:
    return RestoreRow(restore.attempt, restore.at, restore.entry, restore.sentence,
                      tuple(got.words(node) for node, got in restore.nodes.items()))  # fmt: skip


# ----- the timeline's lane of checkpoints ------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """A mark on the checkpoints' lane: one checkpoint, several too close to tell apart
    (`count` > 1), or a restart's restore (`kind` "restore"). `label`: drawn above it when
    there is room (the title always holds it)."""

    x: float
    kind: str  # complete, incomplete, deleted, folded, restore
    count: int
    label: str
    title: str
    label_x: float | None = None  # None: no room for the label

    @property
    def half(self) -> int:
        """Half the diamond's height: a folded mark is drawn larger."""
        return 6 if self.count > 1 else 5


def lane_marks(view: CheckpointsView, x: Callable[[float], float], start: float | None,
               left: float, right: float) -> tuple[Mark, ...]:  # fmt: skip
    """Every checkpoint and restore as a mark at its x, close ones folded, labels placed
    left to right where they do not overlap (between `left` and `right`)."""
    marks = _folded([(x(point.t), point) for point in view.points], start)
    marks += [_restored(restore, x(restore.at), start) for restore in view.restores]
    # Restores drawn last, over any checkpoint at the same place.
    return tuple(sorted(_labelled(marks, left, right),
                        key=lambda mark: (mark.kind == "restore", mark.x)))


def _folded(placed: list[tuple[float, Point]], start: float | None) -> list[Mark]:
    groups: list[list[tuple[float, Point]]] = []
    for item in sorted(placed, key=lambda pair: pair[0]):
        if groups and item[0] - groups[-1][0][0] < CLUSTER_PX:
            groups[-1].append(item)
        else:
            groups.append([item])
    return [_one(group[0]) if len(group) == 1 else _many(group, start) for group in groups]


def _one(placed: tuple[float, Point]) -> Mark:
    x, point = placed
    return Mark(x, point.kind, 1, point.name, point.title)


def _many(group: list[tuple[float, Point]], start: float | None) -> Mark:
    points = [point for _x, point in group]
    names = list(dict.fromkeys(point.name for point in points))  # a name saved twice: once
    more = len(names) - NAMES_IN_TITLE
    said = ", ".join(names[:NAMES_IN_TITLE]) + (f" and {more} more" if more > 0 else "")
    complete = sum(point.kind == "complete" for point in points)
    title = (f"{len(points)} checkpoints {since(start, points[0].t)} to "
             f"{since(start, points[-1].t)}, {complete} complete: {said}")  # fmt: skip
    return Mark(group[0][0], "folded", len(points), f"{len(points)} checkpoints", title)


def _restored(restore: RestoreRow, x: float, start: float | None) -> Mark:
    return Mark(x, "restore", 1, f"from {restore.entry or 'scratch'}",
                f"restart {since(start, restore.at)}: {restore.sentence}")  # fmt: skip


def _labelled(marks: list[Mark], left: float, right: float) -> tuple[Mark, ...]:
    """Each label centred on its mark, moved inside [left, right], dropped where it would
    overlap one placed already: the tooltip still names it. Restores are placed first:
    what a restart resumed from is what the lane is read for."""
    taken: list[tuple[float, float]] = []
    placed: list[Mark] = []
    for mark in sorted(marks, key=lambda m: (m.kind != "restore", m.x)):
        width = CHAR_PX * len(mark.label)
        at = min(max(mark.x - width / 2, left), right - width)
        if all(at > end + 4 or at + width + 4 < begin for begin, end in taken):
            taken.append((at, at + width))
            mark = replace(mark, label_x=round(at, 1))
        placed.append(mark)
    return tuple(placed)
