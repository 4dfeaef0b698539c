"""What the head shows while a job runs.

On a terminal (`LiveView`): a rich Live block with one line per node showing
its latest progress frame or output line, updated in place, while output lines
scroll above it, prefixed with the node and the rank that wrote them (none
for the launcher). A job that prints faster than anyone can read may not cost the
head: at most `max_lines_per_second` lines reach the screen, the rest are
counted ("... 12000 lines not shown") and are all in `orch logs`.

Not a terminal (`PlainView`: CI, `| tee`): plain `node: text` lines, no escape
codes, and progress frames throttled to one per node every `frame_interval`
seconds so the output stays readable. A frame shown waits up to `frame_hold` seconds
before it is printed: when the bar's own final line (tqdm's close) follows with the same
count, only that line is printed, not the same 100% twice. Each rank's frame waits for that
rank's next line: another rank's output between them (a node runs several) prints nothing
early.

Both take bytes from the log router (see logs/router.py's LogView) and must be closed.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import BinaryIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.logs.writer import strip_terminal_codes
from orchestrator.nodes.pdsh import is_pdsh_own
from orchestrator.records.job import HEAD_NODE
from orchestrator.remote.logwire import ControlKind, global_rank

MAX_SHOWN_CHARS = 2000  # a 1 MiB line goes to the log file, not to the screen
_HEAD = "head"
_COUNT = re.compile(rb"\d+/\d+")  # a bar's n/total


def _display_text(data: bytes, limit: int = MAX_SHOWN_CHARS) -> str:
    text = strip_terminal_codes(data).decode("utf-8", "backslashreplace")
    text = text.replace("\t", "    ")
    return text if len(text) <= limit else text[:limit] + f"... ({len(data)} bytes)"


def _is_fanout(node: str) -> bool:
    return node == HEAD_NODE or is_pdsh_own(node) or not node


def _label(node: str, rank: str = "") -> str:
    """`node`, or `node rR` for a line of global rank R."""
    number = global_rank(rank)
    name = node or _HEAD
    return name if number is None else f"{name} r{number}"


def _bar_position(data: bytes) -> bytes | None:
    """A progress bar's text up to its count (`train: 100%|###| 40/40`), None without one."""
    found = _COUNT.search(data)
    return data[: found.end()] if found else None


class _HeldFrame:
    __slots__ = ("position", "since", "source", "text")

    def __init__(self, source: tuple[str, str], data: bytes, text: bytes, since: float) -> None:
        self.source, self.text, self.since = source, text, since
        self.position = _bar_position(data)


