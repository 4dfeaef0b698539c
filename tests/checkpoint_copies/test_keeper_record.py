"""What the keeper writes into checkpoints.json as the watch goes on, without reaching a
node (the scans come in as values): a checkpoint keeps when it became complete after its
writer deletes it, for the job's page to place it; a name written again is a new one."""

from __future__ import annotations

from pathlib import Path

from _checkpoint_scans import PATH, dir_entry, file_entry, pointer, scan, scans

from orchestrator.checkpoint_copies.keeper import SETTLE_S, CheckpointKeeper
from orchestrator.checkpoint_copies.nodes import CheckpointNodes
from orchestrator.checkpoints.complete import observe
from orchestrator.checkpoints.model import NodeScan
from orchestrator.nodes.transport import SshTransport
from orchestrator.records.checkpoints import CheckpointEntry, load_checkpoints
from orchestrator.records.rundir import RunDir
from orchestrator.specs.checkpoints import CheckpointSettings

NODES = ("n1", "n2")


def _written(*steps: int) -> dict[str, NodeScan]:
    """DeepSpeed's tags on both nodes, `latest` naming the last."""
    return scans(*(scan(node, *(dir_entry(f"global_step{s}", {f"rank{i}.pt": 10})
                                for s in steps),
                        *([pointer(f"global_step{steps[-1]}")] if steps and i == 0 else []))
                   for i, node in enumerate(NODES)))  # fmt: skip


def _keeper(tmp_path: Path) -> CheckpointKeeper:
    run = RunDir(tmp_path / "job-1").create()
    nodes = CheckpointNodes(SshTransport(), "python3", "job-1", CheckpointSettings(PATH))
    return CheckpointKeeper(nodes, run, lambda line: None)


def _after(keeper: CheckpointKeeper, *rounds: tuple[float, dict[str, NodeScan]]) -> dict[
        str, CheckpointEntry]:  # fmt: skip
    """The record's entries after each round of scans was watched and the record saved."""
    for now, found in rounds:
        keeper.watched = observe(keeper.watched, found, now, SETTLE_S)
        keeper._save()
    record = load_checkpoints(keeper.run)
    assert record is not None
    return {entry.name: entry for entry in record.checkpoints}


def test_a_checkpoint_deleted_by_its_writer_keeps_when_it_became_complete(tmp_path: Path):
    keeper = _keeper(tmp_path)
    entries = _after(keeper, (100.0, _written(1)), (105.0, _written(1)),
                     (110.0, _written(1, 2)), (115.0, _written(2)))  # fmt: skip
    deleted, kept = entries["global_step1"], entries["global_step2"]
    assert (deleted.complete_at, deleted.gone_at) == (None, 115.0)
    assert deleted.completions == (100.0,) and deleted.became_complete == 100.0
    assert (kept.complete_at, kept.completions) == (110.0, (110.0,))


def test_a_name_written_again_is_not_placed_by_the_deleted_ones_time(tmp_path: Path):
    keeper = _keeper(tmp_path)
    entries = _after(keeper, (100.0, _written(1)), (105.0, _written(1)), (110.0, _written()),
                     (120.0, scans(*(scan(node, dir_entry("global_step1", {"x": 1}))
                                     for node in NODES))))  # fmt: skip
    again = entries["global_step1"]
    assert (again.first_seen, again.complete_at, again.completions) == (120.0, None, ())


def test_a_name_saved_again_and_again_keeps_each_time_it_became_complete(tmp_path: Path):
    """`last.pt` written in place at each save: complete once quiet, changed, complete
    again; each save's time stays, the last one's too while it is written again."""
    keeper = _keeper(tmp_path)

    def saved(size: int) -> dict[str, NodeScan]:
        return scans(scan("n1", file_entry("last.pt", size, mtime=size)), scan("n2"))

    entries = _after(keeper, (100.0, saved(1)), (105.0, saved(1)), (125.0, saved(1)),
                     (130.0, saved(2)), (135.0, saved(2)), (155.0, saved(2)),
                     (160.0, saved(3)))  # fmt: skip
    last = entries["last.pt"]
    assert last.complete_at is None and len(last.completions) == 2
    assert last.completions[0] < 130.0 <= last.completions[1] < 160.0


def test_the_copy_a_restart_staged_settling_is_no_save(tmp_path: Path):
    """After a restart staged last.pt on every node, the watch finds it complete again once
    quiet there: that is the staged copy, not a save of the job's; the job's next save is."""
    keeper = _keeper(tmp_path)

    def on(nodes: tuple[str, ...], size: int) -> dict[str, NodeScan]:
        return scans(*(scan(node, file_entry("last.pt", size, mtime=size)) for node in nodes))

    _after(keeper, (100.0, on(("n1",), 1)), (105.0, on(("n1",), 1)), (125.0, on(("n1",), 1)))
    keeper.restored["last.pt"] = None  # as restore() leaves it once staged on every node
    staged = _after(keeper, (200.0, on(NODES, 1)), (205.0, on(NODES, 1)),
                    (225.0, on(NODES, 1)))["last.pt"]  # fmt: skip
    assert staged.complete_at is not None and len(staged.completions) == 1
    saved = _after(keeper, (300.0, on(NODES, 2)), (305.0, on(NODES, 2)),
                   (325.0, on(NODES, 2)))["last.pt"]  # fmt: skip
    assert len(saved.completions) == 2 and saved.completions[1] >= 300.0
