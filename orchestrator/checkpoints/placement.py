"""Where the copies of complete checkpoints go, and which copies are removed.

Each node's part of a complete checkpoint is copied to `copies` other nodes, picked in ring
order after its writer among the job's nodes (so every node's parts spread to its next
neighbours, the same ones every time), passing over a node that did not answer or whose
copies directory lacks the room, and counting a node that already holds a whole copy of the
part as it is now. A copy of an older version of the part is stale: the node gets the part
again. What cannot be placed is said, for the caller to warn about. Copies of a checkpoint
its writer deleted are removed everywhere. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.checkpoints.complete import Checkpoint, newest_first
from orchestrator.checkpoints.model import FileSeen, NodeScan, part_size, shape
from orchestrator.specs.units import format_bytes

# Room a copy leaves free on its node's filesystem: a copy must not fill the disk the
# node's own job (or the next checkpoint) writes to.
SPACE_MARGIN_BYTES = 1 << 30


@dataclass(frozen=True)
class CopyOrder:
    """Copy `writer`'s part of `entry` (its files in PATH on the writer, the source) into
    orch's copies directory on `destination`; `replaces_stale`: the destination holds a
    copy of an older version of the part, which this one replaces."""

    entry: str
    writer: str
    files: tuple[FileSeen, ...]
    source: str
    destination: str
    replaces_stale: bool = False

    @property
    def size(self) -> int:
        return part_size(self.files)


@dataclass(frozen=True)
class Shortfall:
    """A part with fewer copies than asked for, and why each other node could not take one."""

    entry: str
    writer: str
    wanted: int
    placed: int  # nodes holding a copy already, plus those ordered now
    reasons: tuple[str, ...]

    @property
    def message(self) -> str:
        why = "; ".join(self.reasons)
        return (
            f"{self.entry}: the part written by {self.writer} has {self.placed} of "
            f"{self.wanted} copies ({why})"
        )


@dataclass(frozen=True)
class CopyPlan:
    """The copies to make this round, newest checkpoint first, and the parts short of copies."""

    orders: tuple[CopyOrder, ...]
    shortfalls: tuple[Shortfall, ...]


def ring_after(writer: str, nodes: Sequence[str]) -> tuple[str, ...]:
    """The job's other nodes in ring order after `writer` (all of them, in order, when the
    writer is not one of them)."""
    if writer not in nodes:
        return tuple(nodes)
    start = nodes.index(writer) + 1
    return tuple(node for node in (*nodes[start:], *nodes[:start]) if node != writer)


def copy_orders(
    checkpoints: Iterable[Checkpoint],
    scans: Mapping[str, NodeScan],
    nodes: Sequence[str],
    copies: int,
    margin_bytes: int = SPACE_MARGIN_BYTES,
) -> CopyPlan:
    """The copies every complete checkpoint's parts still need, given this round's scans.
    A part whose writer did not answer waits for a round where it does (its files are read
    there). Room taken by an earlier order of the same plan counts."""
    orders: list[CopyOrder] = []
    shortfalls: list[Shortfall] = []
    taken: dict[str, int] = {}  # bytes ordered to each node so far
    live = [ck for ck in newest_first(checkpoints) if ck.complete and not ck.gone]
    for checkpoint in live:
        for writer, files in checkpoint.parts.items():
            if writer not in scans or not files or copies <= 0:
                continue
            placed, shortfall = _place(checkpoint.name, writer, files, scans, nodes, copies,
                                       taken, margin_bytes)  # fmt: skip
            orders += placed
            if shortfall is not None:
                shortfalls.append(shortfall)
    return CopyPlan(tuple(orders), tuple(shortfalls))


def _place(
    entry: str,
    writer: str,
    files: tuple[FileSeen, ...],
    scans: Mapping[str, NodeScan],
    nodes: Sequence[str],
    copies: int,
    taken: dict[str, int],
    margin_bytes: int,
) -> tuple[list[CopyOrder], Shortfall | None]:
    ring = ring_after(writer, nodes)
    holders = [node for node in ring if _holds(scans.get(node), entry, writer, files)]
    need = copies - len(holders)
    size = part_size(files)
    orders: list[CopyOrder] = []
    reasons: list[str] = []
    for node in ring:
        if need <= 0:
            break
        if node in holders:
            continue
        scan = scans.get(node)
        why = _cannot_take(node, scan, size + margin_bytes + taken.get(node, 0), margin_bytes)
        if why is not None:
            reasons.append(why)
            continue
        stale = scan is not None and scan.copy_of(entry, writer) is not None
        orders.append(CopyOrder(entry, writer, files, writer, node, replaces_stale=stale))
        taken[node] = taken.get(node, 0) + size
        need -= 1
    if need <= 0:
        return orders, None
    if len(ring) < copies:
        reasons.append(f"the job has {len(ring)} other node" + ("" if len(ring) == 1 else "s"))
    return orders, Shortfall(entry, writer, copies, copies - need, tuple(reasons))


def _holds(scan: NodeScan | None, entry: str, writer: str, files: tuple[FileSeen, ...]) -> bool:
    """Whether the node holds a whole copy of the part as it is now (paths and sizes)."""
    held = scan.copy_of(entry, writer) if scan is not None else None
    return held is not None and shape(held.files) == shape(files)


def _cannot_take(node: str, scan: NodeScan | None, needed: int, margin_bytes: int) -> str | None:
    """Why `node` cannot take a copy needing `needed` bytes free (the margin included)."""
    if scan is None:
        return f"{node} did not answer"
    if scan.copies_free_bytes is None:
        return f"{node} has no usable copies directory ({scan.copies_dir})"
    if scan.copies_free_bytes < needed:
        return (
            f"{node} has {format_bytes(scan.copies_free_bytes)} free in {scan.copies_dir}, "
            f"needs {format_bytes(needed)} (a {format_bytes(margin_bytes)} margin included)"
        )
    return None


def prune_orders(
    checkpoints: Iterable[Checkpoint], scans: Mapping[str, NodeScan]
) -> dict[str, tuple[str, ...]]:
    """For each node holding a copy of a checkpoint its writer deleted: the entries whose
    copies it keeps (every other it holds). Nodes with nothing to remove are left out."""
    gone = {checkpoint.name for checkpoint in checkpoints if checkpoint.gone}
    keep: dict[str, tuple[str, ...]] = {}
    for node, scan in scans.items():
        held = dict.fromkeys(held.entry for held in scan.copies)
        if any(entry in gone for entry in held):
            keep[node] = tuple(entry for entry in held if entry not in gone)
    return keep
