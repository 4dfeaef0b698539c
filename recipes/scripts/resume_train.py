"""A training script that survives a restart: it checkpoints, and resumes by ORCH_RESTART_COUNT.

Plain torch DDP (gloo on CPU, NCCL on GPUs) fitting y = 3x - 1 with a tiny MLP. Rank 0
saves the model, the optimizer and the next step every `--save-every` steps to
`<checkpoint-dir>/<job id>.pt`, atomically (a node may die in the middle of a save). When
orch restarts the job (ORCH_RESTART_COUNT > 0) every rank loads that checkpoint and goes on
from its step; a new job (another job id) starts from scratch. The checkpoint directory is
orch's --checkpoint-dir (ORCH_CHECKPOINT_DIR): with no shared filesystem, orch copies each
checkpoint to another node as it is written and puts the newest back on every node of the
restarted job. The world size may change between attempts (--min-nodes): each rank takes its
share of every batch by its rank, so a data-parallel run goes on with fewer ranks.

When orch stops the job (the first Ctrl-C, `orch stop`, --time-limit), every rank gets
ORCH_STOP_SIGNAL: the handler only sets a flag, the ranks agree at the next step boundary
(an all-reduce of the flag), rank 0 saves that step's checkpoint, and every rank exits 0
within ORCH_STOP_GRACE seconds. A new job goes on from it with `--resume-from <file>`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.1, help="seconds per step")
    # orch's --checkpoint-dir (ORCH_CHECKPOINT_DIR): orch copies each checkpoint to other
    # nodes and puts the newest back on a restarted job's nodes, with nothing shared.
    parser.add_argument("--checkpoint-dir", type=Path,
                        default=Path(os.environ.get("ORCH_CHECKPOINT_DIR", "checkpoints")))
    parser.add_argument("--resume-from", type=Path, default=None,
                        help="a checkpoint of an earlier job (one a stop saved) to go on from")
    return parser.parse_args()


class StopFlag:
    """Set by orch's stop signal (ORCH_STOP_SIGNAL): the handler does nothing else, since the
    rank may be inside a collective when it comes."""

    def __init__(self) -> None:
        self.asked = False
        self.signum = signal.Signals[os.environ.get("ORCH_STOP_SIGNAL", "SIGTERM")]
        signal.signal(self.signum, self._asked)

    def _asked(self, _signum: int, _frame: object) -> None:
        self.asked = True

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank was asked to stop: every rank gets the same answer at the same
        step, however far apart the signal reached them."""
        flag = torch.tensor([1.0 if self.asked else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() == 0:
            return False
        # The others may have agreed before the signal reached this rank: when it comes, it
        # must not end the rank while it saves, nor as Python exits (which puts back the
        # default action of a signal with a handler, not of one ignored).
        signal.signal(self.signum, signal.SIG_IGN)
        return True


def batch(step: int, rank: int, world: int, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's batch, the same whatever the world size; this rank's share of it."""
    generator = torch.Generator().manual_seed(step)
    x = torch.rand(size, 1, generator=generator)
    mine = x[rank::world]
    return mine, 3 * mine - 1


def save(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    partial = path.with_suffix(".partial")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
               partial)  # fmt: skip
    partial.replace(path)  # a reader sees the old checkpoint or the new one, never half


def main() -> int:
    args = parse_args()
    stop = StopFlag()  # before anything slow: a stop may come at any time
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("ORCH_RESTART_COUNT", "0"))
    checkpoint = args.checkpoint_dir / f"{os.environ.get('ORCH_JOB_ID', 'job')}.pt"
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    earlier = checkpoint if restart > 0 and checkpoint.exists() else args.resume_from
    if earlier is not None:
        state = torch.load(earlier, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    print(f"rank {rank}/{world}: attempt {restart + 1}, from step {start}", flush=True)
    ddp = DistributedDataParallel(model)
    if rank == 0:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    loss = torch.zeros(())
    for step in range(start, args.steps):
        x, y = batch(step, rank, world)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and (step + 1) % args.save_every == 0:
            save(checkpoint, model, optimizer, step + 1)
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
        if stop.agreed(device):
            if rank == 0:
                save(checkpoint, model, optimizer, step + 1)
                print(f"stopped at step {step + 1}: saved {checkpoint}", flush=True)
            dist.barrier()  # nobody leaves before the checkpoint is whole
            dist.destroy_process_group()
            return 0
        time.sleep(args.step_sleep)
    print(f"rank {rank}: done at step {args.steps}, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
