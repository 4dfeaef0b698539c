"""The ranks' own output: each rank's orch-rank (remote/rank.py) connects its stdout and
stderr to the agent over a unix socket in the node directory; the agent tees each stream
into rank<R>.{stdout,stderr}.raw and frames it to the head labelled with its rank.
STANDARD LIBRARY ONLY (shipped inline beside the agent)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

try:  # shipped inline: loaded beside the agent as orch_<name>
    import orch_channel as channel
    import orch_logwire as logwire
except ImportError:
    from orchestrator.remote import channel, logwire

RANK_SOCKET = "ranks.sock"
SOCKET_PATH_MAX = 100  # AF_UNIX paths are capped at 108 bytes
_HEADER_MAX = 4096
_RAW_NAME = {"out": "stdout.raw", "err": "stderr.raw"}
END_STREAM = "end"  # the keeper's report of its rank's end (remote/rank.py)
_END_MAX = 64 * 1024
OnEnd = Callable[[int, int, dict], None]  # (rank, local rank, the keeper's report)


def socket_path(directory: Path) -> str:
    """Where the ranks reach the agent: in the node directory, however deep (unix_address)."""
    return str(directory / RANK_SOCKET)


def unix_address(path: str) -> tuple[str, int | None]:
    """An AF_UNIX address for `path` (108 bytes at most): the path itself, or for a longer
    one the same file through an open descriptor of its directory, /proc/self/fd/N/NAME
    (the caller closes N once bound or connected). Nothing is made elsewhere, so nothing is
    left behind by an agent that is killed; remote/rank.py connects the same way."""
    if len(path.encode()) <= SOCKET_PATH_MAX:
        return path, None
    where = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{where}/{os.path.basename(path)}", where


class RankChannels:
    """Accepts the ranks' own connections (remote/rank.py opens three per rank: stdout,
    stderr and its end) and pumps each output into its raw file in `directory` and to the
    head, labelled with its rank; the first connection of a rank announces it (`rank`
    control message). A rank's end, as its keeper reports it, goes to `on_end`."""

    def __init__(
        self, head: channel.Channel, directory: Path, node: str, path: str, on_end: OnEnd
    ) -> None:
        self.head = head
        self.on_end = on_end
        self.directory = directory
        self.node = node
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, where = unix_address(path)
        try:
            self.server.bind(address)
        finally:
            if where is not None:
                os.close(where)
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
            with self._lock:  # started before close() can see it: it joins every pump it sees
                pump.start()
                self.pumps.append(pump)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if not _same_user(conn):
                return  # nothing of another user's may land in this job's output
            header = _read_header(conn)
            if header is None:
                return
            rank, local_rank, stream, first_bytes = header
            if stream == END_STREAM:
                report = _read_end(conn, first_bytes)
                if report is not None:
                    self.on_end(rank, local_rank, report)
                return
            with self._lock:
                first = rank not in self._announced
                self._announced.add(rank)
            if first:
                self.head.control(logwire.ControlKind.RANK, rank=rank, local_rank=local_rank,
                                  node=self.node)  # fmt: skip
            framer = logwire.WireFramer(stream, f"{rank}/{local_rank}", self.head.line_max)
            raw = self.directory / f"rank{rank}.{_RAW_NAME[stream]}"
            pending = [first_bytes] if first_bytes else []

            def read() -> bytes:
                return pending.pop() if pending else conn.recv(65536)

            channel.OutputPump(self.head, framer, raw, None).run(read)

    def close(self, timeout: float) -> int:
        """Stop accepting; wait (at most `timeout` s) for the ranks' streams to end. Returns
        how many have not: what they still carry goes when the agent does."""
        with contextlib.suppress(OSError):
            self.server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        deadline = time.monotonic() + timeout
        with self._lock:
            pumps = list(self.pumps)
        for pump in pumps:
            pump.join(max(0.0, deadline - time.monotonic()))
        return sum(pump.is_alive() for pump in pumps)


def _same_user(conn: socket.socket) -> bool:
    """The peer runs as this agent's user. The socket is 0600 in a 0700 directory, so only
    root could connect otherwise; this holds even where a mode is loosened by mistake."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return True  # no peer credentials on this system: the modes are the guard
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


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
    if stream not in _RAW_NAME and stream != END_STREAM:
        return None
    return rank, local_rank, stream, rest  # rest: the rank's first bytes, when they came along


def _read_end(conn: socket.socket, data: bytes) -> dict | None:
    """The keeper's one line, sent when its rank ends (the connection waits until then);
    None if the keeper ended without one (killed itself)."""
    while b"\n" not in data and len(data) < _END_MAX:
        try:
            chunk = conn.recv(_END_MAX)
        except OSError:
            return None
        if not chunk:
            break
        data += chunk
    try:
        report = json.loads(data.partition(b"\n")[0])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None
