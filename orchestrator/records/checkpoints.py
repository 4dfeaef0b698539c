"""The job's record of its checkpoints, `runs/<job>/checkpoints.json`: every checkpoint seen
under --checkpoint-dir (which nodes wrote its parts, which hold copies, when it was complete
and how that was decided, when the writer deleted it), and what each restart resumed from.

Written whole through RunDir.replace_file (a reader never sees half of it) each time it
changes, and read back by `orch checkpoints JOB`. A job launched without --checkpoint-dir has
no such file. Times are seconds since the epoch on the head's clock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from orchestrator.checkpoints.resumed import resumed_words
from orchestrator.errors import RecordError
from orchestrator.records.job import CHECKPOINTS_FILE
from orchestrator.records.rundir import RunDir
from orchestrator.specs.checkpoints import bandwidth_words, copies_words
from orchestrator.specs.units import format_bytes

_T = TypeVar("_T")


class _Malformed(ValueError):
    """What is wrong in the file, where: from_dict turns it into a RecordError naming it."""


@dataclass(frozen=True)
class FileCopy:
    """One file of a checkpoint: its path relative to --checkpoint-dir, "/" separated, that
    begins with the checkpoint's name."""

    path: str
    size: int
    sha256: str

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: Any) -> FileCopy:
        return cls(_text(data, "path"), _count(data, "size"), _text(data, "sha256"))


