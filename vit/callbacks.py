"""Lightning callbacks: attention pictures logged while training, last.ckpt by step and epoch, and an
exponential moving average of the weights."""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, WeightAveraging
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor


class AttentionMapLogger(L.Callback):
    """Every `every_n_epochs`, log rollout overlays and a layers x heads grid of CLS maps for the
    first `num_images` validation images (the same images each time) to TensorBoard."""

    def __init__(self, *, every_n_epochs: int = 5, num_images: int = 4) -> None:
        if every_n_epochs < 1 or num_images < 1:
            raise ValueError(
                f"every_n_epochs={every_n_epochs} and num_images={num_images} must be >= 1."
            )
        self.every_n_epochs = every_n_epochs
        self.num_images = num_images

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        data = getattr(trainer.datamodule, "val_dataset", None)
        if not loggers or data is None or not trainer.is_global_zero:
            return
        import matplotlib.pyplot as plt

        from vit.visualize import render

        images, labels = data.__getitems__(list(range(min(self.num_images, len(data)))))
        model = pl_module.model
        classes = pl_module.hparams.get("class_names") or [str(i) for i in range(model.num_classes)]
        figures = render(model, images.to(pl_module.device), classes=classes, labels=labels)
        for name in ("rollout", "layers_heads_0"):
            fig = figures[name]
            fig.canvas.draw()
            pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3)
            for logger in loggers:
                logger.experiment.add_image(
                    f"attention/{name}",
                    torch.from_numpy(pixels),
                    trainer.global_step,
                    dataformats="HWC",
                )
        for fig in figures.values():
            plt.close(fig)


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt` every `every_n_train_steps` steps *and* at the end of every epoch.

    Lightning's ModelCheckpoint does one or the other: with a step interval it skips the epoch
    end, so the final weights of a run could be up to n steps older than the run.
    """

    def __init__(self, *, every_n_train_steps: int = 100, dirpath: str | None = None) -> None:
        super().__init__(
            dirpath=dirpath, every_n_train_steps=every_n_train_steps, save_top_k=0, save_last=True
        )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class EMA(WeightAveraging):
    """An exponential moving average of the weights, after every optimizer step:

        ema <- d * ema + (1 - d) * weights,   d = min(decay, (1 + n) / (10 + n))

    where n counts the updates so far: the average follows the weights closely at first (timm's
    EMA warm-up), so early validations do not score a lagging, half-random average. Built on
    Lightning's WeightAveraging: validation, the final test, and the `state_dict` of every
    checkpoint (what vit-evaluate and vit-visualize load) use the average; the live weights are
    saved beside it as `current_model_state`, so `--ckpt_path` resumes training them. One foreach
    lerp over the parameters per step. Not for sharded (FSDP) models.
    """

    def __init__(self, *, decay: float = 0.999) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(
                f"EMA decay={decay} must be in (0, 1); 0.999 averages over about the last "
                f"1,000 steps, 0.9999 over 10,000."
            )
        self.decay = decay
        super().__init__(multi_avg_fn=self._update)

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Resuming a fit restores both the live weights and the average. Testing or validating
        a checkpoint after fit (`--test_after_fit`) keeps the average its `state_dict` loaded:
        WeightAveraging would load the live weights there too, and no swap follows at test."""
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)

    @torch.no_grad()
    def _update(self, averaged: list[Tensor], current: list[Tensor], num_averaged: Tensor) -> None:
        n = int(num_averaged)
        d = min(self.decay, (1 + n) / (10 + n))
        if averaged[0].is_floating_point():  # AveragedModel groups the tensors by dtype
            torch._foreach_lerp_(averaged, current, 1.0 - d)
        else:  # integer buffers, if any: follow the model
            torch._foreach_copy_(averaged, current)
