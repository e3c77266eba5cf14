"""An exponential moving average of the weights (timm's EMA warm-up), on Lightning's
WeightAveraging."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from vit.train.callbacks.budget import expected_steps


def warmed_up_decay(decay: float, n: int) -> float:
    """The decay of the average's update after n updates: timm's warm-up, (1 + n) / (10 + n),
    until it reaches `decay`."""
    return min(decay, (1 + n) / (10 + n))


class EMA(WeightAveraging):
    """An exponential moving average of the weights, after every optimizer step:

        ema <- d * ema + (1 - d) * weights,   d = min(decay, (1 + n) / (10 + n))

    where n counts the updates so far: the average follows the weights closely at first (timm's
    EMA warm-up), so early validations do not score a lagging, half-random average. With
    `fit_fraction`, d is also at most 1 - 1 / (fit_fraction x the fit's steps): the average spans
    at most that share of the fit, at any pace (a time budget makes 10,000 steps on one CPU and
    25,000 on another; under one, the fit's steps are projected from the time used so far). Built on
    Lightning's WeightAveraging: validation, the final test, and the `state_dict` of every
    checkpoint (what vit-evaluate and vit-visualize load) use the average; the live weights are
    saved beside it as `current_model_state`, so `--ckpt_path` resumes training them. One foreach
    lerp over the parameters per step. Not for sharded (FSDP) models.

    Args:
        decay: The average's decay d: 0.999 averages over about the last 1,000 steps.
        fit_fraction: If set, the longest the average may span, as a share of the fit's steps:
            0.04 keeps 1,000 steps of a 25,000-step fit and 400 of a 10,000-step one.
    """

    def __init__(self, *, decay: float = 0.999, fit_fraction: float | None = None) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(
                f"EMA decay={decay} must be in (0, 1); 0.999 averages over about the last "
                f"1,000 steps, 0.9999 over 10,000."
            )
        if fit_fraction is not None and not 0.0 < fit_fraction <= 1.0:
            raise ValueError(
                f"EMA fit_fraction={fit_fraction} must be in (0, 1], the share of the fit's steps "
                f"the average may span (0.04: the last 4%), or null for a window of steps only."
            )
        self.decay = decay
        self.fit_fraction = fit_fraction
        self._cap = 1.0  # the decay allowed by fit_fraction at this step
        self._count: int | None = None  # updates so far, on the host: read from the average once
        super().__init__(multi_avg_fn=self._update)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._count = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        """Update the average after each optimizer step (as WeightAveraging does), through
        update_average: AveragedModel's own update reads its count on the host twice a step,
        which on a GPU waits for every kernel queued so far."""
        if trainer.global_step > self._latest_update_step:
            if self.fit_fraction is not None:
                steps = expected_steps(trainer)
                self._cap = (
                    1.0 if steps is None else 1.0 - 1.0 / max(1.0, self.fit_fraction * steps)
                )
            self.update_average(pl_module)
            self._latest_update_step = trainer.global_step

    @torch.no_grad()
    def update_average(self, pl_module: torch.nn.Module) -> None:
        """One update of the average from `pl_module`'s weights and buffers: the first copies
        them, later ones call the average's rule per dtype, with the count kept on the host."""
        average = self._average_model
        assert average is not None, "update_average runs in a fit, after setup"
        if self._count is None:  # a fresh fit: 0; a resumed one: the checkpoint's count
            self._count = int(average.n_averaged)
        # no detach: under no_grad the in-place updates need none (one dispatch fewer per tensor)
        ours = [*average.module.parameters(), *average.module.buffers()]
        theirs = [*pl_module.parameters(), *pl_module.buffers()]
        if self._count == 0:
            torch._foreach_copy_(ours, theirs)
        else:
            by_dtype: dict[torch.dtype, tuple[list[Tensor], list[Tensor]]] = {}
            for a, b in zip(ours, theirs, strict=True):
                pair = by_dtype.setdefault(a.dtype, ([], []))
                pair[0].append(a)
                pair[1].append(b)
            for averaged, current in by_dtype.values():
                self._update(averaged, current, self._count)
        average.n_averaged.add_(1)  # saved in checkpoints; never read back during the fit
        self._count += 1

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Resuming a fit restores both the live weights and the average. Testing or validating
        a checkpoint after fit (`--test_after_fit`) keeps the average its `state_dict` loaded:
        WeightAveraging would load the live weights there too, and no swap follows at test."""
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
            self._count = None  # read from the restored average at its next update

    @torch.no_grad()
    def _update(
        self, averaged: list[Tensor], current: list[Tensor], num_averaged: Tensor | int
    ) -> None:
        n = int(num_averaged)  # an int from update_average: no host read
        d = min(warmed_up_decay(self.decay, n), self._cap)
        if averaged[0].is_floating_point():  # AveragedModel groups the tensors by dtype
            torch._foreach_lerp_(averaged, current, 1.0 - d)
        else:  # integer buffers, if any: follow the model
            torch._foreach_copy_(averaged, current)
