"""A stop on one node, on real processes: the shipped stop program sends the stop signal to
the rank's own process (not its keeper, not the rank's DataLoader-like children), and
while the stop's grace lasts the keeper passes none of the launcher's signals on, nor
starts a rank not started yet. After the grace, the keeper is as before."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from _agent_head import RecordingHead

from orchestrator.plan.agent_command import stop_command
from orchestrator.remote import agent_spec, procs
from orchestrator.remote import rank as rank_program
from orchestrator.remote.rank_streams import RankChannels

RANK_PROGRAM = Path(rank_program.__file__)

# A rank that saves when told to stop: its handler sets a flag, it forks two workers (as a
# DataLoader does) that note any signal they get, and on the flag it "saves" (1.5 s) and
# exits 0 by itself.
SAVING_RANK = r"""
import os, signal, sys, time
out = sys.argv[1]
def note(name):
    open(os.path.join(out, name), "w").close()
workers = []
for i in range(2):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, lambda *_: note(f"worker{i}-got-TERM"))
        while True:
            time.sleep(0.1)
    workers.append(pid)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
while not stop:
    time.sleep(0.05)
print("saving", flush=True)
time.sleep(1.5)
note("saved")
for pid in workers:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
sys.exit(0)
"""


class _Node:
    """The job's node directory (the real one, under /tmp/orch-<uid>/runs), with the
    agent's socket for the ranks, as the agent prepares it."""

    def __init__(self, job_id: str, node: str = "n1") -> None:
        self.job_id, self.node = job_id, node
        self.dir = Path(agent_spec.make_node_dir(job_id, node, os.getuid()))
        (self.dir / rank_program.START_DIR).mkdir()
        self.head = RecordingHead()
        self.ends: list[dict] = []
        self.socket = str(self.dir / "ranks.sock")
        self.channels = RankChannels(self.head, self.dir, node, self.socket,  # type: ignore[arg-type]
                                     lambda _rank, _local, report: self.ends.append(report))

    def start(self, code: str, *args: str, rank: int = 3) -> subprocess.Popen[bytes]:
        command = {"argv": [sys.executable, "-c", code, *args], "socket": self.socket}
        (self.dir / rank_program.COMMAND_FILE).write_text(json.dumps(command))
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", procs.KEPT_VAR: "1",
               rank_program.NODE_DIR_VAR: str(self.dir), procs.JOB_ID_VAR: self.job_id,
               procs.NODE_VAR: self.node}  # fmt: skip
        return subprocess.Popen([sys.executable, "-I", "-S", str(RANK_PROGRAM)], env=env)

    def wait_for(self, text: bytes) -> None:
        deadline = time.monotonic() + 30
        while text not in b"".join(self.head.lines):
            assert time.monotonic() < deadline, f"never said {text!r}"
            time.sleep(0.02)

    def end(self) -> dict:
        deadline = time.monotonic() + 30
        while not self.ends:
            assert time.monotonic() < deadline, "no end reported"
            time.sleep(0.02)
        return self.ends[0]

    def stop_file(self, until: float) -> None:
        path = self.dir / rank_program.STOP_FILE
        path.write_text(json.dumps({"signal": int(signal.SIGTERM), "until": until}))


@pytest.fixture
def node():
    job_id = f"test-stop-{uuid.uuid4().hex[:8]}"
    made = _Node(job_id)
    yield made
    made.channels.close(1.0)
    shutil.rmtree(Path(agent_spec.runs_root(os.getuid())) / job_id, ignore_errors=True)


def _stop_program(job_id: str, node: str, grace: float = 30.0) -> dict:
    """The stop program as the head sends it (the shipped blob, through a shell)."""
    command = stop_command(sys.executable, job_id, node, int(signal.SIGTERM), grace)
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.process
def test_the_rank_alone_gets_the_stop_signal_and_the_launchers_is_held_back(node, tmp_path):
    keeper = node.start(SAVING_RANK, str(tmp_path))
    try:
        node.wait_for(b"ready")
        answer = _stop_program(node.job_id, node.node)
        [sent] = answer["signalled"]
        rank_pid = int(Path(f"/proc/{keeper.pid}/task/{keeper.pid}/children").read_text())
        assert (sent["rank"], sent["pid"]) == (3, rank_pid)  # the rank, not its keeper
        assert sent["at"] <= answer["t"] <= time.time()
        node.wait_for(b"saving")
        keeper.send_signal(signal.SIGTERM)  # the launcher's own TERM, during the grace
        assert keeper.wait(30) == 0  # the rank saved and exited by itself
    finally:
        if keeper.poll() is None:
            keeper.kill()
    report = node.end()
    assert report["code"] == 0 and report["held"] == [signal.SIGTERM]
    assert "forwarded" not in report
    assert sorted(os.listdir(tmp_path)) == ["saved"]  # neither worker got a signal


@pytest.mark.process
def test_a_rank_not_started_when_the_stop_came_is_not_started(node, tmp_path):
    node.stop_file(time.time() + 60)
    keeper = node.start("import pathlib, sys; pathlib.Path(sys.argv[1]).touch()",
                        str(tmp_path / "ran"))  # fmt: skip
    assert keeper.wait(30) == 0
    report = node.end()
    assert report["code"] == 0 and report["not_started"] is True
    assert not (tmp_path / "ran").exists()


@pytest.mark.process
def test_once_the_grace_is_over_the_launchers_signal_is_passed_on_again(node):
    keeper = node.start("import time; print('ready', flush=True); time.sleep(60)")
    try:
        node.wait_for(b"ready")
        node.stop_file(time.time() - 1)
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(30) == -signal.SIGTERM
    finally:
        if keeper.poll() is None:
            keeper.kill()
    report = node.end()
    assert report["forwarded"] == [signal.SIGTERM] and "held" not in report


@pytest.mark.process
def test_the_stop_program_leaves_no_directory_where_the_job_has_none():
    job_id = f"test-stop-{uuid.uuid4().hex[:8]}"
    answer = _stop_program(job_id, "n9")
    assert answer["signalled"] == []
    assert not (Path(agent_spec.runs_root(os.getuid())) / job_id).exists()
