"""The wire format that carries a node's job output through pdsh to the head.

Standard library only: this file is shipped inline to every node together
with the node agent, so it imports nothing from orch or third parties.

Why a wire format at all: pdsh forwards a node's output line by line, so tqdm's
`\\r` frames pile up into one giant line; a NUL byte ends pdsh's line (the rest
is lost); a line longer than pdsh's buffer (128 KiB) is cut and the rest
dropped. srun, the other fan-out, sends a node's output in messages of 1024
bytes, whole lines while they fit: a longer line is cut, and other nodes'
lines land between its pieces (a framer given `max_line` keeps under it). The
node therefore re-frames each output stream into short, safe wire lines:

    %o1<kind><stream>[:<rank>/<local rank>] <payload>\\n

A record of one rank's own output (the per-rank channel) names that rank
after its stream; a record without it is the node's launcher's output.
kind: ``L`` a line (its ``\\n`` removed), ``F`` a progress frame (what the
terminal shows after a ``\\r``), ``P`` the last line of a stream that had no
final newline, ``C`` a chunk of a long segment that continues in the next
record of the same stream (rejoined on the head), ``K`` a control message
(payload is JSON). stream: ``o`` stdout, ``e`` stderr, ``-`` none.

Payload escaping keeps every byte, reversibly: ``\\`` becomes ``\\\\``, NUL and
bytes that are not valid UTF-8 become ``\\xHH``. Valid UTF-8 passes unchanged,
so the common case costs a few scans and no copy.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field
from enum import Enum

MAGIC = b"%o1"
# Raw bytes per wire record. Escaping can grow a chunk at most 4x, which keeps
# the longest wire line (64 KiB + header) well under pdsh's 128 KiB line buffer.
CHUNK_BYTES = 16 * 1024

# The kind byte of each record (see the module docstring).
KIND_LINE, KIND_PARTIAL, KIND_FRAME, KIND_CHUNK, KIND_CONTROL = b"LPFCK"
_STREAM_CODE = {"out": b"o", "err": b"e"}
STREAM_NAME = {ord("o"): "out", ord("e"): "err", ord("-"): ""}
_CR_OR_LF = re.compile(rb"[\r\n]")
_ESCAPE_SEQ = re.compile(rb"\\(\\|x[0-9a-fA-F]{2}|.?)", re.DOTALL)
# Once the \\\\ pairs are taken out: a backslash escape_payload never writes.
_BAD_ESCAPE = re.compile(rb"\\(?!x[0-9a-fA-F]{2})")
_SURROGATE_RUN = re.compile("[\udc80-\udcff]+")
_BLANK = b" \t\x0b\x0c"
_RANK_LABEL = re.compile(r"\d+/\d+")
_MIN_ROOM = 64


def escape_payload(data: bytes) -> bytes:
    """Make `data` (no \\r or \\n in it) safe for one pdsh line, reversibly."""
    if b"\\" in data:
        data = data.replace(b"\\", b"\\\\")
    if b"\x00" in data:
        data = data.replace(b"\x00", b"\\x00")
    if data.isascii():
        return data
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        # surrogateescape keeps each undecodable byte as one surrogate; each run
        # of them becomes \xHH... in one step (an error-handler callback per byte is slow).
        text = data.decode("utf-8", "surrogateescape")
        return _SURROGATE_RUN.sub(_escape_run, text).encode("utf-8")
    return data


def _escape_run(match: re.Match[str]) -> str:
    raw = match.group().encode("utf-8", "surrogateescape")
    return "\\x" + raw.hex("x").replace("x", "\\x")


def unescape_payload(payload: bytes) -> bytes:
    """Inverse of escape_payload: the original bytes."""
    if b"\\" not in payload:
        return payload
    if _BAD_ESCAPE.search(payload.replace(b"\\\\", b"")) is None:
        # Only \\ and \xHH occur, which Python's bytes-literal decoder reads in C.
        return codecs.escape_decode(payload)[0]  # type: ignore[attr-defined]
    return _ESCAPE_SEQ.sub(_unescape_match, payload)


def _unescape_match(match: re.Match[bytes]) -> bytes:
    body = match.group(1)
    if body == b"\\":
        return b"\\"
    if body[:1] == b"x" and len(body) == 3:
        return bytes((int(body[1:], 16),))
    return match.group(0)  # not ours: keep it as it came


def _is_blank(segment: bytes) -> bool:
    return not segment.strip(_BLANK)


class WireFramer:
    """Turns one output stream of a job into wire lines, whatever the chunking of the input.

    Frames are collapsed within one `feed`: only the latest frame of a burst is
    sent (the head keeps only the last one anyway), except that a frame which is
    about to be cleared by a blank one is sent first, with the blank one, so a
    bar's final frame is never lost. Empty frames (``\\r\\r``) are ignored. The
    text a terminal shows after a ``\\r`` is sent as a frame at the end of each
    `feed`, so the head sees progress as soon as it is printed.
    """

    def __init__(self, stream: str, rank: str = "", max_line: int | None = None) -> None:
        """`max_line`: the longest wire line (its newline included) the channel carries whole
        (srun's messages); a longer record goes in C records first. None: pdsh's own bound,
        which CHUNK_BYTES keeps."""
        if stream not in _STREAM_CODE:
            raise ValueError(f"stream must be 'out' or 'err', not {stream!r}")
        if rank and _RANK_LABEL.fullmatch(rank) is None:
            raise ValueError(f"rank label must read <rank>/<local rank>, not {rank!r}")
        code = _STREAM_CODE[stream] + (b":" + rank.encode() if rank else b"")
        self.stream = stream
        self._line = MAGIC + b"L" + code + b" "
        self._frame = MAGIC + b"F" + code + b" "
        self._chunk = MAGIC + b"C" + code + b" "
        self._partial = MAGIC + b"P" + code + b" "
        # The room for a record's escaped payload: a fraction of a short line at the least.
        self._room = None if max_line is None else max_line - len(self._line) - 1
        if self._room is not None and self._room < _MIN_ROOM:
            raise ValueError(f"a wire line of {max_line} bytes leaves no room for its text")
        self._buf = b""  # the current segment, not yet sent
        self._chunked = False  # part of the current segment already went out as C records
        self._after_cr = False  # the current segment follows a \r on the same line
        self._pending: bytes | None = None  # latest frame of this feed, not yet sent
        self._sent_frame: bytes | None = None  # last frame sent on the current line
        self._bar_open = False  # a non-blank frame was sent or is pending on this line

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        if not data:
            return out
        if b"\r" not in data and not self._after_cr and self._pending is None:
            self._feed_lines(data, out)
        else:
            self._feed_general(data, out)
        return out

    def flush(self) -> list[bytes]:
        """At end of stream: the pending partial line (no final newline), as a P record."""
        out: list[bytes] = []
        self._send_pending(out)
        if self._buf or self._chunked:
            self._put(self._partial, self._buf, out)
        self._buf = b""
        self._chunked = False
        self._after_cr = False
        self._sent_frame = None
        self._bar_open = False
        return out

    # -- the common case: plain lines, no \r anywhere near ------------------

    def _feed_lines(self, data: bytes, out: list[bytes]) -> None:
        parts = data.split(b"\n")
        rest = parts.pop()
        if parts:
            if self._buf or self._chunked:
                self._end_line(self._buf + parts[0], out)
                parts = parts[1:]
            head = self._line
            room = self._room
            for segment in parts:
                if len(segment) > CHUNK_BYTES:
                    self._end_line(segment, out)
                elif room is None:
                    out.append(head + escape_payload(segment) + b"\n")
                else:
                    self._put(head, segment, out)
            self._buf = rest
        else:
            self._buf += rest
        self._spill_chunks(out)

    def _end_line(self, segment: bytes, out: list[bytes]) -> None:
        self._buf = segment
        self._spill_chunks(out)
        self._put(self._line, self._buf, out)
        self._buf = b""
        self._chunked = False

    def _spill_chunks(self, out: list[bytes]) -> None:
        # A segment too long for one wire line goes out in C records as it grows,
        # so neither side ever holds more than a chunk of it.
        buf = self._buf
        if len(buf) <= CHUNK_BYTES:
            return
        self._send_pending(out)
        start = 0
        while len(buf) - start > CHUNK_BYTES:
            self._put(self._chunk, buf[start : start + CHUNK_BYTES], out)
            start += CHUNK_BYTES
        self._buf = buf[start:]
        self._chunked = True

    # -- the general case: \r frames --------------------------------------

    def _feed_general(self, data: bytes, out: list[bytes]) -> None:
        pos = 0
        for match in _CR_OR_LF.finditer(data):
            end = match.start()
            self._buf += data[pos:end]
            pos = end + 1
            if data[end] == 0x0A:
                self._on_newline(out)
            else:
                self._on_carriage_return(out)
        self._buf += data[pos:]
        self._spill_chunks(out)
        if self._after_cr and self._buf and not self._chunked and not _is_blank(self._buf):
            self._set_frame(self._buf, out)  # what the terminal shows right now
        self._send_pending(out)

    def _on_newline(self, out: list[bytes]) -> None:
        if self._pending is not None and not self._chunked and _is_blank(self._buf):
            self._send_pending(out)  # "text\r\n": the head keeps the frame as the line
        self._pending = None
        self._end_line(self._buf, out)
        self._after_cr = False
        self._sent_frame = None
        self._bar_open = False

    def _on_carriage_return(self, out: list[bytes]) -> None:
        self._spill_chunks(out)
        segment, self._buf = self._buf, b""
        if self._chunked:
            self._put(self._frame, segment, out)
            self._chunked = False
            self._sent_frame = None
            self._bar_open = True
        elif segment:
            self._set_frame(segment, out)
        self._after_cr = True

    def _set_frame(self, segment: bytes, out: list[bytes]) -> None:
        if not _is_blank(segment):
            self._pending = segment
            self._bar_open = True
        elif self._bar_open:
            # A blank frame clears a bar: the head keeps the bar's last frame then.
            self._send_pending(out)
            self._pending = segment
            self._send_pending(out)
            self._bar_open = False

    def _send_pending(self, out: list[bytes]) -> None:
        frame = self._pending
        if frame is None:
            return
        self._pending = None
        if frame != self._sent_frame:
            self._put(self._frame, frame, out)
            self._sent_frame = frame

    def _put(self, head: bytes, segment: bytes, out: list[bytes]) -> None:
        """One record of `segment` under `head`; one that would pass `max_line` goes in C
        records first, its last piece under `head` (the head rejoins them)."""
        payload = escape_payload(segment)
        room = self._room
        if room is None or len(payload) <= room:
            out.append(head + payload + b"\n")
            return
        pieces = _cut(segment, room)
        for piece in pieces[:-1]:
            out.append(self._chunk + piece + b"\n")
        out.append(head + pieces[-1] + b"\n")


def _cut(segment: bytes, room: int) -> list[bytes]:
    """`segment` in escaped pieces of at most `room` bytes each. Each piece is escaped on its
    own, so no escape is cut in two; escaping at most quadruples a byte, so a piece of
    room // 4 bytes always fits."""
    pieces: list[bytes] = []
    start = 0
    while start < len(segment):
        size = min(room, len(segment) - start)
        while True:
            payload = escape_payload(segment[start : start + size])
            if len(payload) <= room:
                break
            size = max(room // 4, min(size - 1, size * room // len(payload)))
        pieces.append(payload)
        start += size
    return pieces


class _Word(str, Enum):
    """An enum whose members are their words wherever they are shown or written."""

    def __str__(self) -> str:
        return self.value


class ControlKind(_Word):
    """What an agent's control message says: a control record's `text`."""

    STARTED = "started"  # the node's launcher started
    RANK = "rank"  # a rank opened its own output channel to the agent
    HEARTBEAT = "heartbeat"  # the agent is alive (fields: t, the node's wall clock)
    RANK_END = "rank_end"  # a rank ended (fields: rank, local_rank, pid, start, end, code...)
    EXIT = "exit"  # the node's launcher ended (fields: code, rank, failed_at, ...)
    SIGNALLED = "signalled"  # Slurm signalled the node's step (fields: signal): a stop


def encode_control(kind: str, **fields: object) -> bytes:
    """One wire line carrying an agent control message (a ControlKind, and its fields)."""
    doc = {"kind": kind, **fields}
    return MAGIC + b"K- " + json.dumps(doc, separators=(",", ":")).encode("ascii") + b"\n"


def shorten_control(kind: str, fields: dict[str, object], max_line: int) -> bytes:
    """The control line of `kind` and `fields` within `max_line` bytes where its text allows:
    its longest text fields cut short, ending in `...` (a line cut by the channel would be
    lost whole, with another node's line caught in it)."""
    fields = dict(fields)
    line = encode_control(kind, **fields)
    while len(line) > max_line:
        texts = [(len(v), k) for k, v in fields.items() if isinstance(v, str) and len(v) > 8]
        if not texts:
            break
        size, name = max(texts)
        keep = max(4, size - (len(line) - max_line) - 3)
        fields[name] = str(fields[name])[:keep] + "..."
        line = encode_control(kind, **fields)
    return line


class WireKind(_Word):
    """What a decoded wire record is."""

    LINE = "line"
    FRAME = "frame"
    CHUNK = "chunk"  # a piece of a long segment, continued in the next record
    CONTROL = "control"  # an agent's control message


_KIND_NAME = {
    KIND_LINE: WireKind.LINE, KIND_PARTIAL: WireKind.LINE, KIND_FRAME: WireKind.FRAME,
    KIND_CHUNK: WireKind.CHUNK,
}  # fmt: skip


@dataclass(frozen=True)
class WireRecord:
    """One decoded wire line.

    kind: a line, a frame, a chunk (`more` is True and the text continues in the next
    record of the same stream) or a control message.
    text: the bytes decoded as UTF-8 with surrogateescape, so invalid bytes are
    kept reversibly (`text.encode("utf-8", "surrogateescape")` gives them back).
    For control records, text is the control kind and fields the rest.
    newline: False for the last line of a stream that had no final newline.
    rank: "<rank>/<local rank>" of the rank that wrote it; "" for the node's launcher.
    """

    kind: WireKind
    stream: str
    text: str
    fields: dict = field(default_factory=dict)
    more: bool = False
    newline: bool = True
    rank: str = ""

    @property
    def data(self) -> bytes:
        return self.text.encode("utf-8", "surrogateescape")


def global_rank(label: str) -> int | None:
    """The global rank of a "<rank>/<local rank>" label; None for the launcher's "" or a
    label logwire did not write."""
    if _RANK_LABEL.fullmatch(label) is None:
        return None
    return int(label.partition("/")[0])


def parse_wire(payload: bytes) -> tuple[int, int, bytes, bytes] | None:
    """The one reader of a wire line (without its newline): (kind byte, stream byte, rank
    label, body), the body unescaped (a control record's JSON as it came); None if it is
    not a wire line (plain output)."""
    if payload[:3] != MAGIC or len(payload) < 6:
        return None
    if payload[5] == 0x20:  # the node's launcher: no rank label
        label, body = b"", payload[6:]
    elif payload[5] == 0x3A:  # ":<rank>/<local rank> "
        end = payload.find(b" ", 6, 32)
        if end < 0:
            return None
        label, body = payload[6:end], payload[end + 1 :]
    else:
        return None
    kind = payload[3]
    if kind != KIND_CONTROL and body.find(b"\\") >= 0:  # (`in` on bytes is slower)
        body = unescape_payload(body)
    return kind, payload[4], label, body


def decode_control(body: bytes) -> WireRecord | None:
    """The control record whose JSON body parse_wire returned; None if it is not one."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    name = str(doc.pop("kind", ""))
    return WireRecord(WireKind.CONTROL, "", name, doc)


def decode_wire(payload: bytes) -> WireRecord | None:
    """Decode one wire line (with or without its trailing newline); None: plain output."""
    if payload.endswith(b"\n"):
        payload = payload[:-1]
    parsed = parse_wire(payload)
    if parsed is None:
        return None
    kind, stream, label, data = parsed
    if kind == KIND_CONTROL:
        return decode_control(data)
    name = _KIND_NAME.get(kind)
    stream_name = STREAM_NAME.get(stream)
    if name is None or stream_name is None:
        return None
    text = data.decode("utf-8", "surrogateescape")
    return WireRecord(
        name, stream_name, text, more=kind == KIND_CHUNK, newline=kind != KIND_PARTIAL,
        rank=label.decode("ascii", "replace"),
    )  # fmt: skip
