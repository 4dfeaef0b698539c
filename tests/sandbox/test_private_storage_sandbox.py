"""A sandbox node's private storage (`orch sandbox up --private PATH`): what one node writes
there neither another node nor the head sees, as on nodes with local disks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.sandbox

ORCH = str(Path(sys.executable).with_name("orch"))


def _ssh(state_dir: Path, node: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-F", str(state_dir / "ssh_config"), node, command],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_a_file_written_on_one_node_is_seen_by_no_other_node_nor_the_head(tmp_path) -> None:
    private = tmp_path / "opt-envs"
    private.mkdir()
    (private / "on-the-head").write_text("head\n")
    state_dir = tmp_path / "box"
    tag = tmp_path.name[-6:].replace("_", "")
    up = subprocess.run([ORCH, "sandbox", "up", "--nodes", "2", "--prefix", f"pv{tag}n",
                         "--private", str(private), "--dir", str(state_dir)],
                        capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        one, two = f"pv{tag}n1", f"pv{tag}n2"

        def on(node: str, command: str) -> subprocess.CompletedProcess[str]:
            return _ssh(state_dir, node, command)

        assert on(one, f"ls {private}").stdout == ""  # its own, empty: not the head's
        assert on(one, f"echo one > {private}/written-on-one").returncode == 0
        assert on(one, f"cat {private}/written-on-one").stdout == "one\n"
        assert on(two, f"ls {private}").stdout == ""
        assert sorted(p.name for p in private.iterdir()) == ["on-the-head"]
    finally:
        subprocess.run([ORCH, "sandbox", "down", "--dir", str(state_dir)], capture_output=True,
                       timeout=120, check=False)  # fmt: skip


def _own_tmp() -> Path:
    """/tmp, unless this checkout or its interpreter lives there; else orch's own directory
    in it (made here as orch would, for the nodes' own to be mounted over)."""
    here = (Path(sys.prefix).resolve(), Path(__file__).resolve())
    if not any(path.is_relative_to("/tmp") for path in here):
        return Path("/tmp")
    own = Path(f"/tmp/orch-{os.getuid()}")
    own.mkdir(mode=0o700, exist_ok=True)
    return own


def test_with_its_own_tmp_each_node_keeps_orch_files_to_itself_and_a_job_still_runs(
    tmp_path,
) -> None:
    """`--private /tmp`: every node has its own /tmp, as on a real cluster, where orch keeps
    its node directories. Doctor passes, a 2x1 job runs and its logs come back to the head,
    and what a node writes in its /tmp neither the other node nor the head sees. (The
    sandbox's own files are kept outside /tmp, where the nodes' sshd must still read them.
    A checkout or interpreter under /tmp would be hidden from the nodes by their own /tmp:
    then only orch's own directory there, /tmp/orch-<uid>, is each node's.)"""
    state_dir = Path(tempfile.mkdtemp(prefix="orch-privtmp-", dir="/var/tmp"))
    tag = tmp_path.name[-6:].replace("_", "")
    one, two = f"pt{tag}n1", f"pt{tag}n2"
    private = _own_tmp()
    up = subprocess.run([ORCH, "sandbox", "up", "--nodes", "2", "--slots", "1", "--prefix",
                         f"pt{tag}n", "--private", str(private), "--dir", str(state_dir)],
                        capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        marker = private / f"only-on-{one}"
        assert _ssh(state_dir, one, f"echo one > {marker}").returncode == 0
        assert _ssh(state_dir, two, f"test -e {marker}").returncode == 1
        assert not marker.exists()
        env = {**os.environ, "ORCH_SANDBOX_DIR": str(state_dir)}
        hostfile = str(state_dir / "hostfile")
        doctor = subprocess.run([ORCH, "doctor", "--hostfile", hostfile], env=env,
                                capture_output=True, text=True, timeout=300,
                                check=False)  # fmt: skip
        assert doctor.returncode == 0, doctor.stdout[-2000:]
        script = state_dir / "steps.py"
        script.write_text("import os\nfor i in range(3):\n"
                          "    print(f'step {i} rank {os.environ[\"RANK\"]}', flush=True)\n")
        runs = tmp_path / "runs"
        job = subprocess.run([ORCH, "launch", "--hostfile", hostfile, "--launcher", "torchrun",
                              "--nproc-per-node", "1", "--runs-dir", str(runs), "--",
                              str(script)], env=env, capture_output=True, text=True,
                             timeout=300, check=False)  # fmt: skip
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
        [run] = list(runs.iterdir())
        for rank, node in enumerate((one, two)):
            log = (run / "logs" / f"{node}.log").read_text()
            assert all(f"step {i} rank {rank}" in log for i in range(3)), log
        # the job's node directories were each node's own: none of them is on the head
        assert not Path(f"/tmp/orch-{os.getuid()}/runs/{run.name}").exists()
    finally:
        subprocess.run([ORCH, "sandbox", "down", "--dir", str(state_dir)], capture_output=True,
                       timeout=120, check=False)  # fmt: skip
        shutil.rmtree(state_dir, ignore_errors=True)
