"""A small torch.distributed (gloo) job that checkpoints and resumes, for the recovery tests.

Every rank runs `--steps` all_reduce steps, `--step-sleep` seconds apart; rank 0 writes the
next step to `--checkpoint` after each. A rank reads ORCH_RESTART_COUNT: on a restart it
resumes from the checkpoint, and says so. Fault switches, on the first attempt only:
`--exit-at K --exit-code C` makes rank 0 exit with C at step K (the script's own choice);
`--hang-at K` makes the last rank sleep at step K while the others wait in the all_reduce.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

from job_end import end


def _tick_until(stop: threading.Event) -> None:
    """A progress frame every second while torch loads and the group forms: start-up is no
    silence (--hang-timeout counts from the start), however slow a loaded machine makes it."""
    seconds = 0
    while not stop.wait(1.0):
        seconds += 1
        sys.stderr.write(f"\rstarting {seconds} s")
        sys.stderr.flush()


def resume_step(checkpoint: Path) -> int:
    try:
        return int(json.loads(checkpoint.read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def save_step(checkpoint: Path, step: int) -> None:
    partial = checkpoint.with_suffix(".tmp")
    partial.write_text(json.dumps({"step": step}))
    partial.replace(checkpoint)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.2)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--exit-at", type=int, default=-1)
    parser.add_argument("--exit-code", type=int, default=7)
    parser.add_argument("--hang-at", type=int, default=-1)
    args = parser.parse_args()

    restart = int(os.environ.get("ORCH_RESTART_COUNT", "0"))
    started = threading.Event()
    threading.Thread(target=_tick_until, args=(started,), daemon=True).start()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    start = resume_step(args.checkpoint) if restart else 0
    started.set()
    sys.stderr.write("\n")
    print(f"rank {rank}/{world} restart {restart} starts at step {start}", flush=True)
    for step in range(start, args.steps):
        if restart == 0 and step == args.exit_at and rank == 0:
            print(f"rank {rank} giving up at step {step}", flush=True)
            sys.exit(args.exit_code)
        if restart == 0 and step == args.hang_at and rank == world - 1:
            print(f"rank {rank} stuck at step {step}", flush=True)
            time.sleep(600)
        value = torch.ones(1)
        dist.all_reduce(value)
        if rank == 0:
            save_step(args.checkpoint, step + 1)
        print(f"rank {rank} step {step} world {int(value.item())}", flush=True)
        time.sleep(args.step_sleep)
    print(f"rank {rank} done: {args.steps} steps, restart {restart}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    end(main())
