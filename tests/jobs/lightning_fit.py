"""A Lightning fit as its users write one, for the tests of how orch and Lightning agree.

Lightning picks its TorchElastic environment under torchrun (orch's launchers), so its own
SLURM requeue never runs; on the stop signal (SIGTERM) every rank learns of it at the next
step boundary (Lightning broadcasts rank 0's flag each step), `OnExceptionCheckpoint` saves
the checkpoint and the fit ends with exit 0. A restarted attempt (ORCH_RESTART_COUNT > 0)
resumes from that checkpoint.

`--steps N`, `--step-sleep S` (each step's seconds), `--checkpoint-dir DIR`, `--save-seconds
S` (the save takes S seconds more, like a large model's).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from job_end import end


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-sleep", type=float, default=0.5)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--save-seconds", type=float, default=0.0)
    args = parser.parse_args()

    import lightning as L
    import torch
    from lightning.pytorch.callbacks import OnExceptionCheckpoint

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _index):
            time.sleep(args.step_sleep)
            if self.global_step % 10 == 0:
                print(f"rank {self.global_rank} step {self.global_step}", flush=True)
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_start(self) -> None:
            restart = os.environ.get("ORCH_RESTART_COUNT", "0")
            print(f"rank {self.global_rank} restart {restart} starts at step "
                  f"{self.global_step}", flush=True)  # fmt: skip

    class SlowSave(OnExceptionCheckpoint):
        def on_exception(self, trainer, pl_module, exception) -> None:
            time.sleep(args.save_seconds)
            super().on_exception(trainer, pl_module, exception)
            print(f"rank {trainer.global_rank} saved at step {trainer.global_step} "
                  f"({type(exception).__name__})", flush=True)  # fmt: skip

    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    save = SlowSave(str(args.checkpoint_dir))
    trainer = L.Trainer(
        accelerator="cpu", strategy="ddp", devices=local,
        num_nodes=int(os.environ["WORLD_SIZE"]) // local, max_steps=args.steps,
        callbacks=[save], logger=False,
        default_root_dir=str(args.checkpoint_dir), enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    saved = Path(save.ckpt_path)
    restarted = int(os.environ.get("ORCH_RESTART_COUNT", "0")) > 0
    trainer.fit(Model(), loader, ckpt_path=str(saved) if restarted and saved.exists() else None)
    print(f"rank {trainer.global_rank} done: {trainer.global_step} steps", flush=True)
    return 0


if __name__ == "__main__":
    end(main())
