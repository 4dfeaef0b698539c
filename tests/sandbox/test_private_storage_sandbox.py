"""A sandbox node's private storage (`orch sandbox up --private PATH`): what one node writes
there neither another node nor the head sees, as on nodes with local disks."""

from __future__ import annotations

import subprocess
import sys
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
