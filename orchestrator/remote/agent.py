"""The orch agent: the supervisor that runs the job's command on one node.

STANDARD LIBRARY ONLY. The head ships this file, remote/logwire.py and
remote/rank.py to each node inline (`python -c <zlib+base64 blob>`), so a node
needs no orch install, just the job's interpreter.

`run` mode: start the node's command (its launcher) in its own session with
ORCH_JOB_ID set; tee the launcher's raw stdout/stderr into
/tmp/orch-runs/<job>/<node>/{stdout,stderr}.raw, and each rank's, which arrive
on connections of their own (remote/rank.py), into rank<R>.{stdout,stderr}.raw;
frame all of them onto the agent's own stdout (the ssh channel back to the
head) with logwire, each rank's records labelled with its rank; send a
heartbeat every 2 s and an `exit` control message at the end.
When the head goes away (the channel breaks, or writes stay blocked), the agent
tears its job down by itself.

`kill` mode: stop every process on this node whose environment carries
ORCH_JOB_ID=<id> (TERM, then KILL after a grace period). Processes are found by
that variable in /proc/<pid>/environ, never by a command-line pattern.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import queue
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

JOB_ID_VAR = "ORCH_JOB_ID"
NODE_VAR = "ORCH_NODE"
NODE_RANK_VAR = "ORCH_NODE_RANK"
NODE_DIR_VAR = "ORCH_NODE_DIR"
RUNS_ROOT = "/tmp/orch-runs"
HEARTBEAT_S = 2.0
# A write to the head blocked this long means the head is gone (frozen, or its
# network is): tear the job down rather than leave it holding the node.
STALL_S = 30.0
GRACE_S = 5.0
_EXIT_SCAN_S = 0.2
TAIL_BYTES = 64 * 1024
RANK_PROGRAM = "orch-rank"  # what the launchers start in place of the script (--no_python)
RANK_SOCKET = "ranks.sock"
PRIVATE_FILE = "private.json"  # the job's env and the rank's argv, written by the head
_SOCKET_PATH_MAX = 100  # AF_UNIX paths are capped at 108 bytes
_HEADER_MAX = 4096


def flight_recorder_env(directory: str) -> dict[str, str]:
    """NCCL's flight recorder for every rank of the job (GPU jobs with NCCL; ignored by
    gloo): the last 2000 collectives kept, dumped when a collective times out, one file
    per rank in the node's run directory, which comes back to the head with the logs.
    Both names of each setting: older torch reads TORCH_NCCL_*, newer TORCH_FR_*."""
    stem = os.path.join(directory, "nccl_trace_rank_")
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": stem,
        "TORCH_FR_DUMP_TEMP_FILE": stem,
    }


def node_dir(job_id: str, node: str) -> str:
    return f"{RUNS_ROOT}/{job_id}/{node}"


# ----- finding and stopping a job's processes --------------------------------------
def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return needle in b"\0" + handle.read() + b"\0"
    except OSError:
        return False


def _rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    match = re.search(rb"(?:^|\0)RANK=(\d+)(?:\0|$)", raw)
    return int(match.group(1)) if match else None


def job_pids(job_id: str) -> list[int]:
    """Every live process on this node started for the job (zombies have no environ)."""
    needle = f"\0{JOB_ID_VAR}={job_id}\0".encode()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            pid = int(entry)
            if _environ_has(pid, needle):
                pids.append(pid)
    return pids


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def stop_job(job_id: str, grace: float = GRACE_S) -> dict[str, int]:
    """TERM every process of the job, KILL what is left after `grace` seconds."""
    found = job_pids(job_id)
    _signal_all(found, signal.SIGTERM)
    # A frozen process only sees TERM once it runs again.
    _signal_all(found, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and job_pids(job_id):
        time.sleep(0.1)
    killed = 0
    # New processes may be forked while we stop the others: KILL until none is left.
    for _ in range(50):
        left = job_pids(job_id)
        if not left:
            break
        killed += len(left)
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.05)
    return {"found": len(found), "killed": killed, "left": len(job_pids(job_id))}


# ----- which rank failed -------------------------------------------------------
_TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.MULTILINE)
_TORCHRUN_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)


def failure_from_text(text: str) -> tuple[int | None, int | None]:
    """(rank, exit code) of the root-cause failure in torchrun's error report, if any."""
    at = text.rfind("Root Cause")
    if at < 0:
        return None, None
    tail = text[at:]
    rank = _TORCHRUN_RANK.search(tail)
    code = _TORCHRUN_EXIT.search(tail)
    return (
        int(rank.group(1)) if rank else None,
        int(code.group(1)) if code else None,
    )


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _zombie_exit_code(pid: int) -> int | None:
    """The exit code of a process that ended but is not reaped yet (Linux >= 3.5)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    status = int(fields[-1])
    return status >> 8 if status & 0x7F == 0 else -(status & 0x7F)


class RankWatch:
    """Remembers the job's ranks (RANK in their environment) and the order they ended in.

    Ranks are not the agent's children: their ends are seen through pidfds (woken
    at the moment a rank exits) and their exit codes read from /proc while their
    launcher has not reaped them yet. Without pidfds, the periodic scan notices.
    """

    _TIE_S = 0.3  # ranks that ended this close together are told apart by exit code

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.alive: dict[int, int] = {}  # pid -> rank
        self.ended: list[tuple[float, int, int | None]] = []  # (time, rank, exit code if seen)
        self._lock = threading.Lock()
        self._noted: set[int] = set()
        self._not_ranks: set[int] = set()
        self._fds: dict[int, int] = {}  # pidfd -> pid
        if hasattr(os, "pidfd_open"):
            threading.Thread(target=self._wait_for_exits, daemon=True).start()

    def scan(self) -> None:
        current = {}
        for pid in job_pids(self.job_id):
            if pid in self._not_ranks:
                continue
            rank = self.alive.get(pid)
            if rank is None:
                rank = _rank_of(pid)
                # A rank's own children (data loader workers...) inherit its RANK.
                if rank is None or _rank_of(_parent_of(pid)) == rank:
                    self._not_ranks.add(pid)
                    continue
            current[pid] = rank
        with self._lock:
            for pid in current.keys() - self.alive.keys():
                self._watch(pid)
            gone = [(pid, rank) for pid, rank in self.alive.items() if pid not in current]
            self.alive.update(current)
        for pid, rank in gone:
            self._note(pid, rank)

    def _watch(self, pid: int) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self._fds[os.pidfd_open(pid)] = pid

    def _note(self, pid: int, rank: int) -> None:
        code = _zombie_exit_code(pid)
        with self._lock:
            if pid in self._noted:
                return
            self._noted.add(pid)
            self.ended.append((time.time(), rank, code))

    def _wait_for_exits(self) -> None:
        while True:
            with self._lock:
                fds = list(self._fds)
            if not fds:
                time.sleep(0.1)
                continue
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            for fd, _event in poller.poll(200):
                with self._lock:
                    pid = self._fds.pop(fd, None)
                    rank = self.alive.get(pid) if pid is not None else None
                if pid is not None and rank is not None:
                    self._note(pid, rank)
                with contextlib.suppress(OSError):
                    os.close(fd)

    @property
    def gone_at(self) -> float | None:
        with self._lock:
            failed = [t for t, _rank, code in self.ended if code != 0]
        return failed[0] if failed else None

    def first_failed(self, node_code: int) -> tuple[int | None, int | None]:
        """(rank, its exit code) of the rank that failed first, when the node's command failed."""
        with self._lock:
            ended = list(self.ended)
        return first_failed_rank(ended, node_code, self._TIE_S)


