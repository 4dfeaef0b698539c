"""Picking a job's main port on node 0 (remote/ports.py), on this machine's own sockets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from orchestrator.plan.agent_command import port_command
from orchestrator.remote import ports


def _listening() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def _free_pair() -> list[int]:
    """Two ports nothing listens on now."""
    found: list[int] = []
    while len(found) < 2:
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", 0))
            port = sock.getsockname()[1]
        if port not in found and ports.port_is_free(port):
            found.append(port)
    return found


def test_a_port_something_listens_on_is_skipped(tmp_path: Path) -> None:
    sock, busy = _listening()
    with sock:
        [free, _] = _free_pair()
        assert ports.choose(str(tmp_path), "job-a", 60, [busy, free]) == {"port": free}
    assert (tmp_path / str(free)).read_text() == "job-a\n"


def test_two_jobs_choosing_at_once_never_share_a_port(tmp_path: Path) -> None:
    candidates = _free_pair()
    first = ports.choose(str(tmp_path), "job-a", 60, candidates)
    second = ports.choose(str(tmp_path), "job-b", 60, candidates)
    assert first == {"port": candidates[0]} and second == {"port": candidates[1]}
    again = ports.choose(str(tmp_path), "job-a", 60, candidates)  # a retry keeps its own
    assert again == first
    assert ports.choose(str(tmp_path), "job-c", 60, candidates)["error"].startswith(
        "no free port among 2"
    )


def test_an_expired_reservation_is_taken_over_and_a_look_reserves_nothing(tmp_path) -> None:
    [port, _] = _free_pair()
    stale = tmp_path / str(port)
    stale.write_text("old-job\n")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    assert ports.choose(str(tmp_path), "job-a", 60, [port]) == {"port": port}
    assert stale.read_text() == "job-a\n"
    looked = tmp_path / "look"
    assert ports.choose(str(looked), "doctor", 0, [port]) == {"port": port}
    assert not looked.exists()  # nothing reserved


def test_the_shipped_command_runs_with_any_python3_and_says_json(tmp_path: Path) -> None:
    candidates = tuple(_free_pair())
    command = port_command("/nonexistent/python", "job-x", str(tmp_path / "r"), 60, candidates)
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"port": candidates[0]}
    assert (tmp_path / "r" / str(candidates[0])).read_text() == "job-x\n"
