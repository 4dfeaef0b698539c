"""When an entry of the checkpoint directory is a complete checkpoint, judged over the
nodes' successive scans on the head's clock, without any code in the training script.

A checkpoint is an entry (a file or directory directly under PATH) as every node has it:
one part per node that has it. It is complete when a framework says so (DeepSpeed's
`latest` at PATH's top names it; a transformers Trainer's `trainer_state.json`, a torch
distributed checkpoint's `.metadata` or accelerate's inner `latest` is in it and nothing
changed since the previous scan) or, without a framework's word, when no part changed on
any node for the settle time. A node that did not answer keeps its part as last seen; a
node that answered without the entry has no part of it any more; an entry no node has is
gone (its writer deleted it). Pure: `observe` takes the last state and returns the next.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from orchestrator.checkpoints.model import FileSeen, Kind, NodeScan, Signature, signature

# Names a writer gives what it has not finished: never checkpoints.
TEMPORARY_SUFFIXES = (".tmp", ".part", ".partial", ".incomplete", ".lock")
TEMPORARY_PREFIXES = (".", "tmp")
# A file inside a checkpoint named so is still being written: the checkpoint is not complete.
# Not the dot names (DCP's .metadata is its marker) nor locks (a crashed writer leaves them).
UNFINISHED_SUFFIXES = (".tmp", ".part", ".partial", ".incomplete")
# DeepSpeed's files at PATH's top: pointers naming the newest tag, and its conversion script.
POINTER_FILES = ("latest", "latest_universal")
COMPANIONS = (*POINTER_FILES, "zero_to_fp32.py")
# A framework's file at a checkpoint directory's top, written once the rest is; the words
# say why the checkpoint counts as complete.
MARKERS: Mapping[str, str] = {
    "trainer_state.json": "trainer_state.json (transformers Trainer) is written",
    ".metadata": ".metadata (torch distributed checkpoint) is written",
    "latest": "latest (DeepSpeed's, saved by accelerate) is written",
}
NAMED_BY_DEEPSPEED = "DeepSpeed's latest names it"
AT_NEXT_QUIET_SCAN = "complete once a scan finds every part unchanged"
MOVED_INTO_PLACE = "renamed into place after its last write"
AT_THE_END = "as the job left it when it succeeded"
DELETED = "deleted from the checkpoint directory by its writer"


def is_temporary(name: str) -> bool:
    """Whether a file or directory name looks like one still being written."""
    lowered = name.lower()
    return lowered.endswith(TEMPORARY_SUFFIXES) or lowered.startswith(TEMPORARY_PREFIXES)


def is_checkpoint_name(name: str) -> bool:
    """Whether an entry directly under PATH with this name can be a checkpoint."""
    return not is_temporary(name) and name not in COMPANIONS


@dataclass(frozen=True)
class Checkpoint:
    """An entry of PATH as the nodes have it. `parts`: each node's files of it (the node
    that wrote them is its writer); `changed_at`: when a part last changed on the head's
    clock; `complete_at`: since when it is complete; `how`: why it is complete, or why not
    yet, for a user; `quiet_scans`: scans in a row that found every part unchanged;
    `named_by`: DeepSpeed pointer files at PATH's top that have named it (to write back
    when it is restored)."""

    name: str
    kind: Kind
    parts: Mapping[str, tuple[FileSeen, ...]]
    first_seen: float
    changed_at: float
    complete: bool = False
    how: str = ""
    gone: bool = False
    complete_at: float | None = None
    quiet_scans: int = 0
    named_by: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """The checkpoint's bytes: each path once, however many nodes have it (a restored
        checkpoint is whole on every node)."""
        sizes: dict[str, int] = {}
        for files in self.parts.values():
            for seen in files:
                sizes[seen.path] = max(seen.size, sizes.get(seen.path, 0))
        return sum(sizes.values())


@dataclass(frozen=True)
class PointerSeen:
    """A DeepSpeed pointer file at PATH's top on one node: the entry it names."""

    target: str
    signature: Signature