@dataclass(frozen=True)
class PartRecord:
    """The part of a checkpoint one node wrote (all of it, when one node writes it whole):
    its files, and the other nodes that hold a whole copy of them."""

    writer: str
    files: tuple[FileCopy, ...]
    holders: tuple[str, ...] = ()  # nodes holding a whole copy, never the writer

    @property
    def size(self) -> int:
        return sum(item.size for item in self.files)

    def to_dict(self) -> dict[str, object]:
        return {"writer": self.writer, "files": [item.to_dict() for item in self.files],
                "holders": list(self.holders)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> PartRecord:
        return cls(_text(data, "writer"), _items(data, "files", FileCopy.from_dict),
                   _texts(data, "holders"))  # fmt: skip


@dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint: a file or directory directly under --checkpoint-dir. `kind`: "file"
    or "dir"; `complete_at`: when it was found complete (None: not yet), `how`: by what
    (a framework's marker, or quiet for the settle time on every node); `size`: its bytes,
    every part together; `gone_at`: when its writer deleted it (its copies went too);
    `attempt`: the attempt that wrote it (1: the first); `completions`: each time it was
    found complete, oldest first: a name the job saves again and again (`last.pt`) became
    complete at each save, and the times stay once the writer deletes it or writes it again
    (`complete_at` is then None), so that the job's page can place each save."""

    name: str
    kind: str
    first_seen: float
    complete_at: float | None
    how: str
    size: int
    parts: tuple[PartRecord, ...]
    gone_at: float | None
    attempt: int
    completions: tuple[float, ...] = ()

    @property
    def complete(self) -> bool:
        return self.complete_at is not None

    @property
    def became_complete(self) -> float | None:
        """When it became complete, whatever became of it since; None: never."""
        if self.complete_at is not None:
            return self.complete_at
        return self.completions[-1] if self.completions else None

    @property
    def writers(self) -> tuple[str, ...]:
        return tuple(part.writer for part in self.parts)

    @property
    def holders(self) -> tuple[str, ...]:
        """Every node holding a copy of some part, in the order first named."""
        return tuple(dict.fromkeys(node for part in self.parts for node in part.holders))

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "first_seen": self.first_seen,
                "complete_at": self.complete_at, "how": self.how, "size": self.size,
                "parts": [part.to_dict() for part in self.parts], "gone_at": self.gone_at,
                "attempt": self.attempt, "completions": list(self.completions)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> CheckpointEntry:
        kind = _text(data, "kind")
        if kind not in ("file", "dir"):
            raise _Malformed(f"checkpoint kind {kind!r} is neither file nor dir")
        complete_at = _time_or_none(data, "complete_at")
        return cls(
            name=_text(data, "name"), kind=kind, first_seen=_time(data, "first_seen"),
            complete_at=complete_at, how=_text(data, "how"),
            size=_count(data, "size"), parts=_items(data, "parts", PartRecord.from_dict),
            gone_at=_time_or_none(data, "gone_at"), attempt=_count(data, "attempt"),
            # A record written before orch kept them: what complete_at says.
            completions=_times(data, "completions") if _has(data, "completions")
            else (() if complete_at is None else (complete_at,)),
        )  # fmt: skip


@dataclass(frozen=True)
class NodeRestore:
    """What one node of a restarted attempt got before it started: the bytes and files sent
    to it, and the files it already had (the same sha256) and kept."""

    received_bytes: int
    received_files: int
    reused_files: int

    def to_dict(self) -> dict[str, object]:
        return {"received_bytes": self.received_bytes, "received_files": self.received_files,
                "reused_files": self.reused_files}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> NodeRestore:
        return cls(_count(data, "received_bytes"), _count(data, "received_files"),
                   _count(data, "reused_files"))  # fmt: skip

    def words(self, node: str) -> str:
        """`n3: sent 2.0 GiB (1 file); 1 file already there`."""
        return (f"{node}: sent {format_bytes(self.received_bytes)} "
                f"({files_words(self.received_files)}); {files_words(self.reused_files)} "
                "already there")  # fmt: skip


def files_words(count: int) -> str:
    """`1 file`, `3 files`."""
    return f"{count} file" + ("" if count == 1 else "s")


@dataclass(frozen=True)
class RestoreRecord:
    """What a restart resumed from: `attempt` the attempt it started (2: the first restart),
    `entry` the checkpoint staged on its nodes (None: none was complete), `why` in words,
    `skipped` the newer checkpoints left out (not complete among the surviving copies), and
    what each node got; `failed`: the nodes staging failed on, with why; `set_aside`: newer
    entries moved out of the checkpoint directory, not whole there. A record written before
    orch kept the last two reads them as empty."""

    attempt: int
    entry: str | None
    at: float
    why: str
    skipped: tuple[str, ...] = ()
    nodes: Mapping[str, NodeRestore] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)
    set_aside: tuple[str, ...] = ()

    @property
    def received_bytes(self) -> int:
        return sum(node.received_bytes for node in self.nodes.values())

    @property
    def sentence(self) -> str:
        """What the restart resumed from, as the head said it, `orch checkpoints` and the
        job's page say it."""
        return resumed_words(self.attempt, self.entry, staged=tuple(self.nodes),
                             sent_bytes=self.received_bytes, failed=self.failed,
                             set_aside=self.set_aside, skipped=self.skipped,
                             why=self.why)  # fmt: skip

    def to_dict(self) -> dict[str, object]:
        return {"attempt": self.attempt, "entry": self.entry, "at": self.at, "why": self.why,
                "skipped": list(self.skipped),
                "nodes": {name: got.to_dict() for name, got in self.nodes.items()},
                "failed": dict(self.failed), "set_aside": list(self.set_aside)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> RestoreRecord:
        nodes = _field(data, "nodes", dict)
        entry = _field(data, "entry", (str, type(None)))
        failed = _field(data, "failed", dict) if _has(data, "failed") else {}
        return cls(
            attempt=_count(data, "attempt"), entry=entry, at=_time(data, "at"),
            why=_text(data, "why"), skipped=_texts(data, "skipped"),
            nodes={_name(name): NodeRestore.from_dict(got) for name, got in nodes.items()},
            failed={_name(name): _problem(why) for name, why in failed.items()},
            set_aside=_texts(data, "set_aside") if _has(data, "set_aside") else (),
        )  # fmt: skip


@dataclass(frozen=True)
class CheckpointsRecord:
    """The job's checkpoints: its settings (`dir` absolute, `copies`, `bandwidth` in bytes
    per second, 0: no cap), whether every node sees the same directory (`shared`; None: not
    found out yet), every checkpoint seen, oldest first, every restart's restore, and the
    bytes the copies between nodes carried (`copied_bytes`, restores not counted)."""

    dir: str
    copies: int
    bandwidth: int
    shared: bool | None = None
    checkpoints: tuple[CheckpointEntry, ...] = ()
    restores: tuple[RestoreRecord, ...] = ()
    copied_bytes: int = 0

    @property
    def settings_words(self) -> str:
        """`checkpoints in /data/ckpt: 1 copy on another node, at most 200 MB/s`."""
        return (f"checkpoints in {self.dir}: {copies_words(self.copies)}, "
                f"{bandwidth_words(self.bandwidth)}")  # fmt: skip

    @property
    def sharing_words(self) -> str:
        """Whether orch copies: not where every node sees the same directory."""
        if self.shared is None:
            return f"not found out yet whether every node sees {self.dir}"
        if self.shared:
            return f"every node sees {self.dir}: nothing was copied"
        return f"each node has its own {self.dir}: complete checkpoints are copied to other nodes"

    def to_dict(self) -> dict[str, object]:
        return {"dir": self.dir, "copies": self.copies, "bandwidth": self.bandwidth,
                "shared": self.shared, "copied_bytes": self.copied_bytes,
                "checkpoints": [entry.to_dict() for entry in self.checkpoints],
                "restores": [restore.to_dict() for restore in self.restores]}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any, source: str = CHECKPOINTS_FILE) -> CheckpointsRecord:
        """The record as to_dict wrote it; a RecordError naming `source` (the file) and what
        is wrong in it for anything else."""
        try:
            return cls(
                dir=_text(data, "dir"), copies=_count(data, "copies"),
                bandwidth=_count(data, "bandwidth"),
                shared=_field(data, "shared", (bool, type(None))),
                checkpoints=_items(data, "checkpoints", CheckpointEntry.from_dict),
                restores=_items(data, "restores", RestoreRecord.from_dict),
                copied_bytes=_count(data, "copied_bytes") if _has(data, "copied_bytes") else 0,
            )  # fmt: skip
        except _Malformed as err:
            raise RecordError(f"{source}: not a record of checkpoints orch can read ({err})",
                              _FIX) from None  # fmt: skip


_FIX = ("orch writes this file while the job runs; one edited or cut short is not read: "
        "remove it to see the job without it")  # fmt: skip


def save_checkpoints(run: RunDir, record: CheckpointsRecord) -> None:
    """The record replaces the job's checkpoints.json whole."""
    run.replace_file(CHECKPOINTS_FILE, json.dumps(record.to_dict(), indent=2) + "\n")


def load_checkpoints(run: RunDir) -> CheckpointsRecord | None:
    """The job's record of checkpoints; None when it has none (it was launched without
    --checkpoint-dir). A file that is no such record is a RecordError naming it."""
    path = run.path / CHECKPOINTS_FILE
    try:
        fd = run.open(CHECKPOINTS_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise RecordError(f"{path}: cannot be read ({err.strerror})",
                          "check that it is a file of your own (not a link)") from None  # fmt: skip
    with os.fdopen(fd, "rb") as file:
        text = file.read()
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise RecordError(f"{path}: not JSON ({err})", _FIX) from None
    return CheckpointsRecord.from_dict(data, str(path))


# ----- reading values back, each check naming the key ----------------------------------------
def _field(data: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(data, Mapping):
        raise _Malformed(f"expected an object holding {key!r}, found {type(data).__name__}")
    if key not in data:
        raise _Malformed(f"{key!r} is missing")
    value = data[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _Malformed(f"{key!r} is {value!r}")
    if not isinstance(value, kind):
        raise _Malformed(f"{key!r} is {type(value).__name__}: {value!r}")
    return value


def _has(data: Any, key: str) -> bool:
    """Whether an object holds a key a record written by an earlier orch may lack."""
    return isinstance(data, Mapping) and key in data


def _problem(value: Any) -> str:
    if not isinstance(value, str):
        raise _Malformed(f"a staging failure {value!r}, not words")
    return value


def _text(data: Any, key: str) -> str:
    return str(_field(data, key, str))


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _Malformed(f"node name {value!r}")
    return value


def _count(data: Any, key: str) -> int:
    value = int(_field(data, key, int))
    if value < 0:
        raise _Malformed(f"{key!r} is {value}, below 0")
    return value


def _time(data: Any, key: str) -> float:
    return float(_field(data, key, (int, float)))


def _time_or_none(data: Any, key: str) -> float | None:
    value = _field(data, key, (int, float, type(None)))
    return None if value is None else float(value)


def _times(data: Any, key: str) -> tuple[float, ...]:
    items = _field(data, key, list)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise _Malformed(f"{key!r} holds {item!r}, not a time")
    return tuple(float(item) for item in items)


def _texts(data: Any, key: str) -> tuple[str, ...]:
    items = _field(data, key, list)
    for item in items:
        if not isinstance(item, str) or not item:
            raise _Malformed(f"{key!r} holds {item!r}, not a name")
    return tuple(items)


def _items(data: Any, key: str, read: Callable[[Any], _T]) -> tuple[_T, ...]:
    return tuple(read(item) for item in _field(data, key, list))
