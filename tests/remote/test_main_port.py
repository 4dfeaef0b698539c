"""Whether what listens on node 0's main port is the job's (remote/main_port.py): the
/proc/net/tcp parser on values, the rules on fabricated /proc trees, and the check and the
shipped agent on this machine's own sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.plan.agent_command import agent_command
from orchestrator.remote import main_port
from orchestrator.remote.agent_spec import AgentSpec, runs_root
from orchestrator.remote.logwire import decode_wire
from orchestrator.remote.main_port import TcpSocket

HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode"
)
V4_LISTEN = "   0: 01BCB57F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 530867 1 000000009b48da97 100 0 0 10 0"  # noqa: E501
V6_ESTABLISHED = "   1: 0000000000000000FFFF000001BCB57F:7466 0000000000000000FFFF00000100007F:862A 06 00000000:00000000 03:000014CA 00000000  1000        0 0 3 000000001fcbcc33"  # noqa: E501
JOB = "job-1"
ME = 1000  # the fabricated trees' user


# ----- the parser, on values --------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "byteorder", "expected"),
    [
        ("0100007F:1F90", "little", ("127.0.0.1", 8080)),
        ("7F000001:1F90", "big", ("127.0.0.1", 8080)),
        ("00000000:7530", "little", ("0.0.0.0", 30000)),
        ("00000000000000000000000000000000:7530", "little", ("::", 30000)),
        ("00000000000000000000000001000000:0016", "little", ("::1", 22)),
        ("0000000000000000FFFF000001BCB57F:7466", "little", ("::ffff:127.181.188.1", 0x7466)),
    ],
)
def test_an_address_is_the_kernels_words_in_the_nodes_byte_order(text, byteorder, expected):
    assert main_port.parse_address(text, byteorder) == expected


def test_a_line_gives_address_port_state_owner_and_inode():
    assert main_port.parse_tcp_line(V4_LISTEN, "little") == TcpSocket(
        "127.181.188.1", 22, 0x0A, 0, 530867
    )
    v6 = main_port.parse_tcp_line(V6_ESTABLISHED, "little")
    assert v6 == TcpSocket("::ffff:127.181.188.1", 0x7466, 0x06, 1000, 0)
    assert v6 is not None and not v6.listening


@pytest.mark.parametrize(
    "line", [HEADER, "", "   0: zz:zz 0 0A", "   0: 0100007F:XYZ 0 0A a b c 0 0 1"]
)
def test_what_is_no_socket_line_is_none(line):
    assert main_port.parse_tcp_line(line) is None


@pytest.mark.parametrize(
    ("link", "inode"),
    [("socket:[4242]", 4242), ("pipe:[4242]", None), ("/dev/null", None), ("socket:[]", None)],
)
def test_a_socket_is_known_by_its_fd_link(link, inode):
    assert main_port.socket_inode(link) == inode


def test_a_listener_is_the_jobs_when_its_uid_is_ours_and_the_job_holds_it():
    ours = TcpSocket("0.0.0.0", 29500, 0x0A, ME, 1)
    foreign = TcpSocket("::", 29500, 0x0A, ME + 1, 2)
    unheld = TcpSocket("0.0.0.0", 29500, 0x0A, ME, 3)
    assert main_port.strangers([ours, foreign, unheld], ME, {1, 2}) == [foreign, unheld]


def test_the_message_names_the_port_the_node_and_the_owner():
    stranger = TcpSocket("0.0.0.0", 29517, 0x0A, 65534, 9)
    text = main_port.taken_message(29517, "gpu01", stranger, ME, started=False)
    assert "main port 29517 on gpu01" in text
    assert "uid 65534" in text and "another user's process" in text
    assert "--main-port" in text
    mine = main_port.taken_message(29517, "gpu01", TcpSocket("::", 29517, 0x0A, ME, 9), ME, True)
    assert "another process of yours" in mine and "before this job's launcher" in mine


def test_a_user_is_shown_by_name_where_the_node_has_one():
    assert main_port.user_shown(0) == "root (uid 0)"
    assert main_port.user_shown(2**31 - 7) == f"uid {2**31 - 7}"


# ----- the rules, on fabricated /proc trees -----------------------------------------
def _socket_line(slot: int, address: str, port: int, state: int, uid: int, inode: int) -> str:
    return (
        f"{slot:4d}: {address}:{port:04X} 00000000:0000 {state:02X} 00000000:00000000 "
        f"00:00000000 00000000 {uid:5d}        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
    )


def _tables(proc: Path, v4: list[str], v6: list[str] | None = None) -> None:
    (proc / "net").mkdir(exist_ok=True)
    (proc / "net" / "tcp").write_text(HEADER + "\n" + "".join(v4))
    if v6 is not None:
        (proc / "net" / "tcp6").write_text(HEADER + "\n" + "".join(v6))


def _process(proc: Path, pid: int, env: dict[str, str], uid: int, sockets: list[int]) -> None:
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))
    (d / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    for fd, inode in enumerate(sockets, start=3):
        os.symlink(f"socket:[{inode}]", d / "fd" / str(fd))
    os.symlink("/dev/null", d / "fd" / "0")


PORT = 29517
ANY_V4 = "00000000"
ANY_V6 = "0" * 32
JOB_ENV = {"ORCH_JOB_ID": JOB, "ORCH_NODE": "n0"}
# pids no real process has (above Linux's largest pid_max): never this test's own
LAUNCHER, OTHER = 9_000_001, 9_000_002


def test_the_jobs_own_listener_passes(tmp_path):
    _tables(tmp_path, [_socket_line(0, ANY_V4, PORT, 0x0A, ME, 4242)])
    _process(tmp_path, LAUNCHER, JOB_ENV, ME, [17, 4242])
    assert main_port.check_before_start(PORT, JOB, "n0", ME, str(tmp_path)) is None


def test_a_listener_held_by_the_jobs_launcher_of_another_node_on_this_kernel_passes(tmp_path):
    # Two hostfile entries on one machine: either torchrun may be the one that bound it.
    _tables(tmp_path, [_socket_line(0, ANY_V4, PORT, 0x0A, ME, 4242)])
    _process(tmp_path, LAUNCHER, {**JOB_ENV, "ORCH_NODE": "n1"}, ME, [4242])
    assert main_port.check_before_start(PORT, JOB, "n0", ME, str(tmp_path)) is None


def test_another_users_listener_fails_naming_the_port_and_its_owner(tmp_path):
    _tables(tmp_path, [], [_socket_line(0, ANY_V6, PORT, 0x0A, 0, 77)])
    problem = main_port.check_before_start(PORT, JOB, "n0", ME, str(tmp_path))
    assert problem is not None
    assert "main port 29517 on n0" in problem and "root (uid 0)" in problem
    assert "another user's process" in problem and "already listens" in problem


def test_a_listener_of_ours_that_the_job_does_not_hold_fails(tmp_path):
    _tables(tmp_path, [_socket_line(0, ANY_V4, PORT, 0x0A, ME, 4242)])
    _process(tmp_path, LAUNCHER, JOB_ENV, ME, [17])
    _process(tmp_path, OTHER, {"ORCH_JOB_ID": "another-job"}, ME, [4242])
    problem = main_port.check_before_start(PORT, JOB, "n0", ME, str(tmp_path))
    assert problem is not None and "another process of yours" in problem


def test_a_process_with_the_jobs_id_but_another_owner_does_not_vouch_for_it(tmp_path):
    _tables(tmp_path, [_socket_line(0, ANY_V4, PORT, 0x0A, ME, 4242)])
    _process(tmp_path, OTHER, JOB_ENV, ME + 1, [4242])
    assert main_port.check_before_start(PORT, JOB, "n0", ME, str(tmp_path)) is not None


def test_what_does_not_listen_on_the_port_is_no_listener(tmp_path):
    _tables(tmp_path, [
        _socket_line(0, ANY_V4, PORT, 0x01, ME + 1, 5),  # a connection, not a listener
        _socket_line(1, ANY_V4, PORT + 1, 0x0A, ME + 1, 6),  # another port
    ])  # fmt: skip
    assert main_port.check_before_start(PORT, JOB, "n0", ME, str(tmp_path)) is None


def test_the_watch_confirms_the_jobs_listener_then_catches_one_added_beside_it(tmp_path):
    _tables(tmp_path, [])
    watch = main_port.Watch(PORT, JOB, "n0", ME, str(tmp_path))
    assert watch.look() is None  # nothing listens yet
    _tables(tmp_path, [_socket_line(0, ANY_V4, PORT, 0x0A, ME, 4242)])
    _process(tmp_path, LAUNCHER, JOB_ENV, ME, [4242])
    assert watch.look() is None
    # Another user's IPv6-only listener beside the launcher's IPv4 one.
    _tables(tmp_path, [_socket_line(0, ANY_V4, PORT, 0x0A, ME, 4242)],
            [_socket_line(0, ANY_V6, PORT, 0x0A, 0, 99)])  # fmt: skip
    problem = watch.look()
    assert problem is not None and "root (uid 0)" in problem and "29517" in problem


# ----- on this machine's own sockets ------------------------------------------------
_BIND = """
import os, socket, sys
port, uid = int(sys.argv[1]), int(sys.argv[2])
if uid != os.getuid():  # the listener another user's
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
s.listen()
print("listening", flush=True)
sys.stdin.read()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _listener(port: int, uid: int, env: dict[str, str] | None = None) -> Iterator[None]:
    """A child listening on the port as `uid`, until the block ends."""
    child = subprocess.Popen([sys.executable, "-c", _BIND, str(port), str(uid)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={**os.environ, **(env or {})})  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == b"listening\n"
        yield
    finally:
        child.kill()
        child.wait()


def test_a_port_this_process_listens_on_is_no_job_port():
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        port = sock.getsockname()[1]
        problem = main_port.check_before_start(port, f"j-{uuid.uuid4().hex[:8]}", "here",
                                               os.getuid())  # fmt: skip
    assert problem is not None
    assert f"main port {port} on here" in problem
    assert main_port.user_shown(os.getuid()) in problem


@pytest.mark.process
def test_a_listener_of_the_jobs_own_process_passes():
    job_id = f"j-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    with _listener(port, os.getuid(), {"ORCH_JOB_ID": job_id, "ORCH_NODE": "here"}):
        assert main_port.check_before_start(port, job_id, "here", os.getuid()) is None


@pytest.mark.process
@pytest.mark.skipif(os.geteuid() != 0, reason="binding as another user (setuid) needs root")
def test_another_users_listener_is_named_by_its_user():
    port = _free_port()
    with _listener(port, 65534):
        problem = main_port.check_before_start(port, "j-x", "here", os.getuid())
    assert problem is not None
    assert f"main port {port} on here" in problem
    assert main_port.user_shown(65534) in problem and "uid 65534" in problem
    assert "another user's process" in problem


# ----- the shipped agent on node 0 --------------------------------------------------
def _run_agent(spec: AgentSpec) -> tuple[int, list[str], dict]:
    """The agent as node 0 runs it: its return code, its lines, its exit message."""
    command = agent_command(sys.executable, spec).replace("%h", "here").replace("%n", "0")
    result = subprocess.run(["sh", "-c", command], capture_output=True, timeout=60, check=False)
    records = [decode_wire(line + b"\n") for line in result.stdout.splitlines()]
    lines = [r.text for r in records if r and r.kind == "line"]
    [exit_fields] = [r.fields for r in records if r and r.kind == "control" and r.text == "exit"]
    subprocess.run(["rm", "-rf", f"{runs_root(os.getuid())}/{spec.job_id}"], check=False)
    return result.returncode, lines, exit_fields


@pytest.mark.process
def test_node_0_does_not_start_its_launcher_on_a_port_already_taken(tmp_path):
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        port = sock.getsockname()[1]
        spec = AgentSpec(f"mp-{uuid.uuid4().hex[:8]}", workdir=str(tmp_path),
                         main_port=port, command=("echo", "started"))  # fmt: skip
        code, lines, fields = _run_agent(spec)
    assert code == 1 and "started" not in lines
    assert f"main port {port} on here" in fields["error"]
    assert main_port.user_shown(os.getuid()) in fields["error"]


@pytest.mark.process
def test_node_0_confirms_the_listener_its_launcher_opened(tmp_path):
    port = _free_port()
    listen = (f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0',{port})); "
              "s.listen(); time.sleep(1.5); print('done')")  # fmt: skip
    spec = AgentSpec(f"mp-{uuid.uuid4().hex[:8]}", workdir=str(tmp_path), main_port=port,
                     command=(sys.executable, "-c", listen))  # fmt: skip
    code, lines, fields = _run_agent(spec)
    assert (code, fields.get("error")) == (0, None) and "done" in lines


@pytest.mark.process
def test_node_0_ends_the_job_when_a_process_not_of_the_job_takes_the_port(tmp_path):
    # The launcher starts a process that is not the job's (its job id taken off) and that
    # binds the port: the agent ends the job, naming the port and the owner.
    port = _free_port()
    pid_file = tmp_path / "stranger.pid"
    stranger = (f"import os,socket,time; s=socket.socket(); s.bind(('0.0.0.0',{port})); "
                f"s.listen(); open({str(pid_file)!r},'w').write(str(os.getpid())); "
                "time.sleep(30)")  # fmt: skip
    # Its output elsewhere: it outlives the job, and would hold the launcher's pipes open.
    launcher = f'env -u ORCH_JOB_ID {sys.executable} -c "{stranger}" >/dev/null 2>&1 & sleep 30'
    spec = AgentSpec(f"mp-{uuid.uuid4().hex[:8]}", workdir=str(tmp_path), main_port=port,
                     grace=1.0, command=("sh", "-c", launcher))  # fmt: skip
    started = time.monotonic()
    try:
        code, _lines, fields = _run_agent(spec)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert code == 1 and time.monotonic() - started < 20
    assert f"main port {port} on here" in fields["error"]
    assert "another process of yours" in fields["error"]
    assert main_port.user_shown(os.getuid()) in fields["error"]


@pytest.mark.process
def test_a_worker_checks_nothing(tmp_path):
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        spec = AgentSpec(f"mp-{uuid.uuid4().hex[:8]}", workdir=str(tmp_path),
                         main_port=sock.getsockname()[1], command=("echo", "started"))  # fmt: skip
        command = agent_command(sys.executable, spec).replace("%h", "w").replace("%n", "1")
        result = subprocess.run(["sh", "-c", command], capture_output=True, timeout=60,
                                check=False)  # fmt: skip
    subprocess.run(["rm", "-rf", f"{runs_root(os.getuid())}/{spec.job_id}"], check=False)
    assert result.returncode == 0, result.stderr
    # The port taken by another process is no worker's business: its launcher ran, and
    # nothing in what it sent names the port.
    records = [decode_wire(line + b"\n") for line in result.stdout.splitlines()]
    assert "started" in [r.text for r in records if r and r.kind == "line"]
    [exit_fields] = [r.fields for r in records if r and r.kind == "control" and r.text == "exit"]
    assert exit_fields.get("error") is None and b"main port" not in result.stdout
