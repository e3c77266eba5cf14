"""Attention pictures logged to TensorBoard while training."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from vit.data.datasets import CIFAR10_NORMALIZATION


class AttentionMapLogger(L.Callback):
    """Every `every_n_epochs`, log rollout overlays and a layers x heads grid of CLS maps for the
    first `num_images` validation images (the same images each time) to TensorBoard.

    Args:
        every_n_epochs: Log the pictures after every this many epochs' validation.
        num_images: How many validation images to picture.
    """

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
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        from vit.maps.plots import render

        images, labels = data.__getitems__(list(range(min(self.num_images, len(data)))))
        model = pl_module.model
        classes = pl_module.class_names
        norm = getattr(trainer.datamodule, "normalization", CIFAR10_NORMALIZATION)
        images = images.to(pl_module.device)
        figures = render(model, images, classes=classes, labels=labels, normalization=norm)
        for name in ("rollout", "layers_heads_0"):
            fig = figures[name]
            canvas = FigureCanvasAgg(fig)  # the figures belong to no backend: draw them here
            canvas.draw()
            pixels = np.asarray(canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3)
            for logger in loggers:
                logger.experiment.add_image(
                    f"attention/{name}",
                    torch.from_numpy(pixels),
                    trainer.global_step,
                    dataformats="HWC",
                )
