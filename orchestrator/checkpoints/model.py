"""A node's scan of the checkpoint directory, as values: what it has in PATH (each entry's
files, with sizes and modification times), and the whole copies it holds of other nodes'
parts (with their sha256).

The scan is a JSON document the node sends; it is untrusted input, so `NodeScan.from_dict`
checks every field's type and refuses any path that could leave its entry (`..`, an
absolute path, a path not under the entry's name): a path from here is later joined to a
directory on a node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

Kind = Literal["file", "dir"]
KINDS: tuple[Kind, ...] = ("file", "dir")
# (path, size, mtime_ns) of every file of a part, sorted: equal signatures, unchanged part.
Signature = tuple[tuple[str, int, int], ...]
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileSeen:
    """A file in PATH as a node saw it; `path` is relative to PATH and starts with the
    entry's name."""

    path: str
    size: int
    mtime_ns: int
    # Its inode changed after its last write: renamed into place (write-then-rename).
    renamed: bool = False
    sha256: str = ""  # where the scan was asked for it


@dataclass(frozen=True)
class EntrySeen:
    """A file or directory directly under PATH on one node: its files and the text of the
    small pointer files in it (`latest`, `latest_universal`), keyed by their path."""

    name: str
    kind: Kind
    files: tuple[FileSeen, ...]
    text: Mapping[str, str]


@dataclass(frozen=True)
class FileCopy:
    """A file of a part as copied: its path relative to PATH, size and sha256 (hex)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class CopyHeld:
    """A whole copy a node holds, in orch's own directory, of the part node `writer` wrote
    of `entry`."""

    entry: str
    writer: str
    files: tuple[FileCopy, ...]


@dataclass(frozen=True)
class NodeScan:
    """One node's answer: PATH's state and entries, and the copies it holds. `truncated`:
    the node listed only part of PATH (too many files), so an entry missing from `entries`
    may still be there."""

    node: str
    dir: str
    exists: bool
    is_dir: bool
    writable: bool
    problem: str | None
    free_bytes: int | None
    copies_dir: str
    copies_free_bytes: int | None
    marker_seen: bool | None
    truncated: bool
    entries: tuple[EntrySeen, ...]
    copies: tuple[CopyHeld, ...]

    @property
    def lists_everything(self) -> bool:
        """Whether an entry missing from this scan is really not in PATH (the node read PATH
        without a problem and listed all of it)."""
        return self.problem is None and not self.truncated

    def entry(self, name: str) -> EntrySeen | None:
        return self._entries_by_name.get(name)

    def copy_of(self, entry: str, writer: str) -> CopyHeld | None:
        return self._copies_by_part.get((entry, writer))

    # Looked up for every entry the head follows, every round: an index, made once.
    @cached_property
    def _entries_by_name(self) -> dict[str, EntrySeen]:
        return {entry.name: entry for entry in self.entries}

    @cached_property
    def _copies_by_part(self) -> dict[tuple[str, str], CopyHeld]:
        return {(held.entry, held.writer): held for held in self.copies}

    @classmethod
    def from_dict(cls, doc: object) -> NodeScan:
        """The scan from its JSON form; ValueError naming the node and the field when the
        document is malformed or unsafe."""
        return _read_scan(doc)


def signature(files: Iterable[FileSeen]) -> Signature:
    """What says whether a part changed between two scans: its files' paths, sizes, mtimes."""
    return tuple(sorted((seen.path, seen.size, seen.mtime_ns) for seen in files))


def part_size(files: Iterable[FileSeen | FileCopy]) -> int:
    """A part's bytes: the sum of its files' sizes."""
    return sum(seen.size for seen in files)


def shape(files: Iterable[FileSeen | FileCopy]) -> frozenset[tuple[str, int]]:
    """A part's files as (path, size): what a copy must match to be a copy of it."""
    return frozenset((seen.path, seen.size) for seen in files)


