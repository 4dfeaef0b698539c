"""`orch checkpoints JOB --gather DEST`: one checkpoint of a job collected onto the head,
whole (for an evaluation, a conversion, a job elsewhere), from wherever its files are now.

Every node the job ran on is scanned; each file of the checkpoint (the union of every
node's part, as the record keeps it with its sha256) is read from a node that has it: in
its checkpoint directory, or in orch's copies there. Each is checked by its sha256, the next
node tried when it does not match or cannot be read. The checkpoint appears in DEST under
its own name only once whole.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.checkpoint_copies.nodes import CONNECT_TIMEOUT_S, CheckpointNodes
from orchestrator.checkpoints.model import NodeScan
from orchestrator.errors import OrchError, UsageError
from orchestrator.nodes.srun import StepError
from orchestrator.records.checkpoints import CheckpointEntry, CheckpointsRecord
from orchestrator.records.checkpoints import FileCopy as FileRecord
from orchestrator.remote.digest import sha256_of

READ_TIMEOUT_S = 3600.0  # one file of a checkpoint, over SSH or srun


@dataclass(frozen=True)
class Gathered:
    """A checkpoint collected: where it is, its files and bytes, the nodes they came from."""

    entry: str
    path: Path
    files: int
    bytes: int
    from_nodes: tuple[str, ...]


def chosen_checkpoint(record: CheckpointsRecord, name: str | None) -> CheckpointEntry:
    """The checkpoint to gather: `name`, else the newest complete one whose every file's
    sha256 the record keeps (a part copied at least once)."""
    whole = [e for e in record.checkpoints if e.complete and _hashed(e)]
    if name is not None:
        found = next((e for e in record.checkpoints if e.name == name), None)
        if found is None:
            raise UsageError(f"the job wrote no checkpoint {name!r}",
                             "see them with: orch checkpoints JOB")  # fmt: skip
        if found not in whole:
            raise UsageError(
                f"{name} cannot be gathered whole: "
                + ("it is not complete" if not found.complete else
                   "a part of it was never copied, so orch has no sha256 to check it by"),
                "gather another one (orch checkpoints JOB lists them)",
            )  # fmt: skip
        return found
    if not whole:
        raise UsageError("the job has no complete checkpoint with every part copied",
                         "see them with: orch checkpoints JOB")  # fmt: skip
    return max(whole, key=lambda e: e.complete_at or 0.0)


def _hashed(entry: CheckpointEntry) -> bool:
    files = union(entry)
    return bool(files) and all(f.sha256 for f in files.values())


def union(entry: CheckpointEntry) -> dict[str, FileRecord]:
    """Every file of the checkpoint once, as copied: the first part (in the nodes' order)
    with the path's sha256 (a node a restart staged it on has no copy of its own, and no
    hash), else the first part with the path."""
    files: dict[str, FileRecord] = {}
    for part in entry.parts:
        for copied in part.files:
            if copied.path not in files or (copied.sha256 and not files[copied.path].sha256):
                files[copied.path] = copied
    return files


def gather(nodes: CheckpointNodes, record: CheckpointsRecord, hosts: Sequence[str],
           dest: Path, name: str | None = None) -> Gathered:  # fmt: skip
    """The checkpoint (`name`, else the newest whole one) from the job's `hosts` into DEST;
    an OrchError naming the files no node could give."""
    entry = chosen_checkpoint(record, name)
    target = dest / entry.name
    if target.exists() or target.is_symlink():
        raise UsageError(f"{target} exists: nothing is written over it",
                         "give another --gather directory, or move it away")  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    scans = {n: r.value for n, r in nodes.scan(hosts).items() if r.value is not None}
    files = union(entry)
    writers: dict[str, str] = {}  # whose part each file is taken as (its copies' directory)
    for part in entry.parts:
        for copied in part.files:
            if files[copied.path] == copied:
                writers.setdefault(copied.path, part.writer)
    work = Path(tempfile.mkdtemp(prefix=".orch-gather-", dir=dest))
    try:
        used: set[str] = set()
        for path, copied in files.items():
            used.add(_fetch(nodes, scans, entry.name, writers[path], copied, work))
        os.rename(work / entry.name, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Gathered(entry.name, target, len(files), sum(f.size for f in files.values()),
                    tuple(sorted(used)))  # fmt: skip


def _fetch(nodes: CheckpointNodes, scans: Mapping[str, NodeScan], entry: str, writer: str,
           copied: FileRecord, work: Path) -> str:  # fmt: skip
    """One file read into `work` from the first node whose copy of it has its sha256: that
    node's name."""
    local = work / copied.path
    local.parent.mkdir(parents=True, exist_ok=True)
    tried = []
    for node, remote in _places(scans, entry, writer, copied):
        try:
            with nodes.transport.session(node, timeout=CONNECT_TIMEOUT_S) as session:
                session.download(remote, local, READ_TIMEOUT_S)
        except (OrchError, StepError, OSError) as err:
            tried.append(f"{node}: {err}")
            continue
        if sha256_of(local) == copied.sha256:
            return node
        tried.append(f"{node}: {remote} is not the file the job wrote (another sha256)")
    why = "; ".join(tried) or "no node answering has it"
    raise OrchError(f"{copied.path} could not be gathered: {why}",
                    "bring back a node that held it, then gather again")  # fmt: skip


def _places(scans: Mapping[str, NodeScan], entry: str, writer: str,
            copied: FileRecord) -> Iterator[tuple[str, str]]:  # fmt: skip
    """The nodes that may have the file, and where: its writer's checkpoint directory
    first, then every node's copies, then any node's checkpoint directory (a restart
    staged it there)."""
    found = [(n, s) for n, s in scans.items() if _shows(s, entry, copied)]
    for node, scan in found:
        if node == writer:
            yield node, f"{scan.dir}/{copied.path}"
    for node, scan in scans.items():
        held = scan.copy_of(entry, writer)
        if held is not None and any(f.path == copied.path and f.sha256 == copied.sha256
                                    for f in held.files):  # fmt: skip
            yield node, f"{scan.copies_dir}/{entry}/{writer}/{copied.path}"
    for node, scan in found:
        if node != writer:
            yield node, f"{scan.dir}/{copied.path}"


def _shows(scan: NodeScan, entry: str, copied: FileRecord) -> bool:
    seen = scan.entry(entry)
    return seen is not None and any(f.path == copied.path and f.size == copied.size
                                    for f in seen.files)  # fmt: skip

