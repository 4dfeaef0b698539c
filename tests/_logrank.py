"""A training rank that prints a lot, for the log-path tests through `orch launch`.

argv: <copy dir> <lines per stream> [<seconds to pause every 1000 lines>]

Prints `<lines>` numbered lines to each of stdout and stderr (in bursts, one
write per burst), real tqdm bars and hand-made \\r frames on stderr, a 1 MiB
line, invalid UTF-8 with a NUL and colour codes, and a last line with no
newline. Everything it writes to a stream is also appended to
<copy dir>/rank<RANK>.<out|err>, so a test can compare the raw logs orch pulls
back with what the rank wrote, byte for byte.
"""

from __future__ import annotations

import os
import random
import sys
import time

from tqdm import tqdm

COPY_DIR, LINES = sys.argv[1], int(sys.argv[2])
PAUSE = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
RANK = os.environ.get("RANK", "0")


class Stream:
    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.copy = open(f"{COPY_DIR}/rank{RANK}.{name}", "wb")  # noqa: SIM115

    def write(self, data: bytes) -> None:
        self.copy.write(data)
        self.copy.flush()
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


class TqdmFile:
    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        self.stream.write(text.encode())

    def flush(self) -> None:
        return


def main() -> None:
    out, err = Stream(1, "out"), Stream(2, "err")
    streams = {"out": out, "err": err}
    rng = random.Random(RANK)
    pending: dict[str, list[bytes]] = {"out": [], "err": []}

    def drain(name: str) -> None:
        if pending[name]:
            streams[name].write(b"".join(pending[name]))
            pending[name] = []

    for i in range(LINES):
        for name in ("out", "err"):
            pending[name].append(b"r%s %s line %d\n" % (RANK.encode(), name.encode(), i))
            if len(pending[name]) >= rng.randint(1, 60):
                drain(name)
        if i % 20000 == 5000:
            drain("err")
            bar = tqdm(range(40), file=TqdmFile(err), mininterval=0, ascii=True, desc=f"bar{i}")
            for _ in bar:
                pass
        if i % 7000 == 3000:
            drain("err")
            err.write(b"".join(b"\rmanual%d %d/10" % (i, k) for k in range(11)) + b"\n")
        if i == LINES // 2:
            drain("out")
            drain("err")
            out.write(b"big:" + b"x" * (1 << 20) + b"\n")
            err.write(b"bad utf8: \xff\xfe\xc3( \x00nul \\x41 \x1b[31mred\x1b[0m\n")
        if PAUSE and i % 1000 == 999:
            drain("out")
            drain("err")
            time.sleep(PAUSE)
    drain("out")
    drain("err")
    out.write(b"tail without newline")


if __name__ == "__main__":
    main()
