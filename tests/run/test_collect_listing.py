"""The node's listing of a job's raw logs (run/collect.py): the node names its own directory
(its uid is the node's), and lists nothing of a user directory that is not the user's own.
Run with this machine's shell on real directories under a temporary directory."""

from __future__ import annotations

import hashlib
import io
import os
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest

from orchestrator.nodes.transport import SrunTransport
from orchestrator.remote import node_files, owned
from orchestrator.run import collect

ME = os.getuid()


@pytest.fixture
def base(tmp_path: Path, monkeypatch) -> Path:
    """The node's /tmp, standing in: the user's directory is made under it."""
    monkeypatch.setattr(owned, "NODE_BASE", str(tmp_path))
    return tmp_path


def _listing(job: str, node: str) -> subprocess.CompletedProcess[bytes]:
    command = collect._hash_command(job, node)
    return subprocess.run(["sh", "-c", command], capture_output=True, timeout=30, check=False)


@pytest.mark.process
def test_the_node_names_its_own_directory_and_its_files(base: Path) -> None:
    node_files.write("job-1", "n1", b"settings", ME)
    directory = base / f"orch-{ME}" / "runs" / "job-1" / "n1"
    (directory / "stdout.raw").write_bytes(b"hello\n")
    listed = _listing("job-1", "n1")
    assert listed.returncode == 0, listed.stderr
    where, hashes = collect._parse_hashes(listed.stdout)
    assert where == str(directory)
    assert hashes["stdout.raw"] == (6, hashlib.sha256(b"hello\n").hexdigest())


@pytest.mark.process
def test_no_user_directory_is_no_logs(base: Path) -> None:
    assert _listing("job-1", "n1").returncode == 3


@pytest.mark.process
def test_a_user_directory_others_can_write_is_not_read(base: Path) -> None:
    node_files.write("job-1", "n1", b"settings", ME)
    (base / f"orch-{ME}").chmod(0o777)
    listed = _listing("job-1", "n1")
    assert listed.returncode == 5 and b"no directory of your own" in listed.stderr
    assert b"dir " not in listed.stdout


@pytest.mark.process
def test_a_linked_user_directory_is_not_read(base: Path) -> None:
    real = base / "elsewhere"
    (real / "runs" / "job-1" / "n1").mkdir(parents=True)
    (base / f"orch-{ME}").symlink_to(real)
    assert _listing("job-1", "n1").returncode == 5


def _by_hand(said: str) -> str:
    """The shell word a hand fetch runs on the node."""
    assert said.startswith("ssh n1 ") and said.endswith(" | tar -xf -")
    return said[len("ssh n1 "):-len(" | tar -xf -")]


@pytest.mark.process
def test_the_hand_fetch_finds_the_nodes_own_directory(base: Path) -> None:
    node_files.write("job-1", "n1", b"settings", ME)
    word = _by_hand(collect.fetch_command("n1", "job-1"))
    [script] = shlex.split(word)
    assert "/orch-$(id -u)" in script  # the node's uid, not the head's
    tarred = subprocess.run(["sh", "-c", script], capture_output=True, timeout=30, check=False)
    assert tarred.returncode == 0, tarred.stderr
    with tarfile.open(fileobj=io.BytesIO(tarred.stdout)) as tar:
        assert "n1/private.json" in tar.getnames()
    through_slurm = collect.fetch_command("n1", "job-1", SrunTransport(slurm_job="42"))
    assert through_slurm == f"srun --jobid=42 --overlap -N1 -n1 -w n1 sh -c {word} | tar -xf -"
