"""A tiny accelerate + DeepSpeed ZeRO-2 training job for CPU (gloo), for the benchmarks.

Every launcher passes script arguments through unchanged, so the fault switches
are arguments (not environment variables, which each launcher forwards
differently):
  --steps N          optimizer steps (default 10)
  --events DIR       shared directory for event files the benchmark watches:
                     `ready-<rank>` once a rank waits in the final all_reduce loop,
                     `crash` (holding time.time()) just before the crashing rank exits
  --crash-rank R     global rank that exits with --crash-code after step 2
  --crash-code C     default 7
  --hang             after training, every rank loops in all_reduce until killed
  --stall-rank R     with --hang: global rank R stops in plain Python instead (a data
                     loader that never yields), writing `stall` (time.time()) first; the
                     others wait for it in all_reduce, silently
  --token T          ignored: lets the benchmark find this run's processes by argv
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# DeepSpeed's CPU accelerator JIT-builds its shm op with the first `ninja` on PATH. The
# venv's ninja (1.13) and the system's (1.11) each see the other's build as stale, so
# jobs started with different PATHs rebuild it in turn (1-3 minutes, every rank waiting
# on its lock). Use the interpreter's own ninja and a build directory of the benchmarks'
# own, whatever the launcher passed, so launch times measure launching.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/orch-bench-torch-extensions")
)

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--events", default=None)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-code", type=int, default=7)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--stall-rank", type=int, default=-1)
    parser.add_argument("--token", default="")
    # `deepspeed` without --no_local_rank appends --local_rank=N: ignore what we do not know.
    args, _unknown = parser.parse_known_args()
    return args


def write_event(events: str | None, name: str, text: str = "") -> None:
    if events:
        path = Path(events) / name
        path.with_suffix(".tmp").write_text(text)
        path.with_suffix(".tmp").replace(path)


def next_batch_that_never_comes(events: str | None) -> None:
    time.sleep(1.0)  # the others are back in all_reduce by now
    write_event(events, "stall", repr(time.time()))
    while True:
        time.sleep(0.5)


def make_accelerator() -> Accelerator:
    # Under `accelerate launch` the DeepSpeed settings come from its config (in the
    # environment); started by `deepspeed` or torchrun directly, ask for the same ZeRO-2.
    plugin = None
    if os.environ.get("ACCELERATE_USE_DEEPSPEED") != "true":
        plugin = DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0)
    return Accelerator(
        deepspeed_plugin=plugin, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")]
    )


def main() -> int:
    args = parse_args()
    accelerator = make_accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    rank = accelerator.process_index
    batches = iter(loader)
    loss = torch.zeros(())
    for step in range(args.steps):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if rank == args.crash_rank and step == 2:
            print(f"rank {rank}: crashing on purpose with exit {args.crash_code}", flush=True)
            write_event(args.events, "crash", repr(time.time()))
            os._exit(args.crash_code)
    print(f"rank {rank}/{accelerator.num_processes} done: loss={loss.item():.4f}", flush=True)
    if args.hang:
        tensor = torch.ones(1)
        torch.distributed.all_reduce(tensor)
        print(f"rank {rank}: waiting in all_reduce", flush=True)
        write_event(args.events, f"ready-{rank}")
        if rank == args.stall_rank:
            next_batch_that_never_comes(args.events)
        while True:
            torch.distributed.all_reduce(tensor)
            time.sleep(0.2)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
