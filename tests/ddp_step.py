"""One training step of a tiny ViTClassifier, saving rank 0's weights and gradients.

Imported by tests/test_ddp.py for the single-process step, and run as a script for the DDP one:
`python tests/ddp_step.py DATA OUT --devices 2` uses Lightning's `ddp` strategy, whose launcher
starts rank 1 by running this same command again (as `vit-train --trainer.strategy=ddp` does).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch

from vit.train.datamodule import CIFAR10DataModule
from vit.train.module import ViTClassifier

TINY_NETWORK = dict(
    preset="vit_nano", num_classes=3, patch_size=8, embed_dim=32, depth=2, num_heads=2
)


class SaveGrads(L.Callback):
    """Rank 0 saves the (all-reduced, under DDP) gradients just before the optimizer step."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.is_global_zero:
            grads = {n: p.grad.clone() for n, p in pl_module.model.named_parameters()}
            torch.save(grads, self.path)


def one_step(data: Path, out: Path, *, batch_size: int, **trainer_kwargs) -> None:
    """Train one step on `data` (no augmentation: the same pixels on every run); rank 0 writes
    out/grads.pt (before the step) and out/weights.pt (after it)."""
    out.mkdir(parents=True, exist_ok=True)
    dm = CIFAR10DataModule(
        data_dir=str(data),
        cache_dir=str(out / "cache"),
        batch_size=batch_size,
        val_size=6,
        crop_padding=0,
        hflip=False,
    )
    torch.manual_seed(0)
    module = ViTClassifier(
        network=TINY_NETWORK, optimizer={"lr": 1e-2}, schedule={"warmup_epochs": 0.0}
    )
    trainer = L.Trainer(
        max_steps=1,
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[SaveGrads(out / "grads.pt")],
        **trainer_kwargs,
    )
    trainer.fit(module, dm)
    if trainer.is_global_zero:
        torch.save(module.model.state_dict(), out / "weights.pt")
    if torch.distributed.is_initialized():  # shut gloo down before the interpreter does
        torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    one_step(args.data, args.out, batch_size=args.batch_size, devices=args.devices, strategy="ddp")


if __name__ == "__main__":
    main()
