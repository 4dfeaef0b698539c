"""A small real training run: accelerate + DeepSpeed ZeRO-2 on CPU over gloo.

It fits y = 3x - 1 with a tiny MLP on synthetic data, shows a tqdm bar on the
main process, prints the loss and exits 0. With `--save-every N` every rank saves the
training state (`accelerator.save_state`: with ZeRO each rank's optimizer shard on its own
node) to `<checkpoint-dir>/step_<N>/`; restarted by orch (ORCH_RESTART_COUNT > 0), it loads
the newest one there and goes on from its step. Switches let tests inject faults:
`--fail-rank R --exit-code C` makes global rank R exit with C after a step,
`--hang-after-steps N` makes one rank (default the last) stop answering, `--save-pause S`
makes each file of a save take S seconds more (a slow disk: a node can die mid-save).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, set_seed
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--fail-rank", type=int, default=None, help="this rank exits early")
    parser.add_argument("--exit-code", type=int, default=3, help="exit code of --fail-rank")
    parser.add_argument("--fail-after-steps", type=int, default=1)
    parser.add_argument("--hang-after-steps", type=int, default=None, help="a rank then hangs")
    parser.add_argument("--hang-rank", type=int, default=None, help="default: the last rank")
    parser.add_argument("--timeout", type=float, default=300.0, help="collective timeout (s)")
    parser.add_argument("--save-every", type=int, default=0, help="steps between saves (0: none)")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("ORCH_CHECKPOINT_DIR", ""),
                        help="where to save (default: orch's --checkpoint-dir)")
    parser.add_argument("--save-pause", type=float, default=0.0,
                        help="seconds after each file a save writes (a slow disk)")
    return parser.parse_args(argv)


def slow_saves(pause: float) -> None:
    """Every torch.save (accelerate's and DeepSpeed's) followed by a pause."""
    save = torch.save

    def slowly(*args: object, **kwargs: object) -> None:
        save(*args, **kwargs)  # type: ignore[arg-type]
        time.sleep(pause)

    torch.save = slowly  # type: ignore[assignment]


def make_loader(steps: int, batch_size: int, world: int) -> DataLoader:
    """Enough samples for `steps` batches on every rank once accelerate shards them."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.rand(steps * batch_size * world, 1, generator=generator) * 2 - 1
    return DataLoader(TensorDataset(x, 3 * x - 1), batch_size=batch_size, shuffle=False)


def pin_jit_build_tools() -> None:
    """Build DeepSpeed's CPU shared-memory op with this interpreter's ninja, in its own cache.

    DeepSpeed JIT-compiles that op with the first `ninja` on PATH. A system ninja
    and the virtual environment's ninja (different versions) each discard the
    other's build log, so alternating between them rebuilds the op (minutes on
    a busy machine) on every run.
    """
    bin_dir = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(bin_dir, "ninja")):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    default_cache = os.path.join(os.path.expanduser("~"), ".cache", "orch", "torch_extensions")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", default_cache)


def newest_saved(directory: str) -> tuple[str, int] | None:
    """The newest `step_<N>/` under `directory` with accelerate's state in it, and N."""
    found = []
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        if name.startswith("step_") and name[5:].isdigit():
            found.append((int(name[5:]), os.path.join(directory, name)))
    if not found:
        return None
    step, path = max(found)
    return path, step


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pin_jit_build_tools()
    if args.save_pause:
        slow_saves(args.save_pause)
    process_group = InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=args.timeout))
    accelerator = Accelerator(kwargs_handlers=[process_group])
    set_seed(0)
    rank, world = accelerator.process_index, accelerator.num_processes
    node = os.uname().nodename
    print(f"rank {rank}/{world} on {node}: {accelerator.distributed_type}", flush=True)

    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = make_loader(args.steps, args.batch_size, world)
    # DeepSpeed takes its micro-batch size from the prepared data loader.
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    hang_rank = world - 1 if args.hang_rank is None else args.hang_rank
    start = 0
    saved = newest_saved(args.checkpoint_dir) if args.checkpoint_dir else None
    if saved is not None and int(os.environ.get("ORCH_RESTART_COUNT", "0")) > 0:
        accelerator.load_state(saved[0])
        start = saved[1]
        loader = accelerator.skip_first_batches(loader, start)
        print(f"rank {rank}: resumed from step {start} ({saved[0]})", flush=True)
    bar = tqdm(total=args.steps, initial=start, desc="train",
               disable=not accelerator.is_main_process)  # fmt: skip
    loss_value = float("nan")
    for step, (x, y) in enumerate(loader, start=start + 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        loss_value = accelerator.reduce(loss.detach(), reduction="mean").item()
        bar.set_postfix(loss=f"{loss_value:.4f}")
        bar.update(1)
        if step % 10 == 0:
            accelerator.print(f"step {step} loss {loss_value:.4f}", flush=True)
        if args.save_every and step % args.save_every == 0 and args.checkpoint_dir:
            if args.save_pause:
                print(f"rank {rank}: saving step {step}", flush=True)
            accelerator.save_state(os.path.join(args.checkpoint_dir, f"step_{step}"))
        if args.fail_rank == rank and step >= args.fail_after_steps:
            print(f"rank {rank} on {node}: failing on purpose at step {step}", flush=True)
            sys.stdout.flush()
            os._exit(args.exit_code)
        hang_now = args.hang_after_steps is not None and step >= args.hang_after_steps
        if hang_now and rank == hang_rank:
            print(f"rank {rank} on {node}: hanging on purpose at step {step}", flush=True)
            while True:
                time.sleep(3600)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    bar.close()
    if accelerator.is_main_process:
        print(f"final loss {loss_value:.4f} after {args.steps} steps on {world} ranks", flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
