"""An exponential moving average of the weights (timm's EMA warm-up), on Lightning's
WeightAveraging."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor


class EMA(WeightAveraging):
    """An exponential moving average of the weights, after every optimizer step:

        ema <- d * ema + (1 - d) * weights,   d = min(decay, (1 + n) / (10 + n))

    where n counts the updates so far: the average follows the weights closely at first (timm's
    EMA warm-up), so early validations do not score a lagging, half-random average. Built on
    Lightning's WeightAveraging: validation, the final test, and the `state_dict` of every
    checkpoint (what vit-evaluate and vit-visualize load) use the average; the live weights are
    saved beside it as `current_model_state`, so `--ckpt_path` resumes training them. One foreach
    lerp over the parameters per step. Not for sharded (FSDP) models.

    Args:
        decay: The average's decay d: 0.999 averages over about the last 1,000 steps.
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
