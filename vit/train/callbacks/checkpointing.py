"""Checkpointing and its guard: last.ckpt by step and by epoch, and a stop on a non-finite loss
before any checkpoint can hold diverged weights."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt` every `every_n_train_steps` steps *and* at the end of every epoch.

    Lightning's ModelCheckpoint does one or the other: with a step interval it skips the epoch
    end, so the final weights of a run could be up to n steps older than the run.

    Args:
        every_n_train_steps: Save last.ckpt after every this many optimizer steps.
        dirpath: Folder of the checkpoints (None: the run's checkpoints/ folder).
    """

    def __init__(self, *, every_n_train_steps: int = 100, dirpath: str | None = None) -> None:
        super().__init__(
            dirpath=dirpath, every_n_train_steps=every_n_train_steps, save_top_k=0, save_last=True
        )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class FiniteLoss(L.Callback):
    """Stop on a training loss that is not finite, before the step and before any checkpoint
    can hold diverged weights. On a CPU the loss is read at once. On a GPU, reading it would
    make the host wait for the GPU on every step, so it is copied to the host without waiting
    and read at the start of the next step, before any checkpoint is saved, and when training
    ends: the error names the step of the loss all the same. vit-train adds it to every fit
    (vit/commands/train.py); add it to a Trainer of your own."""

    def __init__(self) -> None:
        self._pending: tuple[Tensor, Any, tuple[int, int]] | None = None

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor
    ) -> None:
        where = (trainer.global_step, trainer.current_epoch)
        if loss.device.type != "cuda":
            self._raise_if_not_finite(loss.detach(), where)
            return
        host = torch.empty((), dtype=loss.dtype, pin_memory=True)
        host.copy_(loss.detach(), non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        self._pending = (host, copied, where)

    def check_pending(self, *args: Any) -> None:
        if self._pending is not None:
            host, copied, where = self._pending
            self._pending = None
            copied.synchronize()  # the forward that made it is long done: no wait in practice
            self._raise_if_not_finite(host, where)

    on_train_batch_start = on_save_checkpoint = on_train_end = check_pending

    @staticmethod
    def _raise_if_not_finite(loss: Tensor, where: tuple[int, int]) -> None:
        if not torch.isfinite(loss):
            step, epoch = where
            raise FloatingPointError(
                f"training loss is {loss.item()} at step {step} (epoch {epoch}); stopping so "
                f"that no checkpoint holds diverged weights. Lower model.optimizer.lr, raise the "
                f"warm-up (model.schedule), or use precision 32-true; resume from the last good "
                f"checkpoint with --ckpt_path."
            )