# ----- reading a scan ------------------------------------------------------------------
class _Reader:
    """Typed access to one node's document; every error names the node and the field."""

    def __init__(self, node: str) -> None:
        self.node = node

    def fail(self, where: str, problem: str) -> ValueError:
        return ValueError(f"checkpoint scan from node {self.node}: {where} {problem}")

    def get(self, doc: Mapping[str, Any], key: str, where: str) -> Any:
        if key not in doc:
            raise self.fail(f"{where}.{key}" if where else key, "is missing")
        return doc[key]

    def text(self, doc: Mapping[str, Any], key: str, where: str = "") -> str:
        value = self.get(doc, key, where)
        if not isinstance(value, str):
            raise self.fail(_at(where, key), f"is {_type(value)}, not a string")
        return value

    def optional_text(self, doc: Mapping[str, Any], key: str) -> str | None:
        value = self.get(doc, key, "")
        if value is not None and not isinstance(value, str):
            raise self.fail(key, f"is {_type(value)}, not a string or null")
        return value

    def flag(self, doc: Mapping[str, Any], key: str, nullable: bool = False) -> Any:
        value = self.get(doc, key, "")
        if not isinstance(value, bool) and not (nullable and value is None):
            raise self.fail(key, f"is {_type(value)}, not true or false")
        return value

    def count(self, doc: Mapping[str, Any], key: str, where: str = "", nullable: bool = False,
              signed: bool = False) -> Any:  # fmt: skip
        value = self.get(doc, key, where)
        if nullable and value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(_at(where, key), f"is {_type(value)}, not a whole number")
        if value < 0 and not signed:
            raise self.fail(_at(where, key), f"is {value}, below 0")
        return value

    def items(self, doc: Mapping[str, Any], key: str, where: str = "") -> list[Any]:
        value = self.get(doc, key, where)
        if not isinstance(value, list):
            raise self.fail(_at(where, key), f"is {_type(value)}, not a list")
        return value

    def mapping(self, value: object, where: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"is {_type(value)}, not an object")
        return value


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _type(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def entry_name_problem(name: str) -> str | None:
    """Why `name` cannot be an entry directly under PATH, or None."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        return "is not a name directly under the checkpoint directory"
    return None


def path_problem(path: str, entry: str) -> str | None:
    """Why `path` is not a safe path of entry `entry` relative to PATH, or None."""
    if path.startswith("/"):
        return "is absolute"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\0" in path:
        return "is not a plain relative path (empty, '.' or '..' parts)"
    if parts[0] != entry:
        return f"is not under the entry's name {entry!r}"
    return None


def _read_scan(doc: object) -> NodeScan:
    if not isinstance(doc, Mapping):
        raise ValueError(f"checkpoint scan: the answer is {_type(doc)}, not an object")
    node = doc.get("node")
    if not isinstance(node, str) or not node:
        raise ValueError("checkpoint scan: the answer names no node (`node` missing or empty)")
    read = _Reader(node)
    if doc.get("ok") is not True:
        error = doc.get("error") or doc.get("problem") or "no reason given"
        raise read.fail("the scan", f"failed: {error}")
    entries = tuple(
        _read_entry(read, item, at) for at, item in _each(read, doc, "entries")
    )
    _refuse_repeats(read, "entries", [entry.name for entry in entries])
    copies = tuple(
        _read_copy(read, item, at) for at, item in _each(read, doc, "copies")
    )
    _refuse_repeats(read, "copies", [f"{held.entry} by {held.writer}" for held in copies])
    return NodeScan(
        node=node,
        dir=read.text(doc, "dir"),
        exists=read.flag(doc, "exists"),
        is_dir=read.flag(doc, "is_dir"),
        writable=read.flag(doc, "writable"),
        problem=read.optional_text(doc, "problem"),
        free_bytes=read.count(doc, "free_bytes", nullable=True),
        copies_dir=read.text(doc, "copies_dir"),
        copies_free_bytes=read.count(doc, "copies_free_bytes", nullable=True),
        marker_seen=read.flag(doc, "marker_seen", nullable=True),
        truncated=read.flag(doc, "truncated"),
        entries=entries,
        copies=copies,
    )


def _each(
    read: _Reader, doc: Mapping[str, Any], key: str, where: str = ""
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each object of the list at `key`, with where it is (`entries[2].files[0]`)."""
    for index, item in enumerate(read.items(doc, key, where)):
        at = f"{_at(where, key)}[{index}]"
        yield at, read.mapping(item, at)


def _read_name(read: _Reader, doc: Mapping[str, Any], key: str, where: str) -> str:
    name = read.text(doc, key, where)
    problem = entry_name_problem(name)
    if problem:
        raise read.fail(f"{where}.{key} {name!r}", problem)
    return name


def _read_path(read: _Reader, doc: Mapping[str, Any], entry: str, where: str) -> str:
    path = read.text(doc, "path", where)
    problem = path_problem(path, entry)
    if problem:
        raise read.fail(f"{where}.path {path!r}", problem)
    return path


def _read_entry(read: _Reader, doc: Mapping[str, Any], where: str) -> EntrySeen:
    name = _read_name(read, doc, "name", where)
    kind = read.text(doc, "kind", where)
    if kind not in KINDS:
        raise read.fail(f"{where}.kind {kind!r}", "is neither 'file' nor 'dir'")
    files = tuple(
        _read_file_seen(read, item, name, at)
        for at, item in _each(read, doc, "files", where)
    )
    _refuse_repeats(read, f"{where}.files", [seen.path for seen in files])
    if kind == "file" and any(seen.path != name for seen in files):
        raise read.fail(f"{where}.files", f"of the file entry {name!r} name another file")
    return EntrySeen(name, kind, files, _read_text(read, doc, name, where))  # type: ignore[arg-type]


def _read_text(read: _Reader, doc: Mapping[str, Any], entry: str, where: str) -> dict[str, str]:
    texts = read.mapping(doc.get("text", {}), f"{where}.text")
    for path, content in texts.items():
        problem = path_problem(path, entry) if isinstance(path, str) else "is not a string"
        if problem:
            raise read.fail(f"{where}.text key {path!r}", problem)
        if not isinstance(content, str):
            raise read.fail(f"{where}.text[{path!r}]", f"is {_type(content)}, not a string")
    return dict(texts)


def _read_file_seen(read: _Reader, doc: Mapping[str, Any], entry: str, where: str) -> FileSeen:
    return FileSeen(
        path=_read_path(read, doc, entry, where),
        size=read.count(doc, "size", where),
        mtime_ns=read.count(doc, "mtime_ns", where, signed=True),
        renamed=_renamed_after_write(doc),
        sha256=_read_sha256(read, doc, where) if "sha256" in doc else "",
    )


def _read_sha256(read: _Reader, doc: Mapping[str, Any], where: str) -> str:
    sha256 = read.text(doc, "sha256", where)
    if not _SHA256.fullmatch(sha256):
        raise read.fail(f"{where}.sha256 {sha256!r}", "is not 64 lowercase hex digits")
    return sha256


def _renamed_after_write(doc: Mapping[str, Any]) -> bool:
    """Whether the file's status changed after its data (ctime after mtime): a rename into
    place; optional in a scan (an older node program does not say)."""
    ctime, mtime = doc.get("ctime_ns"), doc.get("mtime_ns")
    return isinstance(ctime, int) and isinstance(mtime, int) and ctime > mtime


def _read_copy(read: _Reader, doc: Mapping[str, Any], where: str) -> CopyHeld:
    entry = _read_name(read, doc, "entry", where)
    writer = read.text(doc, "writer", where)
    if not writer:
        raise read.fail(f"{where}.writer", "is empty")
    files = tuple(
        _read_file_copy(read, item, entry, at)
        for at, item in _each(read, doc, "files", where)
    )
    _refuse_repeats(read, f"{where}.files", [copied.path for copied in files])
    return CopyHeld(entry, writer, files)


def _read_file_copy(read: _Reader, doc: Mapping[str, Any], entry: str, where: str) -> FileCopy:
    return FileCopy(_read_path(read, doc, entry, where), read.count(doc, "size", where),
                    _read_sha256(read, doc, where))  # fmt: skip


def _refuse_repeats(read: _Reader, where: str, names: Sequence[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise read.fail(where, f"name {name!r} twice")
        seen.add(name)
