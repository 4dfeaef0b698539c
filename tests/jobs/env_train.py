"""A small real data-parallel training job (torch.distributed over gloo, on CPU) that says
which environment runs it. Gradients are averaged with all_reduce by hand.

Every rank prints `rank R/W prefix=<sys.prefix> executable=<sys.executable>`, fits y = 3x - 1
with a tiny MLP for `--steps` steps on its shard of synthetic data, and rank 0 prints the
final loss, which must have fallen.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
from job_end import end
from torch import nn


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} prefix={sys.prefix} executable={sys.executable}", flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    for parameter in model.parameters():  # every rank starts from rank 0's weights
        dist.broadcast(parameter.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1000 + rank)
    first = last = 0.0
    for step in range(args.steps):
        x = torch.rand(32, 1, generator=generator) * 2 - 1
        loss = nn.functional.mse_loss(model(x), 3 * x - 1)
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():  # the data-parallel step: average the gradients
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimizer.step()
        first = loss.item() if step == 0 else first
        last = loss.item()
    if rank == 0:
        print(f"trained {args.steps} steps: loss {first:.4f} -> {last:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if last < first else 1


if __name__ == "__main__":
    end(main())  # not through the interpreter's exit: see job_end.py
