"""Picking a job's main port on node 0 (remote/ports.py), on this machine's own sockets."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator.plan.agent_command import port_command
from orchestrator.remote import owned, ports


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


@pytest.mark.process
def test_the_shipped_command_runs_with_any_python3_and_says_json(tmp_path: Path) -> None:
    candidates = tuple(_free_pair())
    command = port_command("/nonexistent/python", "job-x", str(tmp_path / "r"), 60, candidates)
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"port": candidates[0]}
    assert (tmp_path / "r" / str(candidates[0])).read_text() == "job-x\n"


def test_a_fifo_among_the_reservations_does_not_hang_the_chooser(tmp_path: Path) -> None:
    [port, _] = _free_pair()
    fifo = tmp_path / str(port)
    os.mkfifo(fifo)
    answer: list[dict] = []
    chooser = threading.Thread(
        target=lambda: answer.append(ports.choose(str(tmp_path), "job-a", 60, [port])),
        daemon=True,
    )
    chooser.start()
    chooser.join(10)
    if chooser.is_alive():  # let the hung open return, so the thread ends
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the chooser hung on a FIFO at a candidate port")
    assert answer == [{"port": port}]  # a FIFO is no reservation: it was replaced
    assert fifo.is_file() and fifo.read_text() == "job-a\n"
    assert stat.S_IMODE(fifo.stat().st_mode) == 0o600


def test_a_huge_reservation_is_not_read_whole(tmp_path: Path, monkeypatch) -> None:
    huge = tmp_path / "29500"
    with huge.open("wb") as handle:
        handle.write(b"job-a\n")
        handle.truncate(8 << 30)  # 8 GiB, sparse
    asked: list[int] = []
    real_read = os.read

    def counting_read(fd: int, size: int) -> bytes:
        asked.append(size)
        return real_read(fd, size)

    monkeypatch.setattr(ports.os, "read", counting_read)
    found = ports.read_reservation(str(huge))
    assert found is not None and found[0] == "job-a"
    assert sum(asked) <= 256


def test_links_and_directories_at_a_port_are_no_reservations(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("job-b\n")
    (tmp_path / "1").symlink_to(target)
    (tmp_path / "2").mkdir()
    assert ports.read_reservation(str(tmp_path / "1")) is None  # not followed
    assert ports.read_reservation(str(tmp_path / "2")) is None
    assert ports.read_reservation(str(tmp_path / "3")) is None  # nothing there


def _stat(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, 0, 0, 0, 0, 0))


def test_only_a_directory_of_the_users_own_that_others_cannot_write_is_kept() -> None:
    ok = owned.directory_problem("/tmp/orch-1000/ports", _stat(stat.S_IFDIR | 0o700, 1000), 1000)
    assert ok is None
    assert owned.directory_problem("/d", _stat(stat.S_IFDIR | 0o755, 1000), 1000) is None
    foreign = owned.directory_problem("/d", _stat(stat.S_IFDIR | 0o700, 4242), 1000)
    assert foreign is not None and "/d" in foreign and "uid 4242" in foreign
    assert "mode 0700" in foreign and "another user" in foreign and "rm -rf -- /d" in foreign
    for loose in (0o770, 0o1777, 0o702):
        said = owned.directory_problem("/d", _stat(stat.S_IFDIR | loose, 1000), 1000)
        assert said is not None and f"mode {loose:04o}" in said and "writable by others" in said
        assert "chmod go-w -- /d" in said
    link = owned.directory_problem("/d", _stat(stat.S_IFLNK | 0o777, 1000), 1000)
    assert link is not None and "symbolic link" in link
    plain = owned.directory_problem("/d", _stat(stat.S_IFREG | 0o600, 1000), 1000)
    assert plain is not None and "not a directory" in plain
    for said in (foreign, link, plain):
        assert "\n" not in said


def test_a_symlinked_reservations_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    candidates = _free_pair()
    with pytest.raises(ports.UnsafeDirectory, match=f"{link} .*mode 0777.* symbolic link"):
        ports.choose(str(link), "job-a", 60, candidates)
    assert list(real.iterdir()) == []


def test_a_directory_others_can_write_is_refused_naming_owner_and_mode(tmp_path, capsys):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o1777)
    owner = pwd.getpwuid(os.getuid()).pw_name
    expected = f"{loose} \\(owner {owner} \\(uid {os.getuid()}\\), mode 1777\\)"
    with pytest.raises(ports.UnsafeDirectory, match=expected):
        ports.choose(str(loose), "job-a", 60, _free_pair())
    capsys.readouterr()
    assert ports.main([str(loose), "job-a", "60", *map(str, _free_pair())]) == 1
    [line] = capsys.readouterr().out.splitlines()  # the head shows it as it is: one line
    assert str(loose) in json.loads(line)["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)  # nobody's
    with pytest.raises(ports.UnsafeDirectory, match=f"{theirs} .*uid 65534.*another user"):
        ports.choose(str(theirs), "job-a", 60, _free_pair())


def test_the_users_own_directory_is_made_private_whatever_the_umask(tmp_path, monkeypatch):
    assert ports.default_reservations_dir(1000) == "/tmp/orch-1000/ports"
    mine = tmp_path / f"orch-{os.getuid()}"
    monkeypatch.setattr(owned, "NODE_BASE", str(tmp_path))
    old = os.umask(0)
    try:
        [port, _] = _free_pair()
        assert ports.choose(ports.DEFAULT_DIR, "job-a", 60, [port]) == {"port": port}
    finally:
        os.umask(old)
    for made in (mine, mine / "ports"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert stat.S_IMODE((mine / "ports" / str(port)).stat().st_mode) == 0o600
