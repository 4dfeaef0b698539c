"""One node's head-side log file: its ranks' wire records in, readable lines out.

`NodeLogWriter` writes `runs/<id>/logs/<node>.log` (logs/router.py hands it each node's
records from pdsh's output):

    2026-11-21T23:30:01.123Z out step 10 loss 0.25
    2026-11-21T23:30:01.125Z err 100%|##########| 100/100 [00:01<00:00]

    2026-11-21T23:30:01.130Z r3/1 out step 10 loss 0.25

one line per line the job printed, each with the time the head received it, the
rank that wrote it (`r<global rank>/<local rank>`; no rank: the node's launcher)
and its stream (`out`, `err`; `sys` for plain output outside the wire, `orch` for
what the node agent reported). Each rank's partial lines and frames are kept
apart from every other rank's. Progress frames are collapsed: only a bar's final
frame is kept (plus one sample every `frame_sample_interval` seconds of a long
bar); no `\\r` or terminal escape codes reach the file; bytes that are not UTF-8
are written as they came. Memory is bounded: nothing is held but the partial
line of each stream, capped at `max_line_bytes` (a longer line is written in
pieces, the later ones tagged `out+` / `err+`).

Pure apart from writing the files: no subprocess, no network.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.remote.logwire import (
    KIND_CHUNK,
    KIND_FRAME,
    KIND_LINE,
    KIND_PARTIAL,
    ControlKind,
)

_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND
_STREAM_TAG = {ord("o"): b"out", ord("e"): b"err"}
_ANSI = re.compile(
    rb"\x1b(?:\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erase
    rb"|\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks
    rb"|[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    rb"|[ -/]*[0-~])?"  # two-byte escapes; a lone ESC goes too
)
_BLANK = b" \t\x0b\x0c"
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
DEFAULT_FRAME_SAMPLE_S = 30.0
STAMP_LEN = len("2026-11-21T23:30:01.123Z")


def strip_terminal_codes(data: bytes) -> bytes:
    """Remove ANSI escape sequences and any \\r (keeping what a terminal would show last)."""
    if b"\r" in data:
        parts = [p for p in data.split(b"\r") if p.strip(_BLANK)]
        data = parts[-1] if parts else data.replace(b"\r", b"")
    if b"\x1b" in data:
        data = _ANSI.sub(b"", data)
    return data


class Timestamps:
    """ISO-8601 UTC with milliseconds, formatted once per second, not once per line.

    Standalone, every write takes the time; under a LogRouter the router takes
    it once per batch of pdsh output (those lines all arrived at that instant).
    """

    def __init__(self, clock: Callable[[], float], per_write: bool = True) -> None:
        self.clock = clock
        self.per_write = per_write
        self._second = -1
        self._prefix = b""
        self.t = 0.0
        self.current = b""
        self.refresh()

    def refresh(self) -> float:
        t = self.clock()
        second = int(t)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)).encode()
        self.t = t
        self.current = b"%s.%03dZ " % (self._prefix, int((t - second) * 1000))
        return t


class _StreamState:
    __slots__ = (
        "chunks", "chunks_len", "frame", "frame_since", "last_written_frame", "pieces", "tag",
    )  # fmt: skip

    def __init__(self, tag: bytes) -> None:
        self.tag = tag  # what the log line says of its source: b"out", b"r3/1 err"
        self.chunks: list[bytes] = []
        self.chunks_len = 0
        self.pieces = 0  # pieces of an over-long line already written
        self.frame: bytes | None = None  # latest non-blank frame of the current bar
        self.frame_since = 0.0  # when the current bar's frame was last sampled
        self.last_written_frame: bytes | None = None


class NodeLogWriter:
    """Writes one node's head-side log file; see the module docstring for the format."""

    def __init__(
        self,
        path: str | Path,
        *,
        frame_sample_interval: float | None = DEFAULT_FRAME_SAMPLE_S,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        flush_interval: float = 0.5,
        clock: Callable[[], float] = time.time,
        fd: int | None = None,
    ) -> None:
        """`fd`: the file, opened for appending by whoever holds its directory (a job's
        run directory: records/rundir.py); None: `path` is opened here, its folder made
        when missing. Either way never through a link."""
        self.path = Path(path)
        if fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, _APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        self._file = os.fdopen(fd, "ab", buffering=256 * 1024)
        self._stamps = Timestamps(clock)
        self._streams: dict[tuple[bytes, int], _StreamState] = {}
        self._sample = frame_sample_interval
        self._max_line = max_line_bytes
        self._flush_interval = flush_interval
        self._flushed_at = 0.0
        self.lines_written = 0

    # -- input ------------------------------------------------------------

    def _new_state(self, rank: bytes, stream: int) -> _StreamState | None:
        tag = _STREAM_TAG.get(stream)
        if tag is None:
            return None
        state = self._streams[(rank, stream)] = _StreamState(
            b"r" + rank + b" " + tag if rank else tag
        )
        return state

    def write_wire(self, kind: int, stream: int, data: bytes, rank: bytes = b"") -> bytes | None:
        """One wire record, already unescaped (see logwire.parse_wire); `rank` the label of
        the rank that wrote it (b"3/1"), b"" for the node's launcher. Returns the line or
        frame it completes as the file has it (its chunks rejoined; a bar's frame for the
        blank line that ends it); None for a chunk."""
        # A stream's state is looked up inline: this runs once per line of the job.
        state = self._streams.get((rank, stream)) or self._new_state(rank, stream)
        if state is None:
            return None
        if kind == KIND_LINE and not state.chunks and state.frame is None and not state.pieces:
            self._write(state.tag, data)  # the common case, kept short
            return data
        if kind == KIND_CHUNK:
            self._add_chunk(state, data)
            return None
        if state.chunks:
            state.chunks.append(data)
            data = b"".join(state.chunks)
            state.chunks, state.chunks_len = [], 0
        if kind == KIND_FRAME:
            self._on_frame(state, data)
        elif kind in (KIND_LINE, KIND_PARTIAL):
            data = self._on_line(state, data)
        return data

    def write_plain(self, data: bytes) -> None:
        """Output that did not come through the wire (ssh errors, a crashed agent)."""
        self._write(b"sys", strip_terminal_codes(data))

    def note(self, text: str) -> None:
        """A line from orch itself (agent started, exit code, ...)."""
        self._write(b"orch", text.encode("utf-8", "backslashreplace"))

    def note_control(self, kind: str, fields: dict) -> None:
        if kind == ControlKind.HEARTBEAT:
            return
        details = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(fields.items()))
        self.note(f"{kind} {details}".rstrip())

    # -- frames and lines -------------------------------------------------

    def _add_chunk(self, state: _StreamState, data: bytes) -> None:
        state.chunks.append(data)
        state.chunks_len += len(data)
        if state.chunks_len >= self._max_line:
            # Bounded memory: write what we have; the rest follows as a tagged piece.
            piece = b"".join(state.chunks)
            state.chunks, state.chunks_len = [], 0
            self._write(self._piece_tag(state), piece)

    def _piece_tag(self, state: _StreamState) -> bytes:
        state.pieces += 1
        return state.tag if state.pieces == 1 else state.tag + b"+"

    def _on_frame(self, state: _StreamState, data: bytes) -> None:
        if not data.strip(_BLANK):
            self._end_bar(state)  # a blank frame clears the bar: keep its last frame
            return
        state.pieces = 0
        stamps = self._stamps
        now = stamps.refresh() if stamps.per_write else stamps.t
        if state.frame is None:
            state.frame_since = now
        state.frame = data
        if self._sample is not None and now - state.frame_since >= self._sample:
            state.frame_since = now
            self._write_frame(state, data)

    def _write_frame(self, state: _StreamState, data: bytes) -> None:
        if data != state.last_written_frame:
            self._write(state.tag, data)
            state.last_written_frame = data

    def _end_bar(self, state: _StreamState) -> None:
        if state.frame is not None:
            self._write_frame(state, state.frame)
        state.frame = None
        state.last_written_frame = None

    def _on_line(self, state: _StreamState, data: bytes) -> bytes:
        """Write the line; returns its text (a bar's frame for the blank line ending it)."""
        if state.frame is not None and not data.strip(_BLANK):
            data = state.frame  # "frame\r\n": the line is the frame it shows
        tag = state.tag
        if state.pieces:
            tag = self._piece_tag(state)
            state.pieces = 0
        state.frame = None
        state.last_written_frame = None
        self._write(tag, data)
        return data

    # -- output -----------------------------------------------------------

    def _write(self, tag: bytes, data: bytes) -> None:
        if data.find(b"\x1b") >= 0:  # once per line: find is twice as fast as `in` on bytes
            data = _ANSI.sub(b"", data)
        stamps = self._stamps
        if stamps.per_write:
            t = stamps.refresh()
            if t - self._flushed_at >= self._flush_interval:
                self._flushed_at = t
                self._file.flush()
        self._file.write(b"%s%s %s\n" % (stamps.current, tag, data))
        self.lines_written += 1

    def share_timestamps(self, stamps: Timestamps) -> None:
        """Take the time from `stamps` (refreshed by the caller once per batch)."""
        self._stamps = stamps

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        """End of the job's output: keep unfinished lines and each bar's last frame."""
        if self._file.closed:
            return
        for state in self._streams.values():
            if state.chunks:
                data = b"".join(state.chunks)
                state.chunks, state.chunks_len = [], 0
                self._on_line(state, data)
            self._end_bar(state)
        self._file.close()

    def __enter__(self) -> NodeLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
