"""The agent's channel to the head: its stdout (the ssh channel, or srun's), carrying wire
lines (remote/logwire.py): the job's output, framed, and the agent's control messages
(started, heartbeat, rank, exit). STANDARD LIBRARY ONLY (shipped inline beside the agent).

A heartbeat goes out every HEARTBEAT_S while the job runs. A write to the head that stays
blocked for STALL_S, or fails, means the head is gone: the agent then tears its job down.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

try:  # shipped inline: loaded beside the agent as orch_<name>
    import orch_logwire as logwire
except ImportError:
    from orchestrator.remote import logwire

HEARTBEAT_S = 2.0
# A write to the head blocked this long means the head is gone (frozen, or its
# network is): tear the job down rather than leave it holding the node.
STALL_S = 30.0
TAIL_BYTES = 64 * 1024
# srun carries a task's output in messages of at most 1024 bytes, whole lines while they fit:
# a longer line is cut there, and another node's lines land between its pieces. Under srun
# (a labelled channel) every line the agent writes, its label included, stays within it.
SRUN_LINE_MAX = 1024


class Channel:
    """Writes wire lines to fd 1 from one thread; notices when the head is gone. With a
    `label` (under srun, which does not name the node as pdsh does), every line starts
    with it."""

    def __init__(self, label: bytes = b"", fd: int = 1) -> None:
        self.label = label
        self.fd = fd
        # The longest wire line a framer may hand this channel (newline included).
        self.line_max = line_max(label)
        # Items are whole reads of a rank's output (up to 64 KiB of wire lines):
        # 256 of them bound the agent's memory to ~16 MiB before ranks block.
        self.outbox = Outbox(256)
        self.broken = threading.Event()
        self.busy_since: float | None = None
        self._last_beat = 0.0
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def send(self, line: bytes) -> None:
        while not self.broken.is_set():
            if self.outbox.put(line, timeout=1.0):
                return

    def control(self, kind: str, **fields: object) -> None:
        line = logwire.encode_control(kind, **fields)
        if self.line_max is not None and len(line) > self.line_max:
            line = logwire.shorten_control(kind, fields, self.line_max)
        self.send(line)

    def heartbeat(self, **fields: object) -> None:
        """A heartbeat, when the last one is HEARTBEAT_S old; call it as often as you like.
        It carries the node's wall clock: the head measures each node's offset from its own
        by it, so that ends on different nodes are ordered in one time."""
        if time.monotonic() - self._last_beat >= HEARTBEAT_S:
            line = logwire.encode_control(logwire.ControlKind.HEARTBEAT, t=round(time.time(), 4),
                                          **fields)  # fmt: skip
            # Ahead of the queued output: under a flood, up to 16 MiB waits there, and the
            # head would take that wait for the node's silence.
            self.outbox.beat(line)
            self._last_beat = time.monotonic()

    def stalled(self) -> bool:
        since = self.busy_since
        return since is not None and time.monotonic() - since > STALL_S

    def gone(self) -> bool:
        """Whether the head is gone: a write failed, or stays blocked."""
        return self.broken.is_set() or self.stalled()

    def close(self, timeout: float = 5.0) -> None:
        self.outbox.put(None, timeout=timeout)
        self.thread.join(timeout)

    def _pump(self) -> None:
        while True:
            line = self.outbox.get()
            if line is None:
                return
            self.busy_since = time.monotonic()
            if self.label:
                line = labelled(self.label, line)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(self.fd, view) :]
            except OSError:
                self.broken.set()
                return
            finally:
                self.busy_since = None


class Outbox:
    """What waits to be written to the head: the job's output in order, at most `size`
    items of it, and the newest heartbeat, which goes before all of it. A heartbeat is a
    whole wire line on its own, so it may go between any two items."""

    def __init__(self, size: int) -> None:
        self._items: deque[bytes | None] = deque()
        self._beat: bytes | None = None
        self._size = size
        self._changed = threading.Condition()

    def put(self, item: bytes | None, timeout: float) -> bool:
        """Queue `item` (None: the end); False if there was no room for `timeout` s."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._items) < self._size, timeout):
                return False
            self._items.append(item)
            self._changed.notify_all()
            return True

    def beat(self, line: bytes) -> None:
        """The heartbeat to write next; one not yet written is replaced, not queued."""
        with self._changed:
            self._beat = line
            self._changed.notify_all()

    def get(self) -> bytes | None:
        """The next thing to write, the heartbeat first; None at the end."""
        with self._changed:
            self._changed.wait_for(lambda: self._beat is not None or self._items)
            if self._beat is not None:
                line, self._beat = self._beat, None
                return line
            item = self._items.popleft()
            self._changed.notify_all()
            return item


def line_max(label: bytes) -> int | None:
    """The longest wire line (newline included) a channel with `label` carries whole: under
    srun (a labelled channel) what fits one of its messages with the label; None under pdsh,
    whose bound CHUNK_BYTES keeps."""
    return SRUN_LINE_MAX - len(label) if label else None


def labelled(label: bytes, lines: bytes) -> bytes:
    """Wire lines (each ending in a newline) with `label` before each."""
    return label + lines[:-1].replace(b"\n", b"\n" + label) + lines[-1:]


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


class OutputPump:
    """Copies one output stream (the launcher's pipe, or a rank's connection) to its raw file
    and, framed by logwire, to the head, until the stream ends."""

    def __init__(
        self, channel: Channel, framer: logwire.WireFramer, raw: Path, tail: Tail | None
    ) -> None:
        self.channel = channel
        self.framer = framer
        self.raw = raw
        self.tail = tail

    def run(self, read: Callable[[], bytes]) -> None:
        # Readable by the user alone, and never written through a link.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        with os.fdopen(os.open(self.raw, flags, 0o600), "ab") as log:
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
