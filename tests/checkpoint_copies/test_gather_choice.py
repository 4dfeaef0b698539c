"""Which checkpoint `orch checkpoints JOB --gather` collects, and which copy of each file it
takes (checkpoint_copies/gather.py), on values."""

from __future__ import annotations

import pytest

from orchestrator.checkpoint_copies.gather import chosen_checkpoint, union
from orchestrator.errors import UsageError
from orchestrator.records.checkpoints import (
    CheckpointEntry,
    CheckpointsRecord,
    FileCopy,
    PartRecord,
)

SHA_A, SHA_B = "a" * 64, "b" * 64


def _entry(name: str, complete_at: float | None, *parts: PartRecord) -> CheckpointEntry:
    return CheckpointEntry(name=name, kind="file", first_seen=0.0, complete_at=complete_at,
                           how="", size=10, parts=parts, gone_at=None, attempt=1)  # fmt: skip


def _record(*entries: CheckpointEntry) -> CheckpointsRecord:
    return CheckpointsRecord(dir="/data/ckpt", copies=1, bandwidth=0, checkpoints=entries)


def test_the_newest_complete_checkpoint_with_every_file_hashed_is_gathered():
    copied = PartRecord("node1", (FileCopy("m.pt", 10, SHA_A),), ("node2",))
    never = PartRecord("node1", (FileCopy("n.pt", 10, ""),))
    record = _record(_entry("m.pt", 5.0, copied), _entry("n.pt", 9.0, never),
                     _entry("o.pt", None, copied))  # fmt: skip
    assert chosen_checkpoint(record, None).name == "m.pt"
    with pytest.raises(UsageError, match=r"n\.pt cannot be gathered whole: a part of it was never"):
        chosen_checkpoint(record, "n.pt")
    with pytest.raises(UsageError, match=r"the job wrote no checkpoint 'p\.pt'"):
        chosen_checkpoint(record, "p.pt")


def test_a_node_a_restart_staged_the_file_on_does_not_hide_the_hash_of_the_copied_part():
    staged = PartRecord("node2", (FileCopy("m.pt", 10, ""),))
    written = PartRecord("node1", (FileCopy("m.pt", 10, SHA_A),), ("node2",))
    entry = _entry("m.pt", 5.0, staged, written)
    assert union(entry) == {"m.pt": FileCopy("m.pt", 10, SHA_A)}
    assert chosen_checkpoint(_record(entry), None) == entry


def test_the_shards_of_every_node_are_gathered_together():
    shards = [PartRecord(f"node{i}", (FileCopy(f"s/shard_{i}.pt", 10, SHA_B),)) for i in (1, 2)]
    entry = _entry("s", 5.0, *shards)
    assert sorted(union(entry)) == ["s/shard_1.pt", "s/shard_2.pt"]
