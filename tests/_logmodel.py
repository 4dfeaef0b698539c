"""Reference model of the head-side log, shared by the log-path tests."""

from __future__ import annotations

import re
from pathlib import Path

_SGR = re.compile(rb"\x1b\[[0-9;]*m")  # colours: the escape codes the tests' ranks print

BLANK = b" \t\x0b\x0c"
TS_LEN = len("2026-11-21T23:30:01.123Z")


def expected_log(raw: bytes) -> list[bytes]:
    """What a terminal user would keep from one stream: the reference the writer must match.

    Within a line, text before each \\r is a frame; a blank frame clears the bar
    (its last frame is kept); the text after the last \\r is the line, unless it is
    blank and a frame is showing, in which case the line is that frame.
    """
    out: list[bytes] = []
    frame: bytes | None = None

    def frames(segments: list[bytes]) -> None:
        nonlocal frame
        for seg in segments:
            if not seg:
                continue
            if seg.strip(BLANK):
                frame = seg
            elif frame is not None:
                out.append(frame)
                frame = None

    def line(final: bytes) -> None:
        nonlocal frame
        out.append(frame if frame is not None and not final.strip(BLANK) else final)
        frame = None

    lines = raw.split(b"\n")
    last = lines.pop()
    for text in lines:
        segments = text.split(b"\r")
        frames(segments[:-1])
        line(segments[-1])
    segments = last.split(b"\r")
    frames(segments[:-1])
    if segments[-1]:
        line(segments[-1])
    elif frame is not None:
        out.append(frame)
    return [_SGR.sub(b"", entry) for entry in out]


_RANK_TOKEN = re.compile(rb"r\d+/\d+")


def read_log(path: Path) -> list[tuple[bytes, bytes]]:
    """(tag, text) per entry; checks the timestamp of each.

    The tag is what the line says of its source: b"out", b"err+", b"sys", b"orch" for
    the node's launcher and the node, b"r3/1 out" (b"r3/1 err+"...) for a rank's own
    output, the rank token kept with its stream."""
    entries = []
    data = path.read_bytes()
    assert b"\r" not in data
    for line in data.split(b"\n")[:-1]:
        stamp, tag, text = line.split(b" ", 2)
        assert len(stamp) == TS_LEN and stamp.endswith(b"Z"), line
        if _RANK_TOKEN.fullmatch(tag):
            stream, _, text = text.partition(b" ")
            tag = tag + b" " + stream
        entries.append((tag, text))
    return entries


def rank_tag(rank: int, local_rank: int, stream: bytes) -> bytes:
    """The tag read_log gives rank `rank`'s own lines on `stream` (b"out", b"err")."""
    return b"r%d/%d %s" % (rank, local_rank, stream)
