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


def read_log(path: Path) -> list[tuple[bytes, bytes]]:
    """(stream tag, text) per entry; checks the timestamp of each."""
    entries = []
    data = path.read_bytes()
    assert b"\r" not in data
    for line in data.split(b"\n")[:-1]:
        stamp, tag, text = line.split(b" ", 2)
        assert len(stamp) == TS_LEN and stamp.endswith(b"Z"), line
        entries.append((tag, text))
    return entries
