"""A record of checkpoints (checkpoints.json) beside the failed job of _report_job.py, for
the page's tests: checkpoints deleted by their writer, complete ones copied to other nodes,
one still being written when the job failed, and a restart that resumed from the newest
complete one after skipping it."""

from __future__ import annotations

from _report_job import T0

from orchestrator.records.checkpoints import (
    CheckpointEntry,
    CheckpointsRecord,
    FileCopy,
    NodeRestore,
    PartRecord,
    RestoreRecord,
    save_checkpoints,
)
from orchestrator.records.rundir import RunDir

MIB = 2**20
NEWEST = "global_step8"
BEING_WRITTEN = "global_step11"
SKIPPED = f"{BEING_WRITTEN}: the part written by n2 was not copied yet"


def shards(name: str, nodes: int, holders: bool = True) -> tuple[PartRecord, ...]:
    """Every node's part of a checkpoint, each copied to the next node when `holders`."""
    return tuple(
        PartRecord(f"n{i}", (FileCopy(f"{name}/rank{i - 1}.pt", 64 * MIB, f"{i:064x}"),),
                   (f"n{i % nodes + 1}",) if holders else ())
        for i in range(1, nodes + 1)
    )  # fmt: skip


def entry(name: str, seen: float, complete: float | None, nodes: int = 2, *,
          gone: float | None = None, how: str = "deepspeed latest",
          attempt: int = 1) -> CheckpointEntry:  # fmt: skip
    done = complete if gone is None else None
    return CheckpointEntry(name, "dir", seen, done, how, 64 * MIB * nodes,
                           shards(name, nodes, holders=complete is not None and gone is None),
                           gone, attempt, completions=(complete,) if complete else ())  # fmt: skip


def checkpoints_record(nodes: int = 2) -> CheckpointsRecord:
    deleted_how = "deleted from the checkpoint directory by its writer"
    return CheckpointsRecord(
        dir="/data/ckpt", copies=1, bandwidth=200_000_000, shared=False,
        checkpoints=(
            entry("global_step2", T0 + 2.5, T0 + 3.0, nodes, gone=T0 + 9.0, how=deleted_how),
            entry("global_step5", T0 + 5.0, T0 + 5.5, nodes),
            entry(NEWEST, T0 + 8.0, T0 + 8.5, nodes),
            entry(BEING_WRITTEN, T0 + 11.0, None, nodes,
                  how="being written: n2's part changed 1 s ago"),
        ),
        restores=(RestoreRecord(
            2, NEWEST, T0 + 15.5, "the newest complete checkpoint held by the nodes alive",
            skipped=(SKIPPED,),
            nodes={f"n{i}": NodeRestore(64 * MIB if i == 1 else 0, int(i == 1), 1)
                   for i in range(1, nodes + 1)}),),
        copied_bytes=3 * 64 * MIB * nodes,
    )  # fmt: skip


def with_checkpoints(run: RunDir, record: CheckpointsRecord) -> RunDir:
    save_checkpoints(run, record)
    return run
