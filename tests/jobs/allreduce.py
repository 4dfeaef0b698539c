"""A small torch.distributed (gloo) job for launch tests.

Every rank joins the process group and runs `--steps` all_reduce steps. Fault
switches: `--fail-rank R --exit-code C` makes rank R exit with C after the steps
while the others wait in one more all_reduce; `--sleep S` keeps every rank
alive S seconds after the steps (for interrupt and kill tests); `--raise-rank R`
makes rank R raise a ValueError from a nested call while the others wait in an
all_reduce, which then fails on them with gloo's lost-peer error; `--kill-rank R` has
another process SIGKILL rank R, and `--segfault-rank R` makes rank R read address 0, each
while the others wait in an all_reduce. `--peers-exit-at-once`: a rank whose all_reduce
fails prints the traceback and exits at once (os._exit(1)), milliseconds after the rank it
lost, instead of unwinding the interpreter. `--long-line N`: after each step, every rank also
prints a line of N bytes (longer than one of srun's messages, for N over 1024).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import subprocess
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from job_end import end


def load_batch(rank: int, index: int) -> None:
    raise ValueError(f"batch {index} is corrupt (rank {rank})")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--exit-code", type=int, default=7)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--segfault-rank", type=int, default=-1)
    parser.add_argument("--peers-exit-at-once", action="store_true")
    parser.add_argument("--long-line", type=int, default=0)
    args, _unknown = parser.parse_known_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=900))
    rank, world = dist.get_rank(), dist.get_world_size()
    # Where the flight recorder dumps: TORCH_FR_DUMP_TEMP_FILE since torch 2.8, before it
    # TORCH_NCCL_DEBUG_INFO_TEMP_FILE (orch sets the name the installed torch reads).
    dump = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get(
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
    )
    print(f"rank {rank}/{world} up on {socket.gethostname()} job={os.environ.get('ORCH_JOB_ID')} "
          f"fr={dump}")
    for step in range(args.steps):
        value = torch.ones(1) * (rank + 1)
        dist.all_reduce(value)
        print(f"rank {rank} step {step} sum {int(value.item())}", flush=True)
        if args.long_line:
            said = f"rank {rank} step {step} long "
            print(said + "x" * (args.long_line - len(said)), flush=True)
        sys.stderr.write(f"\rrank {rank} progress {step + 1}/{args.steps}")
        sys.stderr.flush()
        if args.step_sleep:
            time.sleep(args.step_sleep)
    sys.stderr.write("\n")
    if rank == args.fail_rank:
        print(f"rank {rank} failing with exit code {args.exit_code}", flush=True)
        os._exit(args.exit_code)
    if rank == args.raise_rank:
        time.sleep(1.0)  # the others are waiting in the all_reduce below by now
        load_batch(rank, 17)
    if rank == args.kill_rank:
        print(f"rank {rank} about to be killed", flush=True)
        subprocess.run(["kill", "-KILL", str(os.getpid())], check=False)
        time.sleep(60)
    if rank == args.segfault_rank:
        print(f"rank {rank} reading address 0", flush=True)
        ctypes.string_at(0)
    if max(args.fail_rank, args.raise_rank, args.kill_rank, args.segfault_rank) >= 0:
        # The others block here until the job is torn down.
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError:
            if not args.peers_exit_at_once:
                raise
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    if args.sleep:
        time.sleep(args.sleep)
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    end(main())
