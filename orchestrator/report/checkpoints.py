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
NAMES_IN_TITLE = 6  # a folded mark's tooltip names this many of its checkpoints


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint as the page shows it. `state`: complete, incomplete or deleted;
    `at`: where the timeline marks it (when it became complete, else first seen)."""

    name: str
    size: str
    state: str
    complete: str  # "yes (deepspeed latest)", "no: <why not yet>", "deleted by its writer"
    at: float
    became_complete: float | None
    writers: str
    holders: str
    attempt: int
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
    problem: str | None = None  # the record could not be read: why

    @property
    def shown(self) -> tuple[CheckpointRow, ...]:
        """The newest ROWS_SHOWN, newest first: a job of a thousand checkpoints keeps a
        page one can scroll."""
        return tuple(reversed(self.rows[-ROWS_SHOWN:]))

    @property
    def times(self) -> tuple[float, ...]:
        """Every moment the timeline marks: its bounds must hold them."""
        return (*(row.at for row in self.rows), *(restore.at for restore in self.restores))


def unreadable(problem: str) -> CheckpointsView:
    """The page of a job whose record of checkpoints cannot be read says so, and goes on."""
    return CheckpointsView("", "", "", "", (), (), problem)


def checkpoints_view(record: CheckpointsRecord, start: float | None) -> CheckpointsView:
    rows = tuple(_row(entry, record, start) for entry in record.checkpoints)
    restores = tuple(_restore(restore) for restore in record.restores)
    return CheckpointsView(record.dir, record.settings_words, record.sharing_words,
                           summary(record), rows, restores)  # fmt: skip


def summary(record: CheckpointsRecord) -> str:
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
              if newest is not None else "none complete")  # fmt: skip
    copied = ("nothing copied (every node sees the directory)" if record.shared
              else f"{format_bytes(record.copied_bytes)} copied between nodes")  # fmt: skip
    return f"{len(entries)} {plural} ({said}); {latest}; {copied}"


def newest_complete(entries: Sequence[CheckpointEntry]) -> CheckpointEntry | None:
    complete = [e for e in entries if e.complete_at is not None]
    return max(complete, key=lambda e: e.complete_at or 0.0) if complete else None


def _row(entry: CheckpointEntry, record: CheckpointsRecord, start: float | None) -> CheckpointRow:
    state, complete = _state(entry, start)
    writers = _nodes(entry.writers) or "-"
    name = entry.name + ("/" if entry.kind == "dir" else "")
    became = entry.became_complete
    title = (f"{name}: {format_bytes(entry.size)}; {_when(entry, start)}; written by "
             f"{writers}; {_copies(entry, record)}")  # fmt: skip
    return CheckpointRow(name, format_bytes(entry.size), state, complete,
                         became if became is not None else entry.first_seen, became,
                         writers, _nodes(entry.holders) or "-", entry.attempt,
                         title)  # fmt: skip


def _state(entry: CheckpointEntry, start: float | None) -> tuple[str, str]:
    """(its css state, the table's words for whether it is complete)."""
    if entry.gone_at is not None:
        return "deleted", f"deleted by its writer {since(start, entry.gone_at)}"
    if entry.complete:
        return "complete", f"yes ({entry.how})" if entry.how else "yes"
    return "incomplete", f"no: {entry.how}" if entry.how else "no"


def _when(entry: CheckpointEntry, start: float | None) -> str:
    """The tooltip's words for when it was complete, and what became of it."""
    became = entry.became_complete
    if entry.gone_at is not None:
        done = f"complete {since(start, became)}, " if became is not None else ""
        return f"{done}deleted by its writer {since(start, entry.gone_at)} (its copies too)"
    if became is not None:
        return f"complete {since(start, became)}" + (f" ({entry.how})" if entry.how else "")
    why = f": {entry.how}" if entry.how else ""
    return f"NOT complete (first seen {since(start, entry.first_seen)}){why}"


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
    marks = _folded([(x(row.at), row) for row in view.rows], start)
    marks += [_restored(restore, x(restore.at), start) for restore in view.restores]
    labelled = _labelled(sorted(marks, key=lambda mark: mark.x), left, right)
    # Restores drawn last, over any checkpoint at the same place: what a restart resumed
    # from is what the lane is read for.
    return tuple(sorted(labelled, key=lambda mark: mark.kind == "restore"))


def _folded(placed: list[tuple[float, CheckpointRow]], start: float | None) -> list[Mark]:
    groups: list[list[tuple[float, CheckpointRow]]] = []
    for item in sorted(placed, key=lambda pair: pair[0]):
        if groups and item[0] - groups[-1][0][0] < CLUSTER_PX:
            groups[-1].append(item)
        else:
            groups.append([item])
    return [_one(group[0]) if len(group) == 1 else _many(group, start) for group in groups]


def _one(placed: tuple[float, CheckpointRow]) -> Mark:
    x, row = placed
    return Mark(x, row.state, 1, row.name.rstrip("/"), row.title)


def _many(group: list[tuple[float, CheckpointRow]], start: float | None) -> Mark:
    rows = [row for _x, row in group]
    names = ", ".join(row.name for row in rows[:NAMES_IN_TITLE])
    more = f" and {len(rows) - NAMES_IN_TITLE} more" if len(rows) > NAMES_IN_TITLE else ""
    complete = sum(row.state == "complete" for row in rows)
    title = (f"{len(rows)} checkpoints {since(start, rows[0].at)} to "
             f"{since(start, rows[-1].at)}, {complete} complete: {names}{more}")  # fmt: skip
    return Mark(group[0][0], "folded", len(rows), f"{len(rows)} checkpoints", title)


def _restored(restore: RestoreRow, x: float, start: float | None) -> Mark:
    return Mark(x, "restore", 1, f"from {restore.entry or 'scratch'}",
                f"restart {since(start, restore.at)}: {restore.sentence}")  # fmt: skip


def _labelled(marks: list[Mark], left: float, right: float) -> tuple[Mark, ...]:
    """Each label centred on its mark, moved inside [left, right], dropped where it would
    overlap the one before: the tooltip still names it."""
    placed: list[Mark] = []
    end = left - 1.0
    for mark in marks:
        width = CHAR_PX * len(mark.label)
        at = min(max(mark.x - width / 2, left), right - width)
        if at > end + 4:
            placed.append(replace(mark, label_x=round(at, 1)))
            end = at + width
        else:
            placed.append(mark)
    return tuple(placed)
