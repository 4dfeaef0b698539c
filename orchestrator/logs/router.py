"""Head side of the log path: pdsh's merged output in, one log writer per node.

pdsh prints every node's output as `node: payload` (nodes/pdsh.py's split_node_line reads
it). Each payload is a wire line (logwire's parse_wire reads it) or plain output from
outside the job (an ssh error, a shell message). `LogRouter` splits pdsh's stream by
node and hands each node's records to its `NodeLogWriter` (logs/writer.py, which writes
`runs/<id>/logs/<node>.log`), the control records back to the launcher, and lines and
frames to a live view (`LogView`) when there is one.

Pure apart from writing the files: no subprocess, no network.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from orchestrator.logs.writer import NodeLogWriter, Timestamps
from orchestrator.nodes.pdsh import is_pdsh_own, split_node_line
from orchestrator.records.job import HEAD_NODE, log_file_name
from orchestrator.remote.logwire import (
    KIND_CONTROL,
    KIND_FRAME,
    STREAM_NAME,
    WireRecord,
    decode_control,
    parse_wire,
)

SMALL_BATCH_LINES = 256
VIEW_LINE_MAX = 64 * 1024  # what the live view (and a failure's last lines) takes of a line
MAX_PENDING_BYTES = 1 << 20


class LogView(Protocol):
    """What a live display receives from the router (see logs/view.py)."""

    def line(self, node: str, stream: str, data: bytes, rank: str = "") -> None: ...
    def frame(self, node: str, stream: str, data: bytes, rank: str = "") -> None: ...
    def control(self, node: str, kind: str, fields: dict) -> None: ...


class LogRouter:
    """Feeds pdsh's stdout, in chunks of any size, into one NodeLogWriter per node.

    `feed` returns the control records (node, record) in arrival order, for the
    launcher to act on (started, heartbeat, exit); lines and frames also go to
    `view` when one is given. `open_log`, when given, opens a node's log file by its name
    for appending (in the job's run directory, held open: records/rundir.py); without it,
    files are opened by path in `logs_dir`, made when missing.
    """

    def __init__(
        self,
        logs_dir: str | Path,
        *,
        view: LogView | None = None,
        writer_factory: Callable[[Path], NodeLogWriter] | None = None,
        nodes: Iterable[str] | None = None,
        open_log: Callable[[str], int] | None = None,
    ) -> None:
        self.logs_dir = Path(logs_dir)
        # The job's nodes, when known: the head launcher's own `WARNING: ...` lines
        # look like pdsh's `node: ...` and must not become a node of their own.
        self._known = None if nodes is None else {n.encode() for n in nodes}
        if open_log is None:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._view = view
        self._open_log = open_log
        self._factory = writer_factory or self._open_writer
        self._writers: dict[bytes, NodeLogWriter] = {}
        self._names: dict[bytes, str] = {}
        self._pdsh_sources: set[bytes] = set()  # pdsh's own voices (`pdsh@head`)
        self._rest = b""
        self._stamps = Timestamps(time.time, per_write=False)
        self._flushed_at = 0.0
        self.flush_interval = 0.5
        self.lines = 0

    def writer(self, node: str) -> NodeLogWriter:
        return self._writer_for(node.encode())

    def _writer_for(self, node: bytes) -> NodeLogWriter:
        writer = self._writers.get(node)
        if writer is not None:
            return writer
        name = node.decode("utf-8", "replace")
        if node and not is_pdsh_own(name):
            return self._new_writer(node, name)
        # pdsh's own messages (`pdsh@head: n2: ssh exited ...`) share the head's file; the
        # view still sees who said it, so it can tell pdsh's voice from a node's.
        writer = self._writers.get(b"") or self._new_writer(b"", HEAD_NODE)
        if node:
            self._pdsh_sources.add(node)
            self._writers[node] = writer
            self._names[node] = name
        return writer

    def _open_writer(self, path: Path) -> NodeLogWriter:
        opened = self._open_log
        return NodeLogWriter(path, fd=None if opened is None else opened(path.name))

    def _new_writer(self, node: bytes, name: str) -> NodeLogWriter:
        writer = self._factory(self.logs_dir / log_file_name(name))
        writer.share_timestamps(self._stamps)
        self._writers[node] = writer
        self._names[node] = name
        return writer

    def _is_source(self, node: bytes) -> bool:
        known = self._known
        return known is None or node in known or is_pdsh_own(node.decode("utf-8", "replace"))

    @property
    def nodes(self) -> list[str]:
        return [self._names[n] for n in self._writers if n and n not in self._pdsh_sources]

    def feed(self, data: bytes) -> list[tuple[str, WireRecord]]:
        """pdsh's output, in chunks of any size."""
        if self._rest:
            data = self._rest + data
        lines = data.split(b"\n")
        self._rest = lines.pop()
        if len(self._rest) > MAX_PENDING_BYTES:
            # pdsh never prints a line this long; whatever this is, keep memory bounded.
            lines.append(self._rest)
            self._rest = b""
        return self.feed_lines(lines)

    def feed_lines(self, lines: Sequence[bytes]) -> list[tuple[str, WireRecord]]:
        """Complete pdsh lines, without their newline."""
        controls: list[tuple[str, WireRecord]] = []
        writers = self._writers
        view = self._view
        count = len(lines)
        now = self._stamps.refresh()
        for line in lines:
            node, payload = split_node_line(line)
            writer = writers.get(node)
            if writer is None:
                if node and not self._is_source(node):
                    node, payload = b"", line
                writer = self._writer_for(node)
            wire = parse_wire(payload)
            if wire is None:
                self._plain(node, writer, payload)
                continue
            kind, stream, rank, body = wire
            if kind == KIND_CONTROL:
                self._control(node, writer, body, controls)
                continue
            # The view sees each line from its start, however many records it took (srun's
            # are short), up to VIEW_LINE_MAX.
            whole = writer.write_wire(kind, stream, body, rank)
            if view is not None and whole is not None:
                show = view.frame if kind == KIND_FRAME else view.line
                show(self._names[node], STREAM_NAME.get(stream, ""), whole[:VIEW_LINE_MAX],
                     rank.decode("ascii", "replace"))  # fmt: skip
        self.lines += count
        # A small batch means the nodes are quiet: flushing is cheap then, and
        # `orch logs --follow` sees a slow job's last line at once (the agents'
        # heartbeats make a small batch at least every few seconds).
        if count < SMALL_BATCH_LINES or now - self._flushed_at >= self.flush_interval:
            self.flush()
        return controls

    def flush(self) -> None:
        self._flushed_at = self._stamps.t
        for writer in set(self._writers.values()):
            writer.flush()

    def _control(
        self, node: bytes, writer: NodeLogWriter, body: bytes,
        controls: list[tuple[str, WireRecord]],
    ) -> None:  # fmt: skip
        record = decode_control(body)
        if record is None:
            return
        writer.note_control(record.text, record.fields)
        controls.append((self._names[node], record))
        if self._view is not None:
            self._view.control(self._names[node], record.text, record.fields)

    def _plain(self, node: bytes, writer: NodeLogWriter, payload: bytes) -> None:
        writer.write_plain(payload)
        if node in self._pdsh_sources:
            # `n2: ssh exited with exit code 255` also belongs in n2's own log.
            target = self._writers.get(split_node_line(payload)[0])
            if target is not None and target is not writer:
                target.write_plain(payload)
        if self._view is not None:
            self._view.line(self._names[node], "sys", payload)

    def close(self) -> None:
        if self._rest:
            rest, self._rest = self._rest, b""
            self.feed_lines([rest])
        for writer in set(self._writers.values()):
            writer.close()

    def __enter__(self) -> LogRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
