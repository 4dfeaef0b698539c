"""`orch env push` on a node, the stream's way through: the TCP port a node opens for the
previous node (which must present the push's token; anyone else's connections are closed
and never keep it out), the connection to the next node, and the Relay that passes every
byte on to the next node as this node's build reads it. STANDARD LIBRARY ONLY, shipped
beside remote/envpush.py (as orch_envpush_relay).
"""

from __future__ import annotations

import contextlib
import hmac
import io
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

STALL_S = 120.0  # a link between two nodes that moves nothing for this long is given up
CONNECT_S = 30.0  # to reach the next node's port
TOKEN_S = 5.0  # for a connection to the port to present the push's token
MAX_CALLERS = 64  # connections read at once for the token; the oldest makes room for a new one
_CHUNK = 1 << 20  # read and passed on at a time, of what this node's build did not read


def open_port() -> socket.socket:
    """A listening TCP port on every address of the node, for the previous node to send on."""
    try:
        server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    except (OSError, ValueError):
        server = socket.create_server(("", 0))
    return server


def accept_upstream(
    server: socket.socket, token: str, deadline: float, head_gone: threading.Event
) -> socket.socket:
    """The connection that presents the push's token. Connections are read side by side,
    each for TOKEN_S at most, and at most MAX_CALLERS at once: another user's connections,
    silent or saying something else, are closed and never keep the previous node out."""
    want = token.encode()
    # connection -> (what it said so far, when it must have said the token)
    callers: dict[socket.socket, tuple[bytes, float]] = {}
    try:
        while time.monotonic() < deadline:
            if head_gone.is_set():
                raise EOFError("the head went away")
            ready, _, _ = select.select([server, *callers], [], [], 0.5)
            now = time.monotonic()
            for sock in ready:
                if sock is server:
                    _new_caller(server, callers, now + TOKEN_S)
                    continue
                found = _read_token(sock, callers, want)
                if found is not None:
                    return found
            for sock, (_, until) in list(callers.items()):
                if now > until:
                    del callers[sock]
                    sock.close()
        raise TimeoutError("the previous node never connected")
    finally:
        for sock in callers:
            sock.close()


def _new_caller(
    server: socket.socket, callers: dict[socket.socket, tuple[bytes, float]], until: float
) -> None:
    with contextlib.suppress(OSError):
        conn, _ = server.accept()
        if len(callers) >= MAX_CALLERS:  # the oldest makes room
            oldest = min(callers, key=lambda sock: callers[sock][1])
            del callers[oldest]
            oldest.close()
        conn.setblocking(False)
        callers[conn] = (b"", until)


def _read_token(
    sock: socket.socket, callers: dict[socket.socket, tuple[bytes, float]], want: bytes
) -> socket.socket | None:
    """`sock` once it has said the whole token; None while it has not (closed if it never
    will: it ended, or said something else)."""
    got, until = callers[sock]
    try:
        chunk = sock.recv(len(want) - len(got))
    except BlockingIOError:
        return None
    except OSError:
        chunk = b""
    got += chunk
    if chunk and len(got) < len(want):
        callers[sock] = (got, until)
        return None
    del callers[sock]
    if chunk and hmac.compare_digest(got, want):
        sock.setblocking(True)
        sock.settimeout(STALL_S)
        return sock
    sock.close()
    return None


def connect_downstream(forward: dict[str, Any], token: str) -> socket.socket:
    """The next node's port, with the push's token sent; retried while the node starts."""
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            conn = socket.create_connection((forward["host"], forward["port"]), timeout=10)
            conn.settimeout(STALL_S)
            conn.sendall(token.encode())
            return conn
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


class Relay(io.RawIOBase):
    """What tarfile reads from: the upstream's bytes, each passed on to the next node as it
    is read. The next node lost (or stalled) stops the passing on, never this node's build."""

    def __init__(
        self, read: Callable[[int], bytes], downstream: socket.socket | None = None
    ) -> None:
        super().__init__()
        self._read, self.downstream = read, downstream
        self.forward_error: str | None = None
        self.total = 0
        self.read_error: str | None = None  # the upstream broke or stalled

    def _take(self, size: int) -> bytes:
        try:
            data = self._read(size)
        except OSError as err:
            self.read_error = str(err) or type(err).__name__
            raise
        return data

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:
        data = self._take(len(buffer))
        if not data:
            return 0
        buffer[: len(data)] = data
        self.total += len(data)
        self._pass_on(data)
        return len(data)

    def _pass_on(self, data: bytes) -> None:
        if self.downstream is None:
            return
        try:
            self.downstream.sendall(data)
        except OSError as err:
            self.forward_error = f"passing the stream on failed: {err}"
            self.drop()

    def drain(self) -> None:
        """The rest of the stream, passed on (what this node's build did not read)."""
        with contextlib.suppress(OSError):
            while data := self._take(_CHUNK):
                self.total += len(data)
                self._pass_on(data)

    def drop(self) -> None:
        if self.downstream is not None:
            with contextlib.suppress(OSError):
                self.downstream.shutdown(socket.SHUT_WR)
            self.downstream.close()
            self.downstream = None