def first_failed_rank(
    ended: list[tuple[float, int, int | None]], node_code: int, tie_s: float
) -> tuple[int | None, int | None]:
    """Which of the ranks that ended (time, rank, exit code or None if unseen) failed first.

    Ranks that ended within `tie_s` of the first failure are told apart by exit code.
    The node's launcher passes on the failing rank's code, so that code names it. A
    rank whose code was not seen (its launcher reaped it first) comes next: its code
    may well be that one, whereas a known different code belongs to a peer that lost
    the failing rank (exit 1) or that the launcher stopped (-15).
    """
    # A rank that finished cleanly before the failure is not a suspect.
    failed = [entry for entry in ended if entry[2] != 0]
    if not failed:
        return None, None
    first = failed[0][0]
    batch = [(rank, code) for t, rank, code in failed if t - first <= tie_s]
    for wanted in (lambda c: c == node_code, lambda c: c is None):
        for rank, code in batch:
            if wanted(code):
                return rank, code
    return batch[0]


# ----- talking to the head -------------------------------------------------------
def _shipped(name: str):
    """remote/<name>.py: shipped inline by the bootstrap (as orch_<name>), or from the
    installed package."""
    if f"orch_{name}" in sys.modules:
        return sys.modules[f"orch_{name}"]
    import importlib

    return importlib.import_module(f"orchestrator.remote.{name}")