@dataclass(frozen=True)
class Watched:
    """What the head knows of PATH across scans: every entry seen (gone ones too, so their
    copies can be removed), and each node's pointer files."""

    checkpoints: Mapping[str, Checkpoint] = field(default_factory=dict)
    pointers: Mapping[str, Mapping[str, PointerSeen]] = field(default_factory=dict)

    def complete(self) -> tuple[Checkpoint, ...]:
        """The complete checkpoints, newest first."""
        return newest_first(self.checkpoints.values())


@dataclass(frozen=True)
class _Followed:
    """An entry's parts after this round, before it is judged."""

    checkpoint: Checkpoint
    changed_now: bool
    kinds: Mapping[str, Kind]


def observe(state: Watched, scans: Mapping[str, NodeScan], now: float, settle_s: float) -> Watched:
    """The state after one round of scans (those of the nodes that answered), at `now`."""
    pointers = _pointers(state.pointers, scans)
    renamed = _renamed(state.pointers, pointers)
    naming = _naming(pointers)
    names = dict.fromkeys([*state.checkpoints, *_entry_names(scans)])
    followed = {
        name: found
        for name in names
        if (found := _follow(state.checkpoints.get(name), name, scans, now, naming)) is not None
    }
    judged = {
        name: _judged(found, followed, naming, renamed, now, settle_s)
        for name, found in followed.items()
    }
    return Watched(checkpoints=judged, pointers=pointers)


def at_the_end(state: Watched, now: float) -> Watched:
    """The job succeeded and nothing of it runs any more: every entry still in PATH is as
    its writer left it, so complete (the last one, written just before the end, is never
    found unchanged by a later scan), unless its name says it was left half written."""
    judged = {
        name: checkpoint if checkpoint.complete or checkpoint.gone
        or _unfinished(checkpoint, {}) is not None
        else replace(checkpoint, complete=True, complete_at=now, how=AT_THE_END)
        for name, checkpoint in state.checkpoints.items()
    }
    return replace(state, checkpoints=judged)


def without_lost_parts(state: Watched, alive: Collection[str]) -> Watched:
    """Before a restart: an incomplete checkpoint's parts on nodes not `alive` are lost with
    them. It can never be made whole, and one the next attempt writes under its name must
    not take them in; with no part left it is gone. A complete checkpoint keeps them: their
    copies are held by other nodes."""
    judged: dict[str, Checkpoint] = {}
    for name, checkpoint in state.checkpoints.items():
        parts = {node: files for node, files in checkpoint.parts.items() if node in alive}
        if checkpoint.complete or checkpoint.gone or len(parts) == len(checkpoint.parts):
            judged[name] = checkpoint
        elif parts:
            judged[name] = replace(checkpoint, parts=parts)
        else:
            lost = f"lost with {', '.join(sorted(checkpoint.parts))}"
            judged[name] = replace(checkpoint, parts={}, gone=True, quiet_scans=0, how=lost)
    return replace(state, checkpoints=judged)


# ----- pointers ------------------------------------------------------------------------
def _pointers_of(scan: NodeScan) -> dict[str, PointerSeen]:
    found: dict[str, PointerSeen] = {}
    for entry in scan.entries:
        text = entry.text.get(entry.name)
        if entry.kind == "file" and entry.name in POINTER_FILES and text is not None:
            target = text.strip()
            if is_checkpoint_name(target) and "/" not in target:
                found[entry.name] = PointerSeen(target, signature(entry.files))
    return found


def _pointers(
    before: Mapping[str, Mapping[str, PointerSeen]], scans: Mapping[str, NodeScan]
) -> dict[str, Mapping[str, PointerSeen]]:
    """Each node's pointers: as scanned, or as last seen for a node that did not answer
    (or listed only part of PATH)."""
    after = dict(before)
    for node, scan in scans.items():
        seen = _pointers_of(scan)
        after[node] = seen if scan.lists_everything else {**before.get(node, {}), **seen}
    return after


def _renamed(
    before: Mapping[str, Mapping[str, PointerSeen]],
    after: Mapping[str, Mapping[str, PointerSeen]],
) -> frozenset[str]:
    """Entries a pointer file was (re)written to name this round."""
    return frozenset(
        pointer.target
        for node, mine in after.items()
        for name, pointer in mine.items()
        if before.get(node, {}).get(name) != pointer
    )


