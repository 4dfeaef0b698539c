"""What keeps a node's checkpoint directory or its copies' disk from being used, said before
the job starts (checkpoint_copies/keeper.py), on values."""

from __future__ import annotations

from orchestrator.checkpoint_copies.keeper import directory_problem
from orchestrator.checkpoints.model import NodeScan
from orchestrator.pernode import failed, succeeded


def _scan(**facts: object) -> NodeScan:
    doc = {"ok": True, "node": "node2", "dir": "/data/ckpt", "exists": True, "is_dir": True,
           "writable": True, "problem": None, "free_bytes": 10 << 30,
           "copies_dir": "/tmp/orch-1000/checkpoints/job", "copies_free_bytes": 10 << 30,
           "marker_seen": None, "truncated": False, "entries": [], "copies": [], **facts}
    return NodeScan.from_dict(doc)


def test_a_usable_directory_with_room_for_copies_passes():
    assert directory_problem("node2", succeeded("node2", _scan()), largest=1 << 30) is None


def test_too_little_room_for_a_copy_is_refused_with_the_numbers_and_the_fix():
    said = directory_problem("node2", succeeded("node2", _scan(copies_free_bytes=1 << 30)),
                    largest=3 << 30)  # fmt: skip
    assert said is not None
    assert said.startswith("node2: /tmp/orch-1000/checkpoints/job has 1.0 GiB free")
    assert "largest checkpoint part there now (3.0 GiB)" in said and "ORCH_NODE_ROOT" in said


def test_a_directory_the_job_cannot_write_and_a_node_that_does_not_answer_are_named():
    unwritable = directory_problem("node2", succeeded("node2", _scan(writable=False)), largest=0)
    assert unwritable == "node2: /data/ckpt is not a directory the job can write to"
    silent = directory_problem("node3", failed("node3", "node3: connection refused"), largest=0)
    assert silent == "node3: connection refused"
    link = directory_problem("node2", succeeded("node2", _scan(problem="/data/ckpt is a link")), 0)
    assert link == "node2: /data/ckpt is a link"
