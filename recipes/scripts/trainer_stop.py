"""Saves when told to stop, with transformers' Trainer: the pattern of
docs/guides/stopping.md, as a callback.

The handler for ORCH_STOP_SIGNAL only sets a flag; at the end of each step the callback has
the ranks agree on it (an all-reduce), then asks the Trainer to save a checkpoint
(`control.should_save`: every rank takes part, as in a scheduled save) and to stop
(`control.should_training_stop`); `trainer.train()` returns and the script exits 0.

    orch launch --hostfile H --launcher torchrun recipes/scripts/trainer_stop.py -- --out DIR
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainingArguments

stop_asked = False


def on_stop(_signum: int, _frame: object) -> None:
    global stop_asked
    stop_asked = True  # only a flag: the rank may be inside a collective right now


class SaveWhenStopped(TrainerCallback):
    """At a step's end: the ranks agree on the flag; if set, save now and stop."""

    def __init__(self, stop_signal: signal.Signals, step_sleep: float) -> None:
        self.stop_signal, self.step_sleep = stop_signal, step_sleep

    def on_step_end(self, args, state, control, **kwargs):
        flag = torch.tensor([1.0 if stop_asked else 0.0], device=args.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if flag.item() > 0:
            signal.signal(self.stop_signal, signal.SIG_IGN)  # a late signal must not end it
            control.should_save = True
            control.should_training_stop = True
        else:
            time.sleep(self.step_sleep)  # the sandbox's pace: a real step takes its time
        return control


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


class Samples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x = torch.full((8,), float(index % 7))
        return {"x": x, "labels": x.sum()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--step-sleep", type=float, default=0.1)
    args = parser.parse_args()
    stop_signal = signal.Signals[os.environ.get("ORCH_STOP_SIGNAL", "SIGTERM")]
    signal.signal(stop_signal, on_stop)  # first thing: a stop may come while it starts

    training = TrainingArguments(
        output_dir=str(args.out), max_steps=100_000, per_device_train_batch_size=4,
        save_strategy="no", logging_strategy="no", report_to=[], disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(model=Regression(), args=training, train_dataset=Samples(),
                      callbacks=[SaveWhenStopped(stop_signal, args.step_sleep)])  # fmt: skip
    print(f"rank {training.process_index} up", flush=True)
    trainer.train()
    print(f"rank {training.process_index} saved at step {trainer.state.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
