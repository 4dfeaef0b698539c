"""A torch.distributed (gloo) job that steps until it is told to stop, for `orch stacks`.

Each step computes for `--compute` seconds and idles `--pause` seconds (`--slow-factor`
times both on `--slow-rank`), then, every `--sync-every` steps (1), joins one all_reduce
that also carries rank 0's stop flag: rank 0 raises it once
`--stop-file` exists or `--max-seconds` have passed, so every rank leaves the loop at
the same step and the job ends with exit 0. With `--compute 0` every rank loops in
all_reduce, spinning the cores; `--lead-pause S` has rank 0 idle S seconds before each
all_reduce instead, so that the others wait in it for rank 0 (a job whose ranks block in
a collective, at little cost to the cores the tests share).

`--stall-rank R --stall-after S`: after S seconds rank R says so and stops in plain Python
(a data loader that never yields), silently, while the others wait for it in all_reduce.
`--fail-rank R --fail-after S`: rank R exits 7 instead, while the others wait.
`--matmuls N`: each step also multiplies N matrices (a step's fixed work, for benchmarks).
`--print-every N`: rank 0 prints a line every N steps (a job that shows its pace).
`--quiet-rank R --quiet-at S --quiet-for D`: once, after S seconds, rank R computes for D
seconds without a word (an evaluation) while the others wait; `--quiet-rank -2`: every
rank writes a file for D seconds instead (a checkpoint), a MiB every `--write-pause`
seconds (0: as fast as the disk takes it). `--quiet R:S:D` adds another such spell (any
number). `--duty F`: a quiet computation computes F of its time and idles the rest (a rank
busy on a tenth of a core still counts as computing, and leaves the cores to the others).
`--startup S`: before the first step every rank prepares for S seconds without a word
(a little computing, a file written now and then): a long start-up.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from job_end import end


def compute(seconds: float, duty: float = 1.0) -> None:
    """Busy for `seconds` of wall-clock time, in the user's code (bounded by the clock, so
    the step takes as long whatever else shares the cores); with `duty` below 1, only that
    share of each tenth of a second."""
    matrix = torch.ones(32, 32)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        burst = time.perf_counter() + 0.1 * duty
        while time.perf_counter() < min(burst, end):
            matrix = torch.mm(matrix, matrix).clamp_(max=1.0)
        if duty < 1.0:
            time.sleep(max(0.0, min(0.1 * (1.0 - duty), end - time.perf_counter())))


def prepare_data(seconds: float, rank: int) -> None:
    """A start-up without a word: every 5 seconds a MiB prepared and written (a hundredth of
    a core: the tests share two)."""
    end = time.perf_counter() + seconds
    with tempfile.TemporaryFile(prefix=f"data-{rank}-") as file:
        while time.perf_counter() < end:
            file.write(os.urandom(1 << 20))
            file.flush()
            compute(min(5.0, end - time.perf_counter()), 0.01)


def quiet_spells(args: argparse.Namespace) -> list[tuple[int, float, float]]:
    """(rank, at, for) of every quiet spell asked for, by when it starts."""
    spells = [(args.quiet_rank, args.quiet_at, args.quiet_for)] if args.quiet_rank != -1 else []
    for spec in args.quiet:
        rank, at, seconds = spec.split(":")
        spells.append((int(rank), float(at), float(seconds)))
    return sorted(spells, key=lambda spell: spell[1])


def work(matmuls: int) -> None:
    """A fixed amount of work, which takes longer when something else takes the cores."""
    matrix = torch.ones(64, 64)
    for _ in range(matmuls):
        matrix = torch.mm(matrix, matrix).clamp_(max=1.0)


def next_batch_that_never_comes() -> None:
    """A data loader stuck forever, in the user's code (no collective, no output)."""
    while True:
        time.sleep(0.5)


def save_checkpoint(seconds: float, rank: int, pause: float) -> None:
    """Writes to a file of its own for `seconds`, synced as it goes (storage I/O, no word),
    idling `pause` seconds after each MiB."""
    end = time.perf_counter() + seconds
    block = os.urandom(1 << 20)
    with tempfile.TemporaryFile(prefix=f"ckpt-{rank}-") as file:
        while time.perf_counter() < end:
            file.seek(0)
            file.write(block)
            file.flush()
            os.fsync(file.fileno())
            time.sleep(pause)


def should_stop(args: argparse.Namespace, started: float) -> bool:
    if args.stop_file and os.path.exists(args.stop_file):
        return True
    return time.monotonic() - started > args.max_seconds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compute", type=float, default=0.0)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-factor", type=float, default=1.0)
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--pause", type=float, default=0.0)  # idle seconds between steps
    parser.add_argument("--sync-every", type=int, default=1)
    parser.add_argument("--matmuls", type=int, default=0)  # fixed work a step, not a time
    parser.add_argument("--lead-pause", type=float, default=0.0)  # rank 0's alone
    parser.add_argument("--stall-rank", type=int, default=-1)
    parser.add_argument("--stall-after", type=float, default=5.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-after", type=float, default=5.0)
    parser.add_argument("--print-every", type=int, default=0)
    parser.add_argument("--quiet-rank", type=int, default=-1)
    parser.add_argument("--quiet-at", type=float, default=0.0)
    parser.add_argument("--quiet-for", type=float, default=0.0)
    parser.add_argument("--write-pause", type=float, default=0.0)
    parser.add_argument("--quiet", action="append", default=[])  # R:AT:FOR, more spells
    parser.add_argument("--duty", type=float, default=1.0)
    parser.add_argument("--startup", type=float, default=0.0)
    args = parser.parse_args()

    torch.set_num_threads(1)  # several ranks share few cores
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} up on {socket.gethostname()}", flush=True)
    slower = args.slow_factor if rank == args.slow_rank else 1.0
    my_compute, my_pause = args.compute * slower, args.pause * slower
    if args.startup:
        prepare_data(args.startup, rank)
    started = time.monotonic()
    steps = 0
    spells = quiet_spells(args)
    while True:
        elapsed = time.monotonic() - started
        if spells and elapsed >= spells[0][1]:
            quiet_rank, _at, quiet_for = spells.pop(0)
            if quiet_rank == -2:
                save_checkpoint(quiet_for, rank, args.write_pause)
            elif rank == quiet_rank:
                compute(quiet_for, args.duty)
        if rank == args.stall_rank and elapsed >= args.stall_after:
            print(f"rank {rank} stalls after {steps} steps", flush=True)
            next_batch_that_never_comes()
        if rank == args.fail_rank and elapsed >= args.fail_after:
            print(f"rank {rank} fails after {steps} steps", flush=True)
            return 7
        compute(my_compute)
        work(args.matmuls)
        time.sleep(my_pause + (args.lead_pause if rank == 0 else 0.0))
        steps += 1
        if rank == 0 and args.print_every and steps % args.print_every == 0:
            print(f"step {steps}", flush=True)
        if steps % args.sync_every:
            continue
        flag = torch.tensor([1.0 if rank == 0 and should_stop(args, started) else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            break
    print(f"rank {rank} done after {steps} steps", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    end(main())
