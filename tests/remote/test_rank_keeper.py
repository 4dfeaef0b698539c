"""orch-rank as its rank's keeper, on real processes: the rank's end is reported the moment
it happens, with its own code or signal, and the keeper ends the same way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _agent_head import RecordingHead
from launch_support import wait_for

from orchestrator.remote import procs
from orchestrator.remote import rank as rank_program
from orchestrator.remote.rank_streams import RankChannels

RANK_PROGRAM = Path(rank_program.__file__)


class _Node:
    """A node directory with the agent's socket, as the agent prepares it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.head = RecordingHead()
        self.ends: list[tuple[int, int, dict]] = []
        (directory / "bin").mkdir()
        self.socket = str(directory / "ranks.sock")
        self.channels = RankChannels(
            self.head, directory, "n1", self.socket,  # type: ignore[arg-type]
            lambda rank, local, report: self.ends.append((rank, local, report)),
        )

    def start(self, code: str, rank: int = 3) -> subprocess.Popen[bytes]:
        command = {"argv": [sys.executable, "-c", code], "socket": self.socket}
        (self.dir / rank_program.COMMAND_FILE).write_text(json.dumps(command))
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "1",
               rank_program.NODE_DIR_VAR: str(self.dir), procs.KEPT_VAR: "1"}  # fmt: skip
        return subprocess.Popen([sys.executable, "-I", "-S", str(RANK_PROGRAM)], env=env)

    def wait_for_end(self) -> tuple[int, int, dict]:
        assert wait_for(lambda: self.ends, 30, 0.01), "no end reported"
        return self.ends[0]

    def wait_ready(self) -> None:
        assert wait_for(lambda: b"ready" in b"".join(self.head.lines), 30, 0.01), self.head.lines

    def output(self) -> bytes:
        self.channels.close(5.0)
        return b"".join(self.head.lines)


@pytest.fixture
def node(tmp_path: Path) -> _Node:
    return _Node(tmp_path)


@pytest.mark.process
def test_the_ranks_own_exit_code_is_reported_and_kept(node: _Node) -> None:
    keeper = node.start("import os, time; print('step 1', flush=True); os._exit(7)")
    assert keeper.wait(30) == 7
    rank, local_rank, report = node.wait_for_end()
    assert (rank, local_rank, report["code"]) == (3, 1, 7)
    assert report["pid"] != keeper.pid  # the rank is the keeper's child
    assert report["start"] <= report["end"] <= time.time()
    assert "forwarded" not in report
    assert b"step 1" in node.output()


@pytest.mark.process
def test_a_rank_killed_from_outside_is_reported_with_its_signal(node: _Node) -> None:
    keeper = node.start("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert keeper.wait(30) == -signal.SIGKILL  # the keeper ends as its rank did
    _rank, _local, report = node.wait_for_end()
    assert report["code"] == -signal.SIGKILL
    assert "forwarded" not in report  # nobody asked the keeper to stop it


@pytest.mark.process
def test_the_launchers_signal_is_passed_on_and_noted(node: _Node) -> None:
    keeper = node.start("import time; print('ready', flush=True); time.sleep(60)")
    node.wait_ready()
    keeper.send_signal(signal.SIGTERM)
    assert keeper.wait(30) == -signal.SIGTERM
    _rank, _local, report = node.wait_for_end()
    assert report["code"] == -signal.SIGTERM
    assert report["forwarded"] == [signal.SIGTERM]


@pytest.mark.process
def test_the_rank_not_its_keeper_is_found_under_proc(node: _Node) -> None:
    keeper = node.start("import time; print('ready', flush=True); time.sleep(60)", rank=5)
    try:
        node.wait_ready()
        children = Path(f"/proc/{keeper.pid}/task/{keeper.pid}/children").read_text().split()
        assert len(children) == 1
        rank_pid = int(children[0])
        assert procs.rank_at(rank_pid) == 5
        assert procs.rank_at(keeper.pid) is None
    finally:
        keeper.kill()  # the rank follows its keeper (PR_SET_PDEATHSIG)
        keeper.wait(30)
    assert wait_for(lambda: not Path(f"/proc/{rank_pid}").exists()
                    or procs.zombie_exit_code(rank_pid) is not None,
                    30, 0.05), "the rank outlived its keeper"  # fmt: skip


@pytest.mark.process
def test_a_rank_that_cannot_start_says_why(node: _Node, tmp_path: Path) -> None:
    command = {"argv": [str(tmp_path / "missing-python"), "x.py"], "socket": node.socket}
    (node.dir / rank_program.COMMAND_FILE).write_text(json.dumps(command))
    env = {**os.environ, "RANK": "0", rank_program.NODE_DIR_VAR: str(node.dir)}
    keeper = subprocess.run([sys.executable, "-I", "-S", str(RANK_PROGRAM)], env=env,
                            timeout=30, check=False)  # fmt: skip
    assert keeper.returncode == 127
    assert b"cannot start" in node.output()
