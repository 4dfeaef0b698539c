"""A job's checkpoints across its attempts (`--checkpoint-dir`): checked before the first,
followed while each runs, put back before each restart.

Before the first attempt every node's PATH is made and checked, and a marker one node
writes there tells whether the others see it: a shared filesystem is left alone. Otherwise,
while an attempt runs, a thread scans every node every SCAN_EVERY_S, judges which entries
are complete (checkpoints/complete.py), copies each complete part to the nodes placement
picks (node to node, at the cap) and prunes the copies of what the writer deleted. What it
knows goes into runs/<job>/checkpoints.json after each round. Before a restart, the nodes of
the next attempt get the newest checkpoint complete among the surviving nodes, whole.

Nothing here ends a job: a node that does not answer, a copy that fails or a staging that
fails is written down and said; the job goes on (or starts from scratch, said why).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

from orchestrator.checkpoint_copies.nodes import (
    FREE_MARGIN_BYTES,
    CheckpointNodes,
    Copied,
    Senders,
    Staged,
)
from orchestrator.checkpoints.complete import (
    AT_THE_END,
    Checkpoint,
    Watched,
    at_the_end,
    is_checkpoint_name,
    observe,
    without_lost_parts,
)
from orchestrator.checkpoints.model import FileCopy, NodeScan, part_size, signature
from orchestrator.checkpoints.placement import copy_orders, prune_orders
from orchestrator.checkpoints.resumed import NO_COPY_YET
from orchestrator.checkpoints.staging import KnownCheckpoint, Restore, choose_restore, sources
from orchestrator.errors import PreflightFailed
from orchestrator.pernode import NodeResult, for_each_node, succeeded
from orchestrator.records.checkpoints import (
    CheckpointEntry,
    CheckpointsRecord,
    NodeRestore,
    PartRecord,
    RestoreRecord,
    save_checkpoints,
)
from orchestrator.records.checkpoints import FileCopy as FileRecord
from orchestrator.records.rundir import RunDir
from orchestrator.specs.units import format_bytes

SCAN_EVERY_S = 5.0  # between two scans of every node while the job runs
# An entry with no marker and not renamed into place: unchanged this long on every node is
# complete. A writer that pauses longer in the middle of a file is taken for done; its copy
# is replaced when the file changes again.
SETTLE_S = 15.0
SHARED_MARKER = ".orch-shared-check"

Say = Callable[[str], None]


class CheckpointKeeper:
    """What orch knows of the job's checkpoints; one per job, used by every attempt."""

    def __init__(self, nodes: CheckpointNodes, run: RunDir, say: Say) -> None:
        self.nodes, self.run, self.say = nodes, run, say
        settings = nodes.settings
        self.record = CheckpointsRecord(dir=settings.dir, copies=settings.copies,
                                        bandwidth=settings.bandwidth, shared=None,
                                        checkpoints=(), restores=())  # fmt: skip
        self.watched = Watched()
        self.known: dict[str, KnownCheckpoint] = {}  # complete, with every part's hashes
        self.first_seen_attempt: dict[str, int] = {}
        self.restored: dict[str, dict[str, object] | None] = {}  # entry -> parts as staged
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.holding: dict[tuple[str, str], set[str]] = {}  # (entry, writer) -> copy holders
        self.before: set[str] = set()  # entries in PATH before the job: never set aside
        # Each time each entry was found complete: the watch knows only the latest, and
        # forgets it once the writer deletes the entry or writes it again; the job's page
        # marks every save.
        self.completions: dict[str, list[float]] = {}

    # -- before the first attempt -------------------------------------------------------
    def check(self, hosts: Sequence[str]) -> bool:
        """PATH made and usable on every node (else PreflightFailed naming the node and the
        fix); whether the nodes share it (then nothing more is done)."""
        scans = self.nodes.scan(hosts, create=True)
        self.before = {entry.name for r in scans.values() if r.value is not None
                       for entry in r.value.entries}  # fmt: skip
        largest = max((part_size(entry.files) for r in scans.values() if r.value is not None
                       for entry in r.value.entries), default=0)  # fmt: skip
        problems = [directory_problem(node, result, largest) for node, result in scans.items()]
        bad = [p for p in problems if p is not None]
        if bad:
            raise PreflightFailed(
                "the checkpoint directory cannot be used: " + "; ".join(bad),
                f"make {self.nodes.settings.dir} a directory of your own, writable, on every "
                "node (or give another --checkpoint-dir)",
            )
        shared = self._shared(hosts)
        self.record = replace(self.record, shared=shared)
        if shared:
            self.say(f"checkpoints: every node sees {self.nodes.settings.dir} (a shared "
                     "filesystem): nothing is copied")  # fmt: skip
        return shared

    def _shared(self, hosts: Sequence[str]) -> bool:
        if len(hosts) < 2:
            return True  # one node: nothing to copy to
        first, rest = hosts[0], hosts[1:]
        self.nodes.scan([first], write_marker=SHARED_MARKER)
        try:
            seen = self.nodes.scan(rest, marker=SHARED_MARKER)
        finally:
            self.nodes.scan([first], remove_marker=SHARED_MARKER)
        return all(r.value is not None and r.value.marker_seen for r in seen.values())

    @property
    def shared(self) -> bool:
        return bool(self.record.shared)

    # -- while an attempt runs ----------------------------------------------------------
    @contextmanager
    def following(self, hosts: Sequence[str], attempt: int) -> Iterator[None]:
        """Scans, copies and prunes in the background while the attempt runs."""
        if self.shared:
            try:
                yield
            finally:
                self._save()
            return
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(SCAN_EVERY_S):
                try:
                    self.round(hosts, attempt, stop)
                except OSError as err:  # the head's own disk: said, and tried again
                    self._warn_once(f"the record could not be written: {err}")

        thread = threading.Thread(target=loop, name="checkpoint-copies", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=30.0)  # a copy in flight is cut off with its connection
            self.nodes.close()

    def round(self, hosts: Sequence[str], attempt: int,
              stop: threading.Event | None = None) -> None:  # fmt: skip
        """One scan of every node, the copies it calls for, the prunes; then the record."""
        scans = _answered(self.nodes.scan(hosts))
        now = time.time()
        with self._lock:
            before = self.watched.checkpoints
            self.watched = observe(self.watched, scans, now, SETTLE_S)
            for name, checkpoint in self.watched.checkpoints.items():
                earlier = before.get(name)
                if earlier is None or (earlier.gone and not checkpoint.gone):
                    self.first_seen_attempt[name] = attempt  # new, or a name written again
            complete = [c for c in self.watched.complete() if not self._as_restored(c)]
        plan = copy_orders(complete, scans, hosts, self.nodes.settings.copies)
        for shortfall in plan.shortfalls:
            self._warn_once(shortfall.message)
        for order in plan.orders:
            if stop is not None and stop.is_set():
                break
            self._copied(self.nodes.copy(order))
        self._learn_hashes(scans)
        holding: dict[tuple[str, str], set[str]] = {}
        for node, scan in scans.items():
            for held in scan.copies:
                holding.setdefault((held.entry, held.writer), set()).add(node)
        self.holding = holding
        for node, keep in prune_orders(list(self.watched.checkpoints.values()), scans).items():
            self.nodes.prune(node, keep)
        self._save()

    def _as_restored(self, checkpoint: Checkpoint) -> bool:
        """A checkpoint a restart staged on every node, unchanged since: not copied again
        (every node holds it whole)."""
        if checkpoint.name not in self.restored:
            return False
        parts = {node: signature(files) for node, files in checkpoint.parts.items()}
        staged = self.restored[checkpoint.name]
        if staged is None:  # the first look since the staging
            self.restored[checkpoint.name] = dict(parts)
            return True
        return parts == staged

    def _copied(self, copied: Copied) -> None:
        order = copied.order
        if copied.problem is not None or copied.sha256 is None:
            self._warn_once(f"{order.entry}: the part written by {order.writer} was not "
                            f"copied to {order.destination}: {copied.problem}")  # fmt: skip
            return
        files = tuple(FileCopy(f.path, f.size, copied.sha256.get(f.path, ""))
                      for f in order.files)  # fmt: skip
        with self._lock:
            self.record = replace(self.record, copied_bytes=self.record.copied_bytes + copied.bytes)
        self._know(order.entry, order.writer, files)

    def _learn_hashes(self, scans: Mapping[str, NodeScan]) -> None:
        """Hashes of parts copied in an earlier attempt (or by a copy this head did not see
        end), from the manifests the nodes holding them keep."""
        for scan in scans.values():
            for held in scan.copies:
                checkpoint = self.watched.checkpoints.get(held.entry)
                if checkpoint is not None and checkpoint.complete:
                    self._know(held.entry, held.writer, held.files, only_new=True)

    def _know(self, entry: str, writer: str, files: tuple[FileCopy, ...],
              only_new: bool = False) -> None:  # fmt: skip
        with self._lock:
            checkpoint = self.watched.checkpoints.get(entry)
            known = self.known.get(entry)
            if only_new and known is not None and writer in known.parts:
                return
            parts = dict(known.parts) if known is not None else {}
            parts[writer] = files
            if checkpoint is None or checkpoint.complete_at is None:
                return
            self.known[entry] = KnownCheckpoint(entry, checkpoint.kind, checkpoint.complete_at,
                                                parts, checkpoint.named_by)  # fmt: skip

    # -- before a restart ---------------------------------------------------------------
    def restore(self, alive: Sequence[str], following: Sequence[str], attempt: int) -> str:
        """The newest checkpoint complete among `alive` nodes staged whole on every node of
        `following`; one line for the user saying what the restart resumes from."""
        if self.shared:
            return ""
        with self._lock:
            self.watched = without_lost_parts(self.watched, alive)
        scans = _answered(self.nodes.scan(list(dict.fromkeys([*alive, *following])),
                                          create=True))  # fmt: skip
        alive_scans = {n: s for n, s in scans.items() if n in alive}
        restore = choose_restore(list(self._restorable()), alive_scans)
        restore = replace(restore, skipped=(*self._never_copied(restore.chosen),
                                            *restore.skipped))  # fmt: skip
        if restore.chosen is None:
            why = "; ".join(restore.skipped) or NO_COPY_YET
            done = RestoreRecord(attempt, None, time.time(), f"from scratch: {why}",
                                 restore.skipped)  # fmt: skip
            self._restored(done)
            return f"checkpoints: {done.sentence}"
        staged = self._stage(restore, following, scans, self._newer(restore.chosen, scans))
        failed = {s.node: s.problem for s in staged if s.problem is not None}
        aside = tuple(sorted({name for s in staged for name in s.set_aside}))
        why = ("the newest complete checkpoint held by the nodes alive"
               + (f"; skipped {'; '.join(restore.skipped)}" if restore.skipped else ""))
        nodes = {s.node: NodeRestore(s.received_bytes, s.received_files, s.reused_files)
                 for s in staged if s.problem is None}  # fmt: skip
        done = RestoreRecord(attempt, restore.chosen, time.time(), why, restore.skipped, nodes,
                             failed, aside)  # fmt: skip
        self._restored(done)
        if not failed:
            self.restored[restore.chosen] = None
        with self._lock:
            known = self.known[restore.chosen]
            self.known[restore.chosen] = replace(known, staged_on=tuple(nodes))
        return f"checkpoints: {done.sentence}"

    def _stage(self, restore: Restore, following: Sequence[str],
               scans: Mapping[str, NodeScan], aside: Sequence[str]) -> list[Staged]:  # fmt: skip
        """Each next node staged: it says what it lacks, the holders send that."""
        def senders(node: str) -> Senders:
            return lambda missing: sources(restore, {node: missing}, scans).get(node, {})

        found = for_each_node(following, lambda node: succeeded(
            node, self.nodes.stage(node, restore, senders(node), aside)))  # fmt: skip
        return [r.value for r in found if r.value is not None]

    def _newer(self, chosen: str | None, scans: Mapping[str, NodeScan]) -> list[str]:
        """Entries the job wrote after `chosen` that a node has in PATH: a script that loads
        the newest entry would take one of them, not whole on that node."""
        mine = self.watched.checkpoints.get(chosen or "")
        since = mine.first_seen if mine is not None else 0.0
        names = {entry.name for scan in scans.values() for entry in scan.entries}
        newer = []
        for name in sorted(names - self.before - {chosen or ""}):
            seen = self.watched.checkpoints.get(name)
            if is_checkpoint_name(name) and (seen is None or seen.first_seen > since):
                newer.append(name)
        return newer

    def _never_copied(self, chosen: str | None) -> list[str]:
        """Complete checkpoints newer than `chosen` a part of which was never copied: why
        each is not the one restored."""
        mine = self.watched.checkpoints.get(chosen or "")
        reasons = []
        for checkpoint in self.watched.complete():
            if mine is not None and checkpoint.first_seen <= mine.first_seen:
                continue
            known = self.known.get(checkpoint.name)
            uncopied = [w for w in checkpoint.parts if known is None or w not in known.parts]
            if uncopied and checkpoint.name != chosen:
                reasons.append(f"{checkpoint.name}: the part written by "
                               f"{', '.join(uncopied)} was not copied yet")  # fmt: skip
        return reasons

    def _restorable(self) -> Iterator[KnownCheckpoint]:
        """Known complete checkpoints with a hash for every part a node wrote of them."""
        for name, known in self.known.items():
            checkpoint = self.watched.checkpoints.get(name)
            writers = set(checkpoint.parts) if checkpoint is not None else set(known.parts)
            if writers <= set(known.parts) | set(known.staged_on):
                yield known

    # -- after the job ------------------------------------------------------------------
    def finish(self, hosts: Sequence[str]) -> str:
        """The job succeeded: its copies on other nodes are removed from every node (each
        checkpoint stays where the job wrote it)."""
        if self.shared:
            return ""
        self._last_look(hosts)
        found = for_each_node(
            hosts, lambda node: succeeded(node, self.nodes.prune(node, None, drop=True)))
        self.nodes.close()
        removed = [r.node for r in found if r.value]
        return (f"checkpoints: the job succeeded; orch's copies were removed from "
                f"{len(removed)} of {len(hosts)} nodes (every checkpoint stays in "
                f"{self.nodes.settings.dir} where the job wrote it)")

    def _last_look(self, hosts: Sequence[str]) -> None:
        """The checkpoints as the job left them: complete, and the sha256 of those no
        copy was made of (the last, written just before the end), read where they are, so
        `orch checkpoints --gather` can check them."""
        scans = _answered(self.nodes.scan(hosts))
        now = time.time()
        with self._lock:
            self.watched = at_the_end(observe(self.watched, scans, now, SETTLE_S), now)
            ended = [c.name for c in self.watched.checkpoints.values() if c.how == AT_THE_END]
        if ended:
            for node, scan in _answered(self.nodes.scan(hosts, hash=ended)).items():
                for entry in scan.entries:
                    if entry.name in ended and all(f.sha256 for f in entry.files):
                        files = tuple(FileCopy(f.path, f.size, f.sha256) for f in entry.files)
                        self._know(entry.name, node, files)
        self._save()

    # -- the record ---------------------------------------------------------------------
    def _restored(self, done: RestoreRecord) -> None:
        with self._lock:
            self.record = replace(self.record, restores=(*self.record.restores, done))
        self._save()

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            self.say(f"checkpoints: {message}")

    def _save(self) -> None:
        """The record into the job's directory; not yet there before the first attempt has
        made it (the next round writes it)."""
        with self._lock:
            for checkpoint in self.watched.checkpoints.values():
                self._note_completion(checkpoint)
            entries = tuple(self._entry(c) for c in self.watched.checkpoints.values())
            self.record = replace(self.record, checkpoints=entries)
            with contextlib.suppress(FileNotFoundError):
                save_checkpoints(self.run, self.record)

    def _entry(self, checkpoint: Checkpoint) -> CheckpointEntry:
        known = self.known.get(checkpoint.name)
        holders = self.holding
        parts = []
        for writer, files in checkpoint.parts.items():
            hashed = {f.path: f.sha256 for f in known.parts.get(writer, ())} if known else {}
            parts.append(PartRecord(
                writer, tuple(FileRecord(f.path, f.size, hashed.get(f.path, "")) for f in files),
                tuple(sorted(holders.get((checkpoint.name, writer), ())))))  # fmt: skip
        return CheckpointEntry(
            name=checkpoint.name, kind=checkpoint.kind, first_seen=checkpoint.first_seen,
            complete_at=checkpoint.complete_at, how=checkpoint.how, size=checkpoint.size,
            parts=tuple(parts), gone_at=checkpoint.changed_at if checkpoint.gone else None,
            attempt=self.first_seen_attempt.get(checkpoint.name, 1),
            completions=self._completions(checkpoint),
        )  # fmt: skip

    def _note_completion(self, checkpoint: Checkpoint) -> None:
        """A new time the entry became complete, unless it is the copy a restart staged
        settling on its nodes: that is no save of the job's."""
        seen = self.completions.setdefault(checkpoint.name, [])
        if checkpoint.complete_at is None or checkpoint.complete_at in seen[-1:]:
            return
        if checkpoint.name in self.restored and self._as_restored(checkpoint):
            return
        seen.append(checkpoint.complete_at)

    def _completions(self, checkpoint: Checkpoint) -> tuple[float, ...]:
        """When the entry became complete, each time; a time from before it was first seen
        is an earlier entry's of the same name (deleted, then written anew): not this one's."""
        return tuple(t for t in self.completions.get(checkpoint.name, ())
                     if t >= checkpoint.first_seen)  # fmt: skip


def _answered(found: Mapping[str, NodeResult[NodeScan]]) -> dict[str, NodeScan]:
    return {node: r.value for node, r in found.items() if r.value is not None}


def directory_problem(node: str, result: NodeResult[NodeScan], largest: int) -> str | None:
    """What keeps the node's PATH or copies from being used, or None. `largest`: the biggest
    part of a checkpoint already in PATH on any node, which a copy must have room for."""
    if result.value is None:
        problem = result.problem or "no answer"
        return problem if node in problem else f"{node}: {problem}"
    scan = result.value
    if scan.problem:
        return f"{node}: {scan.problem}"
    if not scan.is_dir or not scan.writable:
        return f"{node}: {scan.dir} is not a directory the job can write to"
    needed = largest + FREE_MARGIN_BYTES
    if scan.copies_free_bytes is not None and scan.copies_free_bytes < needed:
        return (f"{node}: {scan.copies_dir} has {format_bytes(scan.copies_free_bytes)} free, "
                f"less than a copy of the largest checkpoint part there now "
                f"({format_bytes(largest)}) and {format_bytes(FREE_MARGIN_BYTES)} to spare "
                "(set ORCH_NODE_ROOT to a directory on a larger disk)")
    return None