def _naming(pointers: Mapping[str, Mapping[str, PointerSeen]]) -> dict[str, tuple[str, ...]]:
    """Entry -> the pointer files that name it now."""
    naming: dict[str, set[str]] = {}
    for mine in pointers.values():
        for name, pointer in mine.items():
            naming.setdefault(pointer.target, set()).add(name)
    return {target: tuple(sorted(names)) for target, names in naming.items()}


# ----- following an entry's parts -------------------------------------------------------
def _entry_names(scans: Mapping[str, NodeScan]) -> list[str]:
    return [
        entry.name
        for scan in scans.values()
        for entry in scan.entries
        if is_checkpoint_name(entry.name)
    ]


def _parts_now(
    previous: Checkpoint | None, name: str, scans: Mapping[str, NodeScan]
) -> tuple[dict[str, tuple[FileSeen, ...]], dict[str, Kind]]:
    """The entry's parts after this round, and each part's kind."""
    kept = previous.parts if previous is not None else {}
    kind = previous.kind if previous is not None else "dir"
    parts: dict[str, tuple[FileSeen, ...]] = {}
    kinds: dict[str, Kind] = {}
    for node, scan in scans.items():
        entry = scan.entry(name)
        if entry is not None:
            parts[node], kinds[node] = entry.files, entry.kind
        elif not scan.lists_everything and node in kept:
            parts[node], kinds[node] = kept[node], kind
    for node, files in kept.items():
        if node not in scans:  # did not answer: its part stays as last seen
            parts[node], kinds[node] = files, kind
    return parts, kinds


def _follow(
    previous: Checkpoint | None,
    name: str,
    scans: Mapping[str, NodeScan],
    now: float,
    naming: Mapping[str, tuple[str, ...]],
) -> _Followed | None:
    if previous is not None and previous.gone:
        if not any(scan.entry(name) for scan in scans.values()):
            return _Followed(previous, False, {})
        previous = None  # the name is back: a new checkpoint
    parts, kinds = _parts_now(previous, name, scans)
    named_by = tuple(sorted({*(previous.named_by if previous else ()), *naming.get(name, ())}))
    if previous is None:
        if not parts:
            return None
        first_kind = next(iter(kinds.values()))
        new = Checkpoint(name, first_kind, parts, now, now, named_by=named_by)
        return _Followed(new, True, kinds)
    if not parts:
        gone = replace(previous, parts={}, changed_at=now, complete=False, complete_at=None,
                       gone=True, quiet_scans=0, how=DELETED)  # fmt: skip
        return _Followed(gone, True, {})
    changed = _signatures(parts) != _signatures(previous.parts)
    after = replace(
        previous,
        parts=parts,
        changed_at=now if changed else previous.changed_at,
        quiet_scans=0 if changed else previous.quiet_scans + 1,
        named_by=named_by,
    )
    return _Followed(after, changed, kinds)


def _signatures(parts: Mapping[str, tuple[FileSeen, ...]]) -> dict[str, Signature]:
    return {node: signature(files) for node, files in parts.items()}


# ----- judging -------------------------------------------------------------------------
def _judged(
    found: _Followed,
    followed: Mapping[str, _Followed],
    naming: Mapping[str, tuple[str, ...]],
    renamed: frozenset[str],
    now: float,
    settle_s: float,
) -> Checkpoint:
    checkpoint = found.checkpoint
    if checkpoint.gone:  # deleted by its writer, or lost with its nodes: as it was said
        return replace(checkpoint, complete=False, complete_at=None)
    complete, how = _verdict(found, followed, naming, renamed, now, settle_s)
    was = checkpoint.complete_at if checkpoint.complete and not found.changed_now else None
    return replace(
        checkpoint,
        complete=complete,
        how=how,
        complete_at=(was if was is not None else now) if complete else None,
    )


