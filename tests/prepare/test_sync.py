"""`--sync`: which files go, and copying them to real sandbox nodes, over SFTP or, where
the node's sshd has none, as a tar stream."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from orchestrator.prepare.sync import files_to_sync, sync_workdir


def _tree(root):
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "train.py").write_text("print('hi')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "outputs").mkdir()
    (root / "outputs" / "ckpt.bin").write_text("big")
    (root / "model.ckpt").write_text("big")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    (root / ".gitignore").write_text("# build output\noutputs/\n*.ckpt\n!keep.ckpt\n/run.log\n")
    (root / "run.log").write_text("log")
    (root / "src" / "run.log").write_text("kept: the pattern is anchored")


def test_gitignore_rules_decide_what_goes(tmp_path):
    _tree(tmp_path)
    (tmp_path / "keep.ckpt").write_text("re-included by the negation")
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir()
    (tmp_path / "src" / "pkg" / "__pycache__" / "train.cpython-311.pyc").write_text("x")
    assert files_to_sync(tmp_path) == [
        ".gitignore", "keep.ckpt", "run.sh", "src/pkg/train.py", "src/run.log",
    ]  # fmt: skip


def test_a_nested_gitignore_applies_below_its_own_directory(tmp_path):
    _tree(tmp_path)
    (tmp_path / "src" / ".gitignore").write_text("*.log\n!train.py\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.log").write_text("kept: src/.gitignore does not reach here")
    assert files_to_sync(tmp_path) == [
        ".gitignore", "data/a.log", "run.sh", "src/.gitignore", "src/pkg/train.py",
    ]  # fmt: skip


def test_a_file_is_not_mistaken_for_an_ignored_directory(tmp_path):
    (tmp_path / ".gitignore").write_text("outputs/\n")
    (tmp_path / "outputs").write_text("a file, not the directory the pattern names")
    assert files_to_sync(tmp_path) == [".gitignore", "outputs"]


@pytest.fixture(scope="module", params=["default", "hardened"])
def profiled(request, sandbox_factory):
    """Nodes whose sshd offers SFTP, and nodes whose sshd does not (files go by tar)."""
    return sandbox_factory(2, 2, sshd_profile=request.param)


@pytest.mark.sandbox
def test_sync_copies_to_every_node_once_and_leaves_a_shared_directory_alone(profiled, tmp_path):
    _box, state = profiled
    nodes = [n.name for n in state.nodes[:2]]
    _tree(tmp_path)
    remote = f"/tmp/orch-sync-test-{uuid.uuid4().hex[:8]}"
    try:
        first = sync_workdir(nodes, tmp_path, remote)
        assert first.ok and not any(r.value.shared for r in first), first
        # The sandbox's nodes share this machine's disk, so the second node may find
        # the files the first one just wrote: together they sent each file once or more.
        assert sum(r.value.sent for r in first) >= 4
        listing = subprocess.run(["ssh", nodes[1], f"cd {remote} && find . -type f | sort; "
                                  "stat -c %a run.sh"], capture_output=True, text=True,
                                 timeout=30, check=True).stdout.split()  # fmt: skip
        assert listing == ["./.gitignore", "./run.sh", "./src/pkg/train.py", "./src/run.log",
                           "755"]  # fmt: skip
        again = sync_workdir(nodes, tmp_path, remote)
        assert [(r.value.sent, r.value.unchanged) for r in again] == [(0, 4), (0, 4)]
        # Syncing a directory onto itself would truncate it: detected and skipped.
        same = sync_workdir(nodes[:1], tmp_path, str(tmp_path))
        [shared] = same
        assert shared.ok and shared.value.shared
        assert (tmp_path / "src" / "pkg" / "train.py").read_text() == "print('hi')\n"
    finally:
        subprocess.run(["rm", "-rf", remote], check=False)


def test_unreachable_node_is_reported_not_hidden(tmp_path):
    _tree(tmp_path)
    [result] = sync_workdir(["orch-no-such-host.invalid"], tmp_path, "/tmp/x", timeout=5)
    assert not result.ok and "orch-no-such-host.invalid" in result.problem