class PlainView:
    """Prefixed lines on a byte stream; frames throttled per node. Thread-safe."""

    def __init__(
        self,
        out: BinaryIO | None = None,
        *,
        frame_interval: float = 5.0,
        frame_hold: float = 1.0,
        flush_interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out if out is not None else sys.stdout.buffer
        self._frame_interval = frame_interval
        self._frame_hold = frame_hold
        self._clock = clock
        self._last_frame: dict[str, float] = {}
        # (node, rank) -> the frame it shows next: each rank's own, as each rank's bar has
        # its own close to wait for.
        self._held: dict[tuple[str, str], _HeldFrame] = {}
        self._lock = threading.Lock()
        self._prefixes: dict[tuple[str, str], bytes] = {}
        self._dirty = False
        self._broken = False
        self._closed = threading.Event()
        self._flush_interval = flush_interval
        # Flushing every line would cost a syscall per line; a slow job's output
        # still shows within flush_interval.
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True)
        self._flusher.start()
        atexit.register(self.close)  # a view nobody closed still ends its output

    def _prefix(self, node: str, rank: str) -> bytes:
        prefix = self._prefixes.get((node, rank))
        if prefix is None:
            prefix = _label(node, rank).encode() + b": "
            self._prefixes[(node, rank)] = prefix
        return prefix

    def line(self, node: str, stream: str, data: bytes, rank: str = "") -> None:
        if b"\x1b" in data or b"\r" in data:
            data = strip_terminal_codes(data)
        with self._lock:
            held = self._held.pop((node, rank), None)
            if held is not None and not _closes(held, (rank, stream), data):
                self._write(held.text)
            self._write(self._prefix(node, rank) + data + b"\n")
        self._last_frame.pop(node, None)  # a new bar starts with its first frame shown

    def frame(self, node: str, stream: str, data: bytes, rank: str = "") -> None:
        # One frame per node per interval: the nodes' bars move together.
        now = self._clock()
        last = self._last_frame.get(node)
        if last is not None and now - last < self._frame_interval:
            return
        self._last_frame[node] = now
        data = strip_terminal_codes(data)
        held = _HeldFrame((rank, stream), data, self._prefix(node, rank) + data + b"\n", now)
        with self._lock:
            earlier = self._held.pop((node, rank), None)
            # The same count drawn again (tqdm's close redraws its last update): one is enough.
            if earlier is not None and not _closes(earlier, (rank, stream), data):
                self._write(earlier.text)
            self._held[(node, rank)] = held

    def _print_held(self, older_than: float | None) -> None:
        """Print the held frames (those held longer than `older_than` seconds)."""
        now = self._clock()
        with self._lock:
            for source, held in list(self._held.items()):
                if older_than is None or now - held.since >= older_than:
                    del self._held[source]
                    self._write(held.text)

    def control(self, node: str, kind: str, fields: dict) -> None:
        pass

    def status(self, text: str) -> None:
        """A line of orch's own about the job (a stop under way)."""
        with self._lock:
            self._write(f"{_HEAD}: {text}\n".encode())

    def _write(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            self._out.write(data)
        except (OSError, ValueError):
            self._broken = True  # e.g. `| head` exited: keep the job going, logs have it all
        self._dirty = True

    def _flush_loop(self) -> None:
        while not self._closed.wait(self._flush_interval):
            self._print_held(self._frame_hold)
            self.flush()

    def flush(self) -> None:
        if self._dirty:
            self._dirty = False
            # stdout may be gone (a closed pipe): the log files still have it all.
            with contextlib.suppress(OSError, ValueError):
                self._out.flush()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._flusher.join(2.0)
        self._print_held(None)
        self.flush()
        atexit.unregister(self.close)

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _closes(held: _HeldFrame, source: tuple[str, str], line: bytes) -> bool:
    """The line (or frame) is the held bar's own last render (tqdm's close): same rank,
    stream, count."""
    return held.source == source and held.position is not None and (
        _bar_position(line) == held.position
    )


class _NodeRow:
    __slots__ = ("latest", "state")

    def __init__(self) -> None:
        self.state = "waiting"
        self.latest = ""


class LiveView:
    """rich Live: one row per node (its latest frame or line), output lines scrolling above."""

    def __init__(
        self,
        nodes: Sequence[str] = (),
        *,
        console: Console | None = None,
        max_lines_per_second: int = 2000,
        tick: float = 0.1,
    ) -> None:
        self.console = console if console is not None else Console(highlight=False)
        self._rows: dict[str, _NodeRow] = {node: _NodeRow() for node in nodes}
        self._caption = ""  # which attempt runs, and why the last one ended
        self._status = ""  # what orch is doing with the job (a stop under way)
        self._pending: deque[tuple[str, str, bytes]] = deque()
        self._budget = max(1, int(max_lines_per_second * tick))
        self._hidden = 0
        self._lock = threading.Lock()
        self._tick = tick
        self._closed = threading.Event()
        self._live = Live(
            self, console=self.console, refresh_per_second=4, redirect_stdout=False,
            redirect_stderr=False, transient=False,
        )  # fmt: skip
        self._live.start()
        self._printer = threading.Thread(target=self._print_loop, daemon=True)
        self._printer.start()
        atexit.register(self.close)  # a view nobody closed still restores the terminal

    # -- LogView -----------------------------------------------------------

    def _row(self, node: str) -> _NodeRow:
        row = self._rows.get(node)
        if row is None:
            with self._lock:
                row = self._rows.setdefault(node, _NodeRow())
        return row

    def line(self, node: str, stream: str, data: bytes, rank: str = "") -> None:
        with self._lock:
            if len(self._pending) < self._budget:
                self._pending.append((node, rank, data))
            else:
                self._hidden += 1
        if not _is_fanout(node):
            self.frame(node, stream, data, rank)

    def frame(self, node: str, stream: str, data: bytes, rank: str = "") -> None:
        # One row per node: its latest line or frame, whichever rank wrote it.
        row = self._row(node)
        text = data[:400].decode("utf-8", "replace")
        number = global_rank(rank)
        row.latest = text if number is None else f"r{number} {text}"
        if row.state == "waiting":
            row.state = "running"

    def control(self, node: str, kind: str, fields: dict) -> None:
        row = self._row(node)
        if kind == ControlKind.STARTED:
            row.state = "running"
        elif kind == ControlKind.EXIT:
            code = fields.get("code")
            row.state = "done" if code == 0 else f"exit {code}"

    def new_attempt(self, nodes: Sequence[str], caption: str) -> None:
        """A restart: the next attempt's nodes replace the rows (a node dropped after the last
        attempt leaves the view), under a line that says which attempt runs and why."""
        with self._lock:
            self._rows = {node: _NodeRow() for node in nodes}
            self._caption = caption
            self._status = ""

    def status(self, text: str) -> None:
        """A line above the nodes' rows that says what orch is doing (a stop under way)."""
        with self._lock:
            self._status = text

    # -- rendering -----------------------------------------------------------

    def __rich__(self) -> Table:
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(no_wrap=True, style="bold")
        table.add_column(no_wrap=True)
        table.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
        with self._lock:
            rows = list(self._rows.items())
            caption, status = self._caption, self._status
        for line in filter(None, (caption, status)):
            table.add_row("", "", Text(line, style="yellow", overflow="ellipsis"))
        for node, row in rows:
            style = "green" if row.state == "done" else "red" if "exit" in row.state else ""
            latest = Text(strip_terminal_codes(row.latest.encode()).decode(), overflow="ellipsis")
            table.add_row(_label(node), Text(row.state, style=style), latest)
        return table

    def _drain(self) -> None:
        with self._lock:
            batch = list(self._pending)
            self._pending.clear()
            hidden, self._hidden = self._hidden, 0
        if not batch and not hidden:
            return
        lines = [
            Text.assemble((_label(node, rank) + ": ", "dim"), _display_text(data))
            for node, rank, data in batch
        ]
        if hidden:
            lines.append(Text(f"... {hidden} lines not shown (all are in `orch logs`)", "dim"))
        self._live.console.print(Group(*lines), soft_wrap=True)

    def _print_loop(self) -> None:
        while not self._closed.wait(self._tick):
            self._drain()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._printer.join(2.0)
        self._drain()
        self._live.stop()
        atexit.unregister(self.close)

    def __enter__(self) -> LiveView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_view(
    nodes: Sequence[str] = (),
    *,
    tty: bool | None = None,
    frame_interval: float = 5.0,
    to_stderr: bool = False,
) -> LiveView | PlainView:
    """The live view on a terminal, plain throttled lines otherwise; on stdout, or on
    stderr (`to_stderr`: stdout is kept for a JSON document)."""
    stream = sys.stderr if to_stderr else sys.stdout
    if tty is None:
        tty = stream.isatty()
    if tty:
        return LiveView(nodes, console=Console(highlight=False, stderr=to_stderr))
    return PlainView(stream.buffer, frame_interval=frame_interval)
