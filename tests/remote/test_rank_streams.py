"""The agent's socket for the ranks' own output, on this machine: only its user's processes
may write into the job's output."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from _agent_head import RecordingHead
from launch_support import wait_for

from orchestrator.remote import rank as rank_program
from orchestrator.remote import rank_streams
from orchestrator.remote.rank_streams import RankChannels

NOBODY = 65534


def _write_as_rank(path: str, text: bytes) -> None:
    """Connect as a rank would and write; the agent may hang up before all of it is sent."""
    header = {"rank": 0, "local_rank": 0, "pid": os.getpid(), "stream": "out"}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(header).encode() + b"\n" + text)


@pytest.mark.process
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_users_connection_writes_nothing_into_the_jobs_output() -> None:
    directory = Path(tempfile.mkdtemp(prefix="orch-test-"))
    try:
        head = RecordingHead()
        path = str(directory / "ranks.sock")
        channels = RankChannels(head, directory, "n1", path, lambda *_: None)  # type: ignore[arg-type]
        # Modes loosened by mistake: the peer check alone keeps the other user out.
        directory.chmod(0o755)
        os.chmod(path, 0o666)
        child = os.fork()
        if child == 0:  # another user on the node
            try:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                _write_as_rank(path, b"forged line\n")
                os._exit(0)
            except BaseException:
                os._exit(1)
        _pid, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0  # it could connect
        _write_as_rank(path, b"own line\n")
        # The agent took it in.
        assert wait_for(lambda: b"own line" in b"".join(head.lines), 30, 0.01), head.lines
        channels.close(5.0)
        # Connections are taken in order: the other user's came first and wrote nothing.
        assert b"forged line" not in b"".join(head.lines)
        assert (directory / "rank0.stdout.raw").read_bytes() == b"own line\n"
    finally:
        for entry in directory.iterdir():
            entry.unlink()
        directory.rmdir()


def test_a_rank_stream_still_open_when_the_agent_ends_is_counted(tmp_path: Path) -> None:
    head = RecordingHead()
    path = str(tmp_path / "ranks.sock")
    channels = RankChannels(head, tmp_path, "n1", path, lambda *_: None)  # type: ignore[arg-type]
    header = {"rank": 0, "local_rank": 0, "pid": os.getpid(), "stream": "out"}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as kept:  # a process keeps it open
        kept.connect(path)
        kept.sendall(json.dumps(header).encode() + b"\nstill writing\n")
        assert wait_for(lambda: b"still writing" in b"".join(head.lines), 30, 0.01), head.lines
        assert channels.close(0.2) == 1
    assert channels.close(5.0) == 0  # once it ends, nothing is left open


def test_the_agent_ends_while_a_rank_connects(tmp_path: Path, monkeypatch) -> None:
    """close() while a rank's connection is being taken in: the agent ends cleanly (a pump
    it had not started yet made close() raise "cannot join thread before it is started")."""
    starting = threading.Event()

    class SlowToStart(threading.Thread):
        def start(self) -> None:
            if getattr(self, "_target", None) is not None and self._target.__name__ == "_serve":
                starting.set()
                time.sleep(0.3)  # widens the window close() fell into under load
            super().start()

    monkeypatch.setattr(rank_streams.threading, "Thread", SlowToStart)
    head = RecordingHead()
    path = str(tmp_path / "ranks.sock")
    channels = RankChannels(head, tmp_path, "n1", path, lambda *_: None)  # type: ignore[arg-type]
    header = {"rank": 0, "local_rank": 0, "pid": os.getpid(), "stream": "out"}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        conn.sendall(json.dumps(header).encode() + b"\nlast words\n")
        conn.shutdown(socket.SHUT_WR)
        assert starting.wait(10), "the agent never took the connection in"
        assert channels.close(5.0) == 0
    assert (tmp_path / "rank0.stdout.raw").read_bytes() == b"last words\n"


def test_a_node_directory_too_deep_for_a_socket_still_holds_it_and_nothing_is_made_elsewhere(
    tmp_path: Path,
) -> None:
    """Past AF_UNIX's 108 bytes the socket is bound, and a rank's keeper connects to it,
    through a descriptor of the node directory: no private directory in /tmp, which an agent
    that is killed would leave behind."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = rank_streams.socket_path(deep)
    assert path == str(deep / rank_streams.RANK_SOCKET)
    assert len(path.encode()) > rank_streams.SOCKET_PATH_MAX
    before = set(os.listdir(tempfile.gettempdir()))
    channels = RankChannels(RecordingHead(), deep, "n1", path, lambda *_: None)  # type: ignore[arg-type]
    assert os.stat(path).st_mode & 0o777 == 0o600
    header = {"rank": 0, "local_rank": 0, "pid": os.getpid(), "stream": "out"}
    conn = rank_program._connect(path, header)
    conn.sendall(b"from deep down\n")
    conn.close()
    raw = deep / "rank0.stdout.raw"
    assert wait_for(lambda: raw.is_file() and raw.read_bytes() == b"from deep down\n", 10)
    assert channels.close(5.0) == 0
    assert not os.path.exists(path) and deep.is_dir()
    assert {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("orch-")} \
        == set()  # fmt: skip


def test_a_socket_in_the_node_directory_leaves_the_directory(tmp_path: Path) -> None:
    path = rank_streams.socket_path(tmp_path)
    assert path == str(tmp_path / rank_streams.RANK_SOCKET)
    channels = RankChannels(RecordingHead(), tmp_path, "n1", path, lambda *_: None)  # type: ignore[arg-type]
    assert channels.close(5.0) == 0
    assert tmp_path.is_dir() and not os.path.exists(path)
