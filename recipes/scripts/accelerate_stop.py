"""Saves when told to stop, with accelerate: the pattern of docs/guides/stopping.md.

The handler for ORCH_STOP_SIGNAL only sets a flag; at each step boundary the processes
agree on it (`accelerator.reduce(..., "max")`), then every process calls
`accelerator.save_state` (each writes its own part: the model from the main process, the
RNG state of every process, the shards under DeepSpeed or FSDP) and exits 0.

    orch launch --hostfile H --launcher torchrun recipes/scripts/accelerate_stop.py -- --out DIR
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator

stop_asked = False


def on_stop(_signum: int, _frame: object) -> None:
    global stop_asked
    stop_asked = True  # only a flag: the process may be inside a collective right now


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-sleep", type=float, default=0.1)
    args = parser.parse_args()
    stop_signal = signal.Signals[os.environ.get("ORCH_STOP_SIGNAL", "SIGTERM")]
    signal.signal(stop_signal, on_stop)  # first thing: a stop may come while it starts

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank = accelerator.process_index
    print(f"rank {rank} up", flush=True)
    for step in range(args.steps):
        x = torch.randn(4, 8, device=accelerator.device)
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        flag = torch.tensor([1.0 if stop_asked else 0.0], device=accelerator.device)
        if accelerator.reduce(flag, reduction="max").item() > 0:  # every process, same step
            signal.signal(stop_signal, signal.SIG_IGN)  # a late signal must not end it
            target = args.out / f"step_{step + 1}"
            accelerator.save_state(str(target))
            accelerator.wait_for_everyone()  # nobody leaves before the state is whole
            print(f"rank {rank} saved {target}", flush=True)
            break
        time.sleep(args.step_sleep)
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
