"""What a restart puts back in the checkpoint directory: the newest complete checkpoint whose
every part a surviving node holds, whole (the union of every node's part), and where each
node's missing files come from.

The head records each complete checkpoint as it was copied (every part's files with their
sha256: `KnownCheckpoint`). A part is available when a surviving node holds a whole copy of
it with the same hashes, or its writer survives and still shows its files in PATH with the
same sizes (the node checks the hash when it stages them). A newer checkpoint with a part
nobody alive holds is skipped, and the reason said. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from orchestrator.checkpoints.complete import newest_first
from orchestrator.checkpoints.model import FileCopy, Kind, NodeScan

Where = Literal["dir", "copy"]  # a file in the holder's PATH, or in its copies directory


@dataclass(frozen=True)
class KnownCheckpoint:
    """A complete checkpoint as the head recorded it: each writer's part with its files'
    sha256 as copied, the parts in the job's node order; `named_by`: DeepSpeed pointer files
    at PATH's top that named it."""

    name: str
    kind: Kind
    complete_at: float
    parts: Mapping[str, tuple[FileCopy, ...]]
    named_by: tuple[str, ...] = ()
    staged_on: tuple[str, ...] = ()  # nodes a restart put it on whole, in their PATH


@dataclass(frozen=True)
class Holder:
    """An alive node that has a writer's whole part: in PATH (the writer) or as a copy."""

    node: str
    where: Where


@dataclass(frozen=True)
class StagedFile:
    """A file of the restored checkpoint: where it goes in PATH, its size and sha256, and
    whose part it is."""

    path: str
    size: int
    sha256: str
    writer: str


