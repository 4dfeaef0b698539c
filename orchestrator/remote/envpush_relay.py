"""`orch env push` on a node, the stream's way through: the TCP port a node opens for the
previous node, the connection to the next node, and the Relay that passes every byte on to
the next node as this node's build reads it. Each link of the chain has two secrets of its
own, which the head sends both ends on their stdin (a Hop): the sender presents the first,
the receiver answers the second. So the receiver takes the stream only from the node the
head put before it (anyone else's connections are closed and never keep it out), the sender
passes it only to the node the head put after it (not to whoever holds that port once its
receive ended), and what one link's secrets are is worth nothing on another. STANDARD
LIBRARY ONLY, shipped beside remote/envpush.py (as orch_envpush_relay).
"""

from __future__ import annotations

import contextlib
import hmac
import io
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

STALL_S = 120.0  # a link between two nodes that moves nothing for this long is given up
CONNECT_S = 30.0  # to reach the next node's port and hear its answer
TOKEN_S = 5.0  # for a connection to the port to present the link's secret
MAX_CALLERS = 64  # connections read at once for the secret; the oldest makes room for a new one
SECRET_BYTES = 16
_CHUNK = 1 << 20  # read and passed on at a time, of what this node's build did not read


@dataclass(frozen=True)
class Hop:
    """One link's secrets, the head's: what the sending node presents, what the receiving
    node answers (hex, SECRET_BYTES each)."""

    sender: str
    receiver: str

    @classmethod
    def new(cls) -> Hop:
        return cls(secrets.token_hex(SECRET_BYTES), secrets.token_hex(SECRET_BYTES))

    def to_dict(self) -> dict[str, str]:
        return {"sender": self.sender, "receiver": self.receiver}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Hop:
        hop = cls(str(doc["sender"]), str(doc["receiver"]))
        if min(len(hop.sender), len(hop.receiver)) < 2 * SECRET_BYTES:
            raise ValueError("a link's secret is too short")  # an empty one would admit anyone
        return hop


def open_port() -> socket.socket:
    """A listening TCP port on every address of the node, for the previous node to send on."""
    try:
        server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    except (OSError, ValueError):
        server = socket.create_server(("", 0))
    return server


def accept_upstream(
    server: socket.socket, hop: Hop, deadline: float, head_gone: threading.Event
) -> socket.socket:
    """The connection that presents the link's sender secret, answered with its receiver
    secret. Connections are read side by side, each for TOKEN_S at most, and at most
    MAX_CALLERS at once: another user's connections, silent or saying something else, are
    closed and never keep the previous node out."""
    # connection -> (what it said so far, when it must have said the secret)
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
                found = _read_secret(sock, callers, hop)
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


def _read_secret(
    sock: socket.socket, callers: dict[socket.socket, tuple[bytes, float]], hop: Hop
) -> socket.socket | None:
    """`sock` once it has said the whole sender secret, and been answered; None while it has
    not (closed if it never will: it ended, or said something else)."""
    want = hop.sender.encode()
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
        with contextlib.suppress(OSError):
            sock.setblocking(True)
            sock.settimeout(STALL_S)
            sock.sendall(hop.receiver.encode())
            return sock
    sock.close()
    return None


class NotTheNextNode(ConnectionError):
    """What listens on the next node's port answered, but not the link's secret: another
    program holds the port (the node's receive ended, and someone took its place)."""


def connect_downstream(host: str, port: int, hop: Hop) -> socket.socket:
    """The next node's port, once it answered the link's receiver secret to our sender
    secret; retried while the node starts, until CONNECT_S. Nothing of the stream goes to
    what answered otherwise (NotTheNextNode, at once)."""
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            return _handshake(host, port, hop, deadline)
        except NotTheNextNode:
            raise
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def _handshake(host: str, port: int, hop: Hop, deadline: float) -> socket.socket:
    conn = socket.create_connection((host, port), timeout=10)
    try:
        conn.settimeout(max(deadline - time.monotonic(), 1.0))
        conn.sendall(hop.sender.encode())
        want, said = hop.receiver.encode(), b""
        while len(said) < len(want) and (chunk := conn.recv(len(want) - len(said))):
            said += chunk
        if len(said) < len(want):  # closed: the node may have made room for a newer caller
            raise ConnectionError(f"{host}:{port} closed the connection before it answered")
        if not hmac.compare_digest(said, want):
            raise NotTheNextNode(f"{host}:{port} did not answer as the next node of the push "
                                 "(another program holds its port)")  # fmt: skip
        conn.settimeout(STALL_S)
    except BaseException:
        conn.close()
        raise
    return conn


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
