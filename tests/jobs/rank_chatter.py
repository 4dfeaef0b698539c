"""A rank that chatters on both streams, for the per-rank output tests (CPU only, no torch).

No torch.distributed: the launchers start every rank with RANK and LOCAL_RANK set, and
that is all this needs. Every argument is the user's (reported, never parsed); the knobs
come from the environment:

- CHATTER_LINES (default 300): numbered lines per stream, each written as two unbuffered
  writes (the text, then "\\n"), `@chat r<RANK> <out|err> line <i>`;
- every 25 lines, a tqdm-like bar on that stream: \\r frames `@chat r<RANK> <stream> bar
  <b> <k>/5` (k = 0..5, one write each) then "\\n" in a write of its own; the stream ends
  with such a bar (`bar end`);
- CHATTER_NAMES, CHATTER_SECRETS: comma-separated variable names; first of all, one line on
  stdout, in one write: `json.dumps({"argv": sys.argv[1:], "env": {name: its value or None},
  "sha256": {secret name: the sha256 of its value or None}})`: a secret's value itself is
  never printed (the test looks for it in everything the job left behind);
- CHATTER_SLEEP (default 0): seconds to sleep at the end (for tests that look at the
  job while it runs).

tests/remote/test_rank_capture_sandbox.py builds the same lines independently: keep them in step.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

BAR_EVERY = 25
BAR_FRAMES = 5


def write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def bar(fd: int, label: bytes, name: bytes) -> None:
    for k in range(BAR_FRAMES + 1):
        write(fd, b"\r%s bar %s %d/%d" % (label, name, k, BAR_FRAMES))
    write(fd, b"\n")


def names(variable: str) -> list[str]:
    return [name for name in os.environ.get(variable, "").split(",") if name]


def digest(value: str | None) -> str | None:
    return None if value is None else hashlib.sha256(value.encode()).hexdigest()


def main() -> int:
    rank = os.environ.get("RANK", "?")
    lines = int(os.environ.get("CHATTER_LINES", "300"))
    report = {
        "argv": sys.argv[1:],
        "env": {name: os.environ.get(name) for name in names("CHATTER_NAMES")},
        "sha256": {name: digest(os.environ.get(name)) for name in names("CHATTER_SECRETS")},
    }
    write(1, json.dumps(report).encode() + b"\n")
    for i in range(lines):
        for fd, stream in ((1, b"out"), (2, b"err")):
            label = b"@chat r%s %s" % (rank.encode(), stream)
            write(fd, b"%s line %d" % (label, i))
            write(fd, b"\n")
            if i % BAR_EVERY == BAR_EVERY - 1:
                bar(fd, label, b"%d" % (i // BAR_EVERY))
        if i % 50 == 49:
            time.sleep(0.005)  # let the other ranks' writes come in between
    for fd, stream in ((1, b"out"), (2, b"err")):
        bar(fd, b"@chat r%s %s" % (rank.encode(), stream), b"end")
    time.sleep(float(os.environ.get("CHATTER_SLEEP", "0")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