def _shipped_source(name: str) -> str:
    module = _shipped(name)
    source = getattr(module, "__orch_source__", None)
    if source is None:
        source = Path(module.__file__).read_text(encoding="utf-8")
    return source


class Channel:
    """Writes wire lines to fd 1 from one thread; notices when the head is gone. With a
    `label` (under srun, which does not name the node as pdsh does), every line starts
    with it."""

    def __init__(self, label: bytes = b"") -> None:
        self.label = label
        # Items are whole reads of a rank's output (up to 64 KiB of wire lines):
        # 256 of them bound the agent's memory to ~16 MiB before ranks block.
        self.lines: queue.Queue[bytes | None] = queue.Queue(maxsize=256)
        self.broken = threading.Event()
        self.busy_since: float | None = None
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def send(self, line: bytes) -> None:
        while not self.broken.is_set():
            try:
                self.lines.put(line, timeout=1.0)
                return
            except queue.Full:
                continue

    def stalled(self) -> bool:
        since = self.busy_since
        return since is not None and time.monotonic() - since > STALL_S

    def close(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(queue.Full):
            self.lines.put(None, timeout=timeout)
        self.thread.join(timeout)

    def _pump(self) -> None:
        while True:
            line = self.lines.get()
            if line is None:
                return
            self.busy_since = time.monotonic()
            if self.label:
                line = self.label + line[:-1].replace(b"\n", b"\n" + self.label) + line[-1:]
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(1, view) :]
            except OSError:
                self.broken.set()
                return
            finally:
                self.busy_since = None


class OutputPump:
    """Copies one output stream (the launcher's pipe, or a rank's connection) to its raw file
    and, framed by logwire, to the head, until the stream ends."""

    def __init__(self, channel: Channel, framer: object, raw: Path, tail: Tail | None) -> None:
        self.channel = channel
        self.framer = framer
        self.raw = raw
        self.tail = tail

    def run(self, read: Callable[[], bytes]) -> None:
        with self.raw.open("ab") as log:
            while True:
                try:
                    data = read()
                except OSError:
                    data = b""
                if not data:
                    break
                log.write(data)
                log.flush()
                if self.tail is not None:
                    self.tail.add(data)
                wire = self.framer.feed(data)
                if wire:  # one hand-off per read, not per line: the rank is not slowed
                    self.channel.send(b"".join(wire))
        for line in self.framer.flush():
            self.channel.send(line)


class Tail:
    """The end of the launcher's output, to find its failure report in."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._lock = threading.Lock()

    def add(self, data: bytes) -> None:
        with self._lock:
            self._data += data
            del self._data[:-TAIL_BYTES]

    def text(self) -> str:
        with self._lock:
            return self._data.decode(errors="replace")


def socket_path(directory: Path) -> str:
    """Where the ranks reach the agent: in the node directory, or, when that path is too
    long for a unix socket, a private directory of its own."""
    path = str(directory / RANK_SOCKET)
    if len(path.encode()) <= _SOCKET_PATH_MAX:
        return path
    return os.path.join(tempfile.mkdtemp(prefix="orch-"), RANK_SOCKET)


class RankChannels:
    """Accepts the ranks' own connections (remote/rank.py opens two per rank: stdout and
    stderr) and pumps each into its raw file and to the head, labelled with its rank."""

    def __init__(self, supervisor: Supervisor, path: str) -> None:
        self.sup = supervisor
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        os.chmod(path, 0o600)
        self.server.listen(256)
        self.pumps: list[threading.Thread] = []
        self._announced: set[int] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self.server.accept()
            except OSError:
                return  # closed
            pump = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self.pumps.append(pump)
            pump.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            header = _read_header(conn)
            if header is None:
                return
            rank, local_rank, stream, first_bytes = header
            with self._lock:
                first = rank not in self._announced
                self._announced.add(rank)
            if first:
                self.sup.control("rank", rank=rank, local_rank=local_rank, node=self.sup.node)
            framer = self.sup.lw.WireFramer(stream, f"{rank}/{local_rank}")
            raw = self.sup.dir / f"rank{rank}.{_RAW_NAME[stream]}"
            pending = [first_bytes] if first_bytes else []

            def read() -> bytes:
                return pending.pop() if pending else conn.recv(65536)

            OutputPump(self.sup.channel, framer, raw, None).run(read)

    def close(self, timeout: float) -> None:
        """Stop accepting; wait (at most `timeout` s) for the ranks' streams to end."""
        with contextlib.suppress(OSError):
            self.server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        deadline = time.monotonic() + timeout
        with self._lock:
            pumps = list(self.pumps)
        for pump in pumps:
            pump.join(max(0.0, deadline - time.monotonic()))


