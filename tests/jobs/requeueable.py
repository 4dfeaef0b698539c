"""A torch.distributed (gloo) job that needs more than one Slurm allocation, for the requeue
tests. It saves when told to stop, as docs/guides/stopping.md shows, and resumes from its
checkpoint when ORCH_RESTART_COUNT says it runs again.

Every rank runs `--steps` all_reduce steps, `--step-sleep` seconds apart. The handler for
ORCH_STOP_SIGNAL only sets a flag; the ranks agree on it at the next step (an all_reduce);
rank 0 writes that step to `--checkpoint` and every rank exits 0.

`--save-seconds S`: every rank takes S seconds to save (longer than a launcher's own 30 s).

`--requeue-itself` requeues from inside the job, as a script written for Slurm alone does
(Lightning's `SLURMEnvironment(auto_requeue=True)` outside orch): on the stop signal the ranks
save, rank 0 runs `scontrol requeue $SLURM_JOB_ID`, and every rank goes on training until
Slurm ends the allocation, ignoring SIGTERM throughout.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

from job_end import end
from resumable import resume_step, save_step  # beside this file: its checkpoint's format


def _requeue_itself(rank: int) -> None:
    """The script's own requeue: rank 0 alone puts the Slurm job back in the queue."""
    if rank != 0:
        return
    job = os.environ["SLURM_JOB_ID"]
    done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                          check=False)  # fmt: skip
    print(f"rank 0 requeued Slurm job {job}: exit {done.returncode} {done.stderr.strip()}",
          flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-sleep", type=float, default=0.5)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--save-seconds", type=float, default=0.0)
    parser.add_argument("--requeue-itself", action="store_true")
    args = parser.parse_args()

    # Before torch loads: Slurm's warning may come early, while a loaded machine still
    # imports it, and the stop is kept for the first step.
    stop_signal = signal.Signals[os.environ.get("ORCH_STOP_SIGNAL", "SIGTERM")]
    asked: list[float] = []
    signal.signal(stop_signal, lambda _n, _f: asked.append(time.time()))
    if args.requeue_itself:  # SIGTERM passes it by: Slurm's requeue ends the job
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import torch
    import torch.distributed as dist

    restart = int(os.environ.get("ORCH_RESTART_COUNT", "0"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    start = resume_step(args.checkpoint) if restart else 0
    print(f"rank {rank}/{world} restart {restart} starts at step {start}", flush=True)
    saved = False
    for step in range(start, args.steps):
        flag = torch.tensor([1.0 if asked else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if flag.item() > 0 and not saved:
            signal.signal(stop_signal, signal.SIG_IGN)  # a late signal must not end it
            time.sleep(args.save_seconds)
            if rank == 0:
                save_step(args.checkpoint, step)
            print(f"rank {rank} saved at step {step}", flush=True)
            if not args.requeue_itself:
                dist.destroy_process_group()
                return 0
            saved = True
            _requeue_itself(rank)
        if step % 10 == 0:
            print(f"rank {rank} step {step}", flush=True)
        time.sleep(args.step_sleep)
    print(f"rank {rank} done: {args.steps} steps, restart {restart}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    end(main())