def _verdict(
    found: _Followed,
    followed: Mapping[str, _Followed],
    naming: Mapping[str, tuple[str, ...]],
    renamed: frozenset[str],
    now: float,
    settle_s: float,
) -> tuple[bool, str]:
    """Whether the entry is complete, and why (or why not yet)."""
    checkpoint = found.checkpoint
    unfinished = _unfinished(checkpoint, found.kinds)
    if unfinished is not None:
        return False, unfinished
    unchanged = checkpoint.quiet_scans >= 1
    if checkpoint.kind == "dir" and checkpoint.name in naming:
        if not found.changed_now or checkpoint.name in renamed:
            return True, NAMED_BY_DEEPSPEED
        return False, f"{NAMED_BY_DEEPSPEED} but it changed since; {AT_NEXT_QUIET_SCAN}"
    if _moved_into_place(checkpoint):
        return True, MOVED_INTO_PLACE
    marker = _marker(checkpoint)
    if marker is not None:
        if unchanged:
            return True, MARKERS[marker]
        return False, f"{marker} is there; {AT_NEXT_QUIET_SCAN}"
    newer = _newer_named(checkpoint, followed, naming)
    if newer is not None and unchanged:
        return True, f"older than {newer}, which DeepSpeed's latest names, and unchanged"
    quiet_for = now - checkpoint.changed_at
    if unchanged and quiet_for >= settle_s:
        return True, f"quiet for {settle_s:g} s on every node"
    wanted = f"complete once quiet for {settle_s:g} s on every node"
    return False, f"changed {quiet_for:.0f} s ago; {wanted}"


def _unfinished(checkpoint: Checkpoint, kinds: Mapping[str, Kind]) -> str | None:
    """Why the entry cannot be complete whatever a framework says, or None."""
    for node, files in checkpoint.parts.items():
        for seen in files:
            if seen.path.lower().endswith(UNFINISHED_SUFFIXES):
                return f"{seen.path} on {node} has a temporary name: still being written"
    if len(set(kinds.values())) > 1:
        files = ", ".join(node for node, kind in kinds.items() if kind == "file")
        dirs = ", ".join(node for node, kind in kinds.items() if kind == "dir")
        return f"a file on {files} but a directory on {dirs}"
    if not any(checkpoint.parts.values()):
        return "empty so far"
    return None


def _moved_into_place(checkpoint: Checkpoint) -> bool:
    """A single file renamed into place after its last write (the write-to-a-temporary-name
    then rename pattern): whole the moment it appears under its name."""
    if checkpoint.kind != "file":
        return False
    files = [seen for part in checkpoint.parts.values() for seen in part]
    return bool(files) and all(seen.renamed for seen in files)


def _marker(checkpoint: Checkpoint) -> str | None:
    """The framework's marker at the top of the entry on some node, or None."""
    if checkpoint.kind != "dir":
        return None
    paths = {seen.path for files in checkpoint.parts.values() for seen in files}
    return next((name for name in MARKERS if f"{checkpoint.name}/{name}" in paths), None)


def _newer_named(
    checkpoint: Checkpoint,
    followed: Mapping[str, _Followed],
    naming: Mapping[str, tuple[str, ...]],
) -> str | None:
    """A tag DeepSpeed's latest names that came after this entry, or None."""
    if checkpoint.kind != "dir":
        return None
    mine = (checkpoint.first_seen, natural_key(checkpoint.name))
    for target in naming:
        other = followed.get(target)
        if other is None or other.checkpoint.gone:
            continue
        if (other.checkpoint.first_seen, natural_key(target)) > mine:
            return target
    return None


# ----- newest first --------------------------------------------------------------------
def natural_key(name: str) -> tuple[str | int, ...]:
    """A name's sort key with its numbers compared as numbers: `checkpoint-9` before
    `checkpoint-10`. Text and numbers alternate, so keys always compare."""
    return tuple(
        int(piece) if index % 2 else piece for index, piece in enumerate(re.split(r"(\d+)", name))
    )


class Dated(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def complete_at(self) -> float | None: ...


DatedT = TypeVar("DatedT", bound=Dated)


def newest_first(checkpoints: Iterable[DatedT]) -> tuple[DatedT, ...]:
    """The complete checkpoints (those with a `complete_at`), the one that became complete
    last first; on a tie, the larger name first, numbers compared as numbers."""
    dated = [checkpoint for checkpoint in checkpoints if checkpoint.complete_at is not None]
    return tuple(
        sorted(dated, key=lambda ck: (ck.complete_at, natural_key(ck.name)), reverse=True)
    )