_RAW_NAME = {"out": "stdout.raw", "err": "stderr.raw"}


def _read_header(conn: socket.socket) -> tuple[int, int, str, bytes] | None:
    """The first line a rank sends: who it is and which of its streams this is."""
    conn.settimeout(10.0)
    data = b""
    try:
        while b"\n" not in data and len(data) < _HEADER_MAX:
            chunk = conn.recv(_HEADER_MAX)
            if not chunk:
                return None
            data += chunk
        conn.settimeout(None)
        line, _, rest = data.partition(b"\n")
        doc = json.loads(line)
        rank, local_rank, stream = int(doc["rank"]), int(doc["local_rank"]), str(doc["stream"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if stream not in _RAW_NAME:
        return None
    return rank, local_rank, stream, rest  # rest: the rank's first bytes, when they came along


class Supervisor:
    def __init__(self, spec: dict, node: str, rank: str) -> None:
        self.spec = spec
        self.job_id = str(spec["job_id"])
        self.node = node
        self.rank = rank
        self.dir = Path(node_dir(self.job_id, node))
        self.lw = _shipped("logwire")
        self.channel = Channel(f"{node}: ".encode() if spec.get("label_lines") else b"")
        self.tail = Tail()
        self.stop_reason: str | None = None
        self.ranks = RankWatch(self.job_id)
        self.rank_channels: RankChannels | None = None

    def control(self, kind: str, **fields: object) -> None:
        self.channel.send(self.lw.encode_control(kind, **fields))

    def _load_private(self) -> str | None:
        """Take in what the head wrote for this job on the node (the job's env, the rank's
        argv) and remove it: it holds secrets, and the node directory comes back to the
        head's record. Returns why it could not, or None."""
        wanted = self.spec.get("private_sha256")
        if not wanted:
            return None
        path = self.dir / PRIVATE_FILE
        try:
            data = path.read_bytes()
        except OSError as err:
            return f"the job's settings did not reach {self.node} ({path}: {err.strerror})"
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        if hashlib.sha256(data).hexdigest() != wanted:
            return f"the job's settings on {self.node} ({path}) are not the ones this job wrote"
        private = json.loads(data)
        # The launcher's own settings (accelerate's, on the pdsh launcher) first; the job's win.
        self.spec = {
            **self.spec,
            "env": {**self.spec.get("env", {}), **private["env"]},
            "rank_argv": private["rank_argv"],
        }
        return None

    def _env(self) -> dict[str, str]:
        env = without_step_variables(os.environ)
        env.update({str(k): str(v) for k, v in self.spec.get("env", {}).items()})
        for name, first in self.spec.get("path_first", {}).items():
            env[name] = os.pathsep.join(p for p in (str(first), env.get(name, "")) if p)
        env[JOB_ID_VAR] = self.job_id
        env[NODE_VAR] = self.node
        env[NODE_RANK_VAR] = self.rank
        env[NODE_DIR_VAR] = str(self.dir)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.rank_channels is not None:  # the launchers find orch-rank on PATH
            start_dir = self.dir / _shipped("rank").START_DIR
            env["PATH"] = os.pathsep.join([str(start_dir), env.get("PATH", "")])
        for name, value in flight_recorder_env(str(self.dir)).items():
            env.setdefault(name, value)  # the user's own settings win
        return env

    def _write_files(self) -> None:
        for name, content in self.spec.get("files", {}).items():
            path = self.dir / os.path.basename(name)
            path.write_text(content)

    def _prepare_ranks(self) -> None:
        """What the launcher's `--no_python orch-rank` starts: the per-rank program, the
        rank's exact command (readable by this user only), and the socket it reports to."""
        rank_argv = self.spec.get("rank_argv")
        if not rank_argv:
            return
        rank_module = _shipped("rank")
        bin_dir = self.dir / rank_module.START_DIR
        bin_dir.mkdir(exist_ok=True)
        program = bin_dir / "orch_rank.py"
        program.write_text(_shipped_source("rank"))
        path = socket_path(self.dir)
        command = {"argv": [str(word) for word in rank_argv], "socket": path}
        fd = os.open(self.dir / rank_module.COMMAND_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o600)  # fmt: skip
        with os.fdopen(fd, "w") as handle:
            json.dump(command, handle)
        site_dir = self.dir / rank_module.SITE_DIR
        site_dir.mkdir(exist_ok=True)
        (site_dir / "sitecustomize.py").write_text(_shipped_source("rank_site"))
        launcher = bin_dir / RANK_PROGRAM
        # -I -S: the wrapper needs nothing but the standard library, and starts fastest so.
        launcher.write_text(
            "#!/bin/sh\n"
            f"exec {shlex.quote(str(rank_argv[0]))} -I -S {shlex.quote(str(program))} \"$@\"\n"
        )
        launcher.chmod(0o755)
        self.rank_channels = RankChannels(self, path)

    def _argv(self) -> list[str]:
        if self.spec.get("shell"):
            return ["/bin/sh", "-c", self.spec["shell"]]
        if self.spec.get("commands"):  # one per node rank, when the nodes' commands differ
            return [str(word) for word in self.spec["commands"][int(self.rank)]]
        words = [str(word) for word in self.spec["command"]]
        placeholder = self.spec.get("node_rank_word")  # pdsh's %n, in DeepSpeed's words
        if placeholder:
            words = [word.replace(placeholder, self.rank) for word in words]
        return words

    def _pump_stream(self, fd: int, stream: str, raw: Path) -> None:
        pump = OutputPump(self.channel, self.lw.WireFramer(stream), raw, self.tail)
        pump.run(lambda: os.read(fd, 65536))
        os.close(fd)

    def _wait_for_main(self) -> bool:
        target = self.spec.get("wait_for")
        if not target or self.rank == "0":
            return True
        host, port = target[0], int(target[1])
        deadline = time.monotonic() + float(self.spec.get("wait_timeout", 120))
        last_beat = 0.0
        while time.monotonic() < deadline and not self.channel.broken.is_set():
            if time.monotonic() - last_beat >= HEARTBEAT_S:
                self.control("heartbeat", waiting=f"{host}:{port}")
                last_beat = time.monotonic()
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
                return True
            time.sleep(0.5)
        return False

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stop_reason = signal.Signals(signum).name

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        problem = self._load_private()
        if problem:
            return self._finish(127, error=problem)
        self._write_files()
        self._prepare_ranks()
        workdir = self.spec.get("workdir") or os.getcwd()
        if not os.path.isdir(workdir):
            return self._finish(
                127, error=f"working directory {workdir} does not exist on {self.node}"
            )
        if not self._wait_for_main():
            host, port = self.spec["wait_for"]
            return self._finish(1, error=f"main port {host}:{port} never answered")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            child = subprocess.Popen(
                self._argv(),
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env=self._env(),
                cwd=workdir,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as err:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            return self._finish(127, error=f"cannot start {self._argv()[0]}: {err}")
        os.close(out_w)
        os.close(err_w)
        step = os.environ.get("SLURM_STEP_ID")
        where = {"slurm_step": f"{os.environ.get('SLURM_JOB_ID')}.{step}"} if step else {}
        self.control("started", pid=child.pid, node=self.node, node_rank=int(self.rank), **where)
        pumps = [
            threading.Thread(target=self._pump_stream, args=(fd, name, self.dir / raw), daemon=True)
            for fd, name, raw in ((out_r, "out", "stdout.raw"), (err_r, "err", "stderr.raw"))
        ]
        for pump in pumps:
            pump.start()
        code = self._watch(child)
        for pump in pumps:
            pump.join(5.0)
        if self.rank_channels is not None:
            self.rank_channels.close(5.0)
        return self._finish(code)

    def _watch(self, child: subprocess.Popen[bytes]) -> int:
        last_beat = 0.0
        while True:
            code = child.poll()
            if code is not None:
                self.ranks.scan()
                return code
            self.ranks.scan()
            if self.channel.broken.is_set() or self.channel.stalled():
                self.stop_reason = "head gone"
            if self.stop_reason:
                stop_job(self.job_id, float(self.spec.get("grace", GRACE_S)))
                child.wait()
                return 128 + signal.SIGTERM
            if time.monotonic() - last_beat >= HEARTBEAT_S:
                self.control("heartbeat")
                last_beat = time.monotonic()
            time.sleep(_EXIT_SCAN_S)

    def _finish(self, code: int, error: str | None = None) -> int:
        # Nothing of the job may outlive its command on this node.
        stopped = stop_job(self.job_id, float(self.spec.get("grace", GRACE_S)))
        rank, rank_code = failure_from_text(self.tail.text())
        if rank is None and code != 0:
            rank, rank_code = self.ranks.first_failed(code)
        fields: dict[str, object] = {"code": code, "node": self.node}
        if rank is not None:
            fields["rank"] = rank
        if rank_code is not None:
            fields["rank_code"] = rank_code
        if code != 0 and self.ranks.gone_at is not None:
            fields["failed_at"] = round(self.ranks.gone_at, 3)
        if error:
            fields["error"] = error
        if self.stop_reason:
            fields["stopped"] = self.stop_reason
        if stopped["killed"]:
            fields["killed_leftovers"] = stopped["killed"]
        self.control("exit", **fields)
        if code != 0 and not self.stop_reason:
            self._linger(float(self.spec.get("linger_s", 0)))
        self.channel.close()
        return code if code >= 0 else 128 - code

    def _linger(self, seconds: float) -> None:
        """Under srun, a failed node's agent stays until the head ends the step (or this
        bound passes): its exit would make Slurm end every node's ranks at once
        (--kill-on-bad-exit), before the head has taken the survivors' stacks."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stop_reason:
            if self.channel.broken.is_set():
                return
            time.sleep(0.1)


# ----- entry points ---------------------------------------------------------------
def decode_spec(word: str) -> dict:
    """The job spec from its one-word form (plan/agent_command.py encodes it)."""
    return json.loads(zlib.decompress(base64.b64decode(word)))


# What srun sets about orch's own step (one agent task per node), which says nothing true
# of the ranks: a library that trusts SLURM_PROCID and SLURM_NTASKS (Lightning does, ahead of
# torchrun's RANK) would take a node's index for a rank. The job's own SLURM_JOB_* stay.
STEP_VARIABLES = frozenset({
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_GTIDS", "SLURM_TASK_PID",
    "SLURM_STEPID", "SLURM_DISTRIBUTION",
})  # fmt: skip
STEP_PREFIXES = ("SLURM_STEP_", "SLURM_SRUN_COMM_", "SLURM_CPU_BIND")


def without_step_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for the launcher and its ranks: the agent's, minus what describes the
    srun step that started the agent."""
    return {
        name: value
        for name, value in environ.items()
        if name not in STEP_VARIABLES and not name.startswith(STEP_PREFIXES)
    }


def slurm_node_and_rank(spec: dict, node: str, rank: str) -> tuple[str, str]:
    """Under srun, `-` for the node is Slurm's name for it, and `-` for its rank is that
    name's place in the job's hosts (the order of the plan, node 0 first)."""
    if node == "-":
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if rank == "-":
        hosts = [str(h) for h in spec.get("hosts", ())]
        rank = str(hosts.index(node)) if node in hosts else os.environ.get("SLURM_NODEID", "0")
    return node, rank


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    if mode == "run" and len(argv) == 4:
        spec = decode_spec(argv[1])
        node, rank = slurm_node_and_rank(spec, argv[2], argv[3])
        return Supervisor(spec, node, rank).run()
    if mode == "kill" and len(argv) == 3:
        result = stop_job(argv[1], float(argv[2]))
        print(json.dumps(result), flush=True)
        return 0 if result["left"] == 0 else 1
    print("usage: agent run SPEC NODE RANK | kill JOB_ID GRACE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
