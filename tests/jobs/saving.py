"""A torch.distributed (gloo) job that saves when told to stop, as docs/guides/stopping.md
shows: its handler for ORCH_STOP_SIGNAL sets a flag; the ranks agree at a step boundary (an
all_reduce of the flag); each saves (`--save-seconds`, longer than a launcher's own 30 s
limit), writes `<out>/rank<R>.saved`, and exits 0. With `--note-signal`,
`<out>/rank<R>.signalled` holds the time its handler for the stop signal first ran.

Each rank reads its batches through a torch DataLoader with `--workers` worker processes
(num_workers), as training does; a worker that gets a signal writes
`<out>/worker<R>.<i>.<SIGNAL>` and goes on. `--slow-rank R`: rank R saves for
`--slow-save-seconds` instead (longer than the grace).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from job_end import end
from torch.utils.data import DataLoader, IterableDataset


def _note(path: Path) -> None:
    path.write_text(f"{time.time()}\n")


class _Batches(IterableDataset):
    """One small batch after another, for as long as the rank asks."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            yield torch.ones(4)


def _noting_worker(out: Path, rank: int, index: int) -> None:
    """The DataLoader's worker_init_fn: the worker notes every signal it gets and goes on
    (a worker the stop signal ended would fail its rank's next batch)."""

    def noted(signum: int, _frame: object) -> None:
        _note(out / f"worker{rank}.{index}.{signal.Signals(signum).name}")

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, noted)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--save-seconds", type=float, default=40.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-sleep", type=float, default=0.2)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-save-seconds", type=float, default=300.0)
    parser.add_argument("--note-signal", action="store_true")
    args = parser.parse_args()

    stop_signal = signal.Signals[os.environ.get("ORCH_STOP_SIGNAL", "SIGTERM")]
    asked: list[float] = []
    rank = int(os.environ["RANK"])

    def stop_asked(_signum: int, _frame: object) -> None:
        if not asked and args.note_signal:  # when the signal reached it (bench/bench_stop.py)
            _note(args.out / f"rank{rank}.signalled")
        asked.append(time.time())

    signal.signal(stop_signal, stop_asked)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    loader = DataLoader(_Batches(), batch_size=None, num_workers=args.workers,
                        worker_init_fn=functools.partial(_noting_worker, args.out, rank),
                        persistent_workers=args.workers > 0)  # fmt: skip
    batches = iter(loader)
    world = dist.get_world_size()
    print(f"rank {rank}/{world} up, grace {os.environ.get('ORCH_STOP_GRACE')} s", flush=True)
    step = 0
    while True:
        next(batches)
        flag = torch.tensor([1.0 if asked else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if flag.item() > 0:
            signal.signal(stop_signal, signal.SIG_IGN)  # a late signal must not end it
            break
        step += 1
        if step % 10 == 0:
            print(f"rank {rank} step {step}", flush=True)
        time.sleep(args.step_sleep)
    print(f"rank {rank} saving at step {step}", flush=True)
    time.sleep(args.slow_save_seconds if rank == args.slow_rank else args.save_seconds)
    _note(args.out / f"rank{rank}.saved")
    print(f"rank {rank} saved", flush=True)
    del batches  # its workers are told to end, and joined
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    end(main())
