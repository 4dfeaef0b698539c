"""A job that saves a sharded checkpoint as DeepSpeed lays one out, for the checkpoint
benchmark: torch DDP (gloo), a fixed amount of CPU work per step, and every `--save-every`
steps each rank writes its shard (`--shard-mb` MB) into `<dir>/step_<N>/shard_<rank>.pt` on
its own node; after a barrier rank 0 writes `<dir>/latest` naming the tag (temporary name,
then rename). On a restart (ORCH_RESTART_COUNT > 0) it goes on from the step `latest` names.
Rank 0 prints `step N` every 10 steps and, at the end, the mean step time of the steps that
saved nothing.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--shard-mb", type=float, default=20.0)
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("ORCH_CHECKPOINT_DIR",
                                                                        "checkpoints")))
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    start = 0
    latest = args.dir / "latest"
    if int(os.environ.get("ORCH_RESTART_COUNT", "0")) > 0 and latest.exists():
        start = int(latest.read_text().strip().removeprefix("step_"))
    print(f"rank {rank}: from step {start}", flush=True)
    weights = torch.rand(256, 256)
    shard = torch.rand(int(args.shard_mb * (1 << 20) / 4))
    plain: list[float] = []
    for step in range(start, args.steps):
        began = time.perf_counter()
        for _ in range(20):
            weights = torch.tanh(weights @ weights)
        total = weights.sum().reshape(1)
        dist.all_reduce(total)
        saving = (step + 1) % args.save_every == 0
        if saving:
            tag = args.dir / f"step_{step + 1}"
            tag.mkdir(parents=True, exist_ok=True)
            torch.save(shard, tag / f"shard_{rank}.pt")
            dist.barrier()
            if rank == 0:
                (args.dir / "latest.tmp").write_text(f"step_{step + 1}\n")
                (args.dir / "latest.tmp").replace(latest)
        else:
            plain.append(time.perf_counter() - began)
        if rank == 0 and step % 10 == 0:
            print(f"step {step}", flush=True)
    if rank == 0 and plain:
        print(f"mean step time: {1000 * sum(plain) / len(plain):.2f} ms over {len(plain)} steps",
              flush=True)  # fmt: skip
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
