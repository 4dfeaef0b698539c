"""What a chatty training rank writes, for the log-path test programs
(_lognode.py on a node behind the agent's framing, _logrank.py under `orch launch`).

`lines` numbered lines on each of stdout and stderr, in bursts of random size (as
buffered output arrives), real tqdm bars and hand-made \\r frames on stderr, a
1 MiB line, invalid UTF-8 with a NUL and colour codes, and a last line with no
newline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from tqdm import tqdm


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...


class TqdmFile:
    """What tqdm writes to: text, handed to a stream as bytes."""

    def __init__(self, stream: Writer, flush: Callable[[], None] = lambda: None) -> None:
        self.stream = stream
        self._flush = flush

    def write(self, text: str) -> None:
        self.stream.write(text.encode())

    def flush(self) -> None:
        self._flush()


def write_rank_output(
    streams: Mapping[str, Writer],
    label: bytes,
    lines: int,
    *,
    seed: str,
    pause: float = 0.0,
    flush: Callable[[], None] = lambda: None,
) -> None:
    """Write it all to streams["out"] and streams["err"]; lines read `<label> out line <i>`.
    Every 1000 lines, `pause` seconds of silence (after `flush`)."""
    rng = random.Random(seed)
    pending: dict[str, list[bytes]] = {"out": [], "err": []}

    def drain(name: str) -> None:
        if pending[name]:
            streams[name].write(b"".join(pending[name]))
            pending[name] = []

    out, err = streams["out"], streams["err"]
    for i in range(lines):
        for name in ("out", "err"):
            pending[name].append(b"%s %s line %d\n" % (label, name.encode(), i))
            if len(pending[name]) >= rng.randint(1, 60):
                drain(name)
        if i % 20000 == 5000:
            drain("err")
            bar = tqdm(range(40), file=TqdmFile(err, flush), mininterval=0, ascii=True,
                       desc=f"bar{i}")  # fmt: skip
            for _ in bar:
                pass
        if i % 7000 == 3000:
            drain("err")
            err.write(b"".join(b"\rmanual%d %d/10" % (i, k) for k in range(11)) + b"\n")
        if i == lines // 2:
            drain("out")
            drain("err")
            out.write(b"big:" + b"x" * (1 << 20) + b"\n")
            err.write(b"bad utf8: \xff\xfe\xc3( \x00nul \\x41 \x1b[31mred\x1b[0m\n")
        if pause and i % 1000 == 999:
            drain("out")
            drain("err")
            flush()
            time.sleep(pause)
    drain("out")
    drain("err")
    out.write(b"tail without newline")
