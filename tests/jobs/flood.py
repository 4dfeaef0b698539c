"""A rank that prints LINES numbered lines as fast as Python can, then `done <RANK>`."""

from __future__ import annotations

import os
import sys

rank = os.environ.get("RANK", "?")
write = sys.stdout.write
for i in range(int(sys.argv[1])):
    write(f"r{rank} line {i} {'x' * 60}\n")
write(f"done {rank}\n")
sys.stdout.flush()
