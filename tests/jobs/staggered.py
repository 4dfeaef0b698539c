"""A rank that prints its result and exits 0, the ranks of node K after K * STAGGER seconds
(argv[1], default 2; argv[2]: ranks per node, default 2): the nodes finish one after
another, as real nodes do."""

from __future__ import annotations

import os
import sys
import time

stagger = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
per_node = int(sys.argv[2]) if len(sys.argv) > 2 else 2
rank = int(os.environ["RANK"])
node_rank = rank // per_node
time.sleep(node_rank * stagger)
print(f"result of rank {rank}: ok", flush=True)
