"""A training rank that prints a lot, for the log-path tests through `orch launch`.

argv: <copy dir> <lines per stream> [<seconds to pause every 1000 lines>]

Prints what _logoutput.write_rank_output writes (one write per burst).
Everything it writes to a stream is also appended to
<copy dir>/rank<RANK>.<out|err>, so a test can compare the raw logs orch pulls
back with what the rank wrote, byte for byte.
"""

from __future__ import annotations

import os
import sys

from _logoutput import write_rank_output  # beside this file

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


def main() -> None:
    streams = {"out": Stream(1, "out"), "err": Stream(2, "err")}
    write_rank_output(streams, b"r" + RANK.encode(), LINES, seed=RANK, pause=PAUSE)


if __name__ == "__main__":
    main()
