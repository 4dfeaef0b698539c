"""Ranks that step with a tqdm bar, each on its own (no collective): every step sleeps
`--step` seconds, `--slow-factor` times that on `--slow-rank`, so one rank falls behind
and the job's page should name it. `--fail-rank R --fail-at S`: rank R raises at step S,
with a traceback, while the others go on until they are torn down. Standard library and
tqdm only: it runs under every launcher without torch's start-up."""

from __future__ import annotations

import argparse
import os
import sys
import time

from job_end import end
from tqdm import tqdm


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step", type=float, default=0.1)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=10)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    pause = args.step * (args.slow_factor if rank == args.slow_rank else 1.0)
    print(f"rank {rank} starts {args.steps} steps", flush=True)
    for step in tqdm(range(args.steps), desc=f"rank {rank}", file=sys.stderr, mininterval=0.2):
        if rank == args.fail_rank and step == args.fail_at:
            raise RuntimeError(f"rank {rank} hit a bad batch at step {step}")
        time.sleep(pause)
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    end(main())
