"""A rank that prints numbered lines as fast as Python can, with a tqdm bar on stderr.

argv: <lines> [<token>]  (the token is ignored: it lets the benchmark find the run's
processes by their command line). Works under every launcher: no torch, no
process group, RANK from the environment when a launcher sets it.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


def main() -> None:
    lines = int(sys.argv[1])
    rank = os.environ.get("RANK", "0")
    write = sys.stdout.write
    for i in tqdm(range(lines), file=sys.stderr, mininterval=0.5, ascii=True):
        write(f"r{rank} step {i} loss 0.123456 lr 0.000100\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
