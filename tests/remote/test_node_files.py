"""The job's private settings written and removed on a node (remote/node_files.py), in the
node directory of the user's own: on real directories under a temporary directory standing in
for the node's /tmp, and once in the shipped form against this machine's own."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.plan.agent_command import node_files_command
from orchestrator.remote import agent_spec, node_files, owned

ME = os.getuid()


@pytest.fixture
def node_tmp(tmp_path: Path, monkeypatch) -> Path:
    """The user's directory on the node, under a temporary directory."""
    mine = tmp_path / f"orch-{ME}"
    monkeypatch.setattr(owned, "NODE_BASE", str(tmp_path))
    return mine


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_every_level_is_private_whatever_the_umask(node_tmp: Path) -> None:
    old = os.umask(0o002)
    try:
        written = node_files.write("job-1", "n1", b'{"env": {}}', ME)
    finally:
        os.umask(old)
    node = node_tmp / "runs" / "job-1" / "n1"
    assert written == str(node / agent_spec.PRIVATE_FILE)
    for level in (node_tmp, node_tmp / "runs", node_tmp / "runs" / "job-1", node):
        assert _mode(level) == 0o700
    assert Path(written).read_bytes() == b'{"env": {}}' and _mode(Path(written)) == 0o600
    assert sorted(p.name for p in node.iterdir()) == [agent_spec.PRIVATE_FILE]  # no .part


def test_a_link_planted_at_the_node_directory_is_refused(node_tmp: Path, tmp_path) -> None:
    node_files.write("job-1", "n0", b"x", ME)  # the job's directory exists: n1 is next
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (node_tmp / "runs" / "job-1" / "n1").symlink_to(theirs)
    with pytest.raises(owned.UnsafeDirectory, match="symbolic link"):
        node_files.write("job-1", "n1", b"secret", ME)
    assert list(theirs.iterdir()) == []  # nothing written through the link
    with pytest.raises(owned.UnsafeDirectory):
        node_files.remove("job-1", "n1", ME)  # nor removed through it
    assert theirs.is_dir()


def test_a_group_writable_directory_is_refused(node_tmp: Path) -> None:
    node_tmp.mkdir()
    node_tmp.chmod(0o770)
    with pytest.raises(owned.UnsafeDirectory, match=r"mode 0770.*writable by others"):
        node_files.write("job-1", "n1", b"secret", ME)
    assert not (node_tmp / "runs").exists()


def test_removal_leaves_the_job_directory_while_another_node_has_one(node_tmp: Path) -> None:
    for node in ("n1", "n2"):  # two nodes on one machine share its /tmp
        node_files.write("job-1", node, b"x", ME)
    job = node_tmp / "runs" / "job-1"
    node_files.remove("job-1", "n1", ME)
    assert sorted(p.name for p in job.iterdir()) == ["n2"]
    node_files.remove("job-1", "n2", ME)
    assert not job.exists() and (node_tmp / "runs").is_dir()
    node_files.remove("job-1", "n2", ME)  # nothing there: nothing to do


@pytest.mark.process
def test_the_shipped_program_writes_and_removes_in_this_users_directory() -> None:
    job = f"nf-{uuid.uuid4().hex[:8]}"
    where = Path(agent_spec.node_dir(job, "here", ME))

    def run(action: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        command = node_files_command(sys.executable, action, job, "here")
        return subprocess.run(["sh", "-c", command], input=stdin, capture_output=True,
                              timeout=60, check=False)  # fmt: skip

    try:
        assert run("write", b"settings").returncode == 0
        assert (where / agent_spec.PRIVATE_FILE).read_bytes() == b"settings"
        assert _mode(where) == 0o700
        assert run("remove").returncode == 0
        assert not where.parent.exists()
    finally:
        subprocess.run(["rm", "-rf", str(where.parent)], check=False)