@dataclass(frozen=True)
class Restore:
    """The checkpoint a restart stages (`chosen`, None when none can be), its files (the
    union of every part), the pointer files to write at PATH's top (name -> content), every
    newer checkpoint skipped with why, the paths two parts disagree on, and for each writer
    the alive nodes holding its part."""

    chosen: str | None
    kind: Kind | None = None
    files: tuple[StagedFile, ...] = ()
    pointers: Mapping[str, str] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    holders: Mapping[str, tuple[Holder, ...]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(staged.size for staged in self.files)


class Fetch(NamedTuple):
    """One file a node gets from a source: its path, whether the source reads it from its
    PATH or its copies directory, and whose part it is (the copy's directory)."""

    path: str
    where: Where
    writer: str


def choose_restore(known: Sequence[KnownCheckpoint], alive: Mapping[str, NodeScan]) -> Restore:
    """The newest known checkpoint whose every part an alive node holds, or none."""
    skipped: list[str] = []
    for checkpoint in newest_first(known):
        holders = {writer: _holders(checkpoint, writer, files, alive)
                   for writer, files in checkpoint.parts.items()}  # fmt: skip
        # A part with no files (a node's empty directory) has nothing to lose.
        lost = [writer for writer, files in checkpoint.parts.items()
                if files and not holders[writer]]  # fmt: skip
        if lost:
            skipped.append(_why_skipped(checkpoint.name, lost))
            continue
        files, conflicts = _union(checkpoint)
        return Restore(
            chosen=checkpoint.name,
            kind=checkpoint.kind,
            files=files,
            pointers={pointer: checkpoint.name for pointer in checkpoint.named_by},
            skipped=tuple(skipped),
            conflicts=conflicts,
            holders=holders,
        )
    return Restore(chosen=None, skipped=tuple(skipped))


def _holders(
    checkpoint: KnownCheckpoint,
    writer: str,
    files: tuple[FileCopy, ...],
    alive: Mapping[str, NodeScan],
) -> tuple[Holder, ...]:
    """The alive nodes with the writer's whole part: the writer's PATH first, then the
    nodes a restart staged it on (their PATH), then copies."""
    found: list[Holder] = []
    for node in dict.fromkeys((writer, *checkpoint.staged_on)):
        scan = alive.get(node)
        if scan is not None and _shows(scan, checkpoint.name, files):
            found.append(Holder(node, "dir"))
    wanted = set(files)
    for node, scan in alive.items():
        held = scan.copy_of(checkpoint.name, writer)
        if held is not None and set(held.files) == wanted:
            found.append(Holder(node, "copy"))
    return tuple(found)


def _shows(scan: NodeScan, name: str, files: tuple[FileCopy, ...]) -> bool:
    """Whether the node's PATH has every file of the part with its recorded size."""
    entry = scan.entry(name)
    if entry is None:
        return False
    sizes = {seen.path: seen.size for seen in entry.files}
    return all(sizes.get(copied.path) == copied.size for copied in files)


def _why_skipped(name: str, lost: Sequence[str]) -> str:
    if len(lost) == 1:
        return f"{name}: the part written by {lost[0]} is held by no node alive"
    return f"{name}: the parts written by {', '.join(lost)} are held by no node alive"


def _union(checkpoint: KnownCheckpoint) -> tuple[tuple[StagedFile, ...], tuple[str, ...]]:
    """Every part's files once; a path two parts hold with different content comes from the
    writer first in node order, and the disagreement is said."""
    chosen: dict[str, StagedFile] = {}
    conflicts: list[str] = []
    for writer, files in checkpoint.parts.items():
        for copied in files:
            first = chosen.get(copied.path)
            if first is None:
                chosen[copied.path] = StagedFile(copied.path, copied.size, copied.sha256, writer)
            elif (first.size, first.sha256) != (copied.size, copied.sha256):
                conflicts.append(f"{copied.path} differs between {first.writer} and {writer}: "
                                 f"{first.writer}'s is staged")  # fmt: skip
    return tuple(sorted(chosen.values(), key=lambda staged: staged.path)), tuple(conflicts)


def sources(
    restore: Restore, missing: Mapping[str, Sequence[str]], alive: Mapping[str, NodeScan]
) -> dict[str, dict[str, tuple[Fetch, ...]]]:
    """For each node's missing files (paths of the restore's files it does not have with
    the right hash): dest -> source node -> what it fetches there. The source is an alive
    node other than the dest holding the file's part, the one given the fewest bytes so
    far (largest files placed first); the dest itself only when no other node holds it.
    ValueError names the node and path when a path is not the restore's or nobody holds it."""
    by_path = {staged.path: staged for staged in restore.files}
    wanted = [(dest, path) for dest, paths in missing.items() for path in dict.fromkeys(paths)]
    for dest, path in wanted:
        if path not in by_path:
            raise ValueError(f"{dest} misses {path}, which is not a file of {restore.chosen}")
    wanted.sort(key=lambda item: -by_path[item[1]].size)
    load: dict[str, int] = {}
    plan: dict[str, dict[str, list[Fetch]]] = {dest: {} for dest in missing}
    for dest, path in wanted:
        staged = by_path[path]
        holder = _least_loaded(_candidates(restore, staged, dest, alive), load)
        if holder is None:
            raise ValueError(f"no node alive holds {path} (written by {staged.writer}) for {dest}")
        load[holder.node] = load.get(holder.node, 0) + staged.size
        plan[dest].setdefault(holder.node, []).append(Fetch(path, holder.where, staged.writer))
    return {
        dest: {source: tuple(sorted(fetches)) for source, fetches in by_source.items()}
        for dest, by_source in plan.items()
    }


def _candidates(
    restore: Restore, staged: StagedFile, dest: str, alive: Mapping[str, NodeScan]
) -> list[Holder]:
    holders = [holder for holder in restore.holders.get(staged.writer, ()) if holder.node in alive]
    others = [holder for holder in holders if holder.node != dest]
    return others or holders  # its own copies directory when it alone holds the part


def _least_loaded(candidates: Sequence[Holder], load: Mapping[str, int]) -> Holder | None:
    """The holder given the fewest bytes so far (the first listed on a tie), or None."""
    if not candidates:
        return None
    return min(candidates, key=lambda holder: load.get(holder.node, 0))
