"""Lightning callbacks: training behaviour that cuts across the steps. A wall-clock budget, the
resolution and patch-drop curricula, the finite-loss guard, last.ckpt by step and epoch, an
exponential moving average of the weights, and attention pictures logged while training."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, WeightAveraging
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from vit.schedule import check_stages, stage_value


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


class TimeBudget(L.Callback):
    """A wall-clock budget for a fit: training stops when `minutes` are used (validation counts),
    after a last validation, and the learning-rate schedule and the curricula run on the fraction
    of the budget used instead of the steps (set model.schedule.warmup_fraction; max_epochs is
    then only an upper bound). Not bitwise reproducible: the clock decides at which step each
    thing happens. The time used is saved in checkpoints, so a resumed fit goes on from there.

    With model.torch_compile, the fit's first training step and first validation, where the
    compiles happen, count toward the budget but not toward the schedule's clock: they would
    otherwise spend the warm-up. Under DDP the time is rank 0's, so every rank agrees.

    Args:
        minutes: The budget, in minutes of wall-clock time.
    """

    def __init__(self, *, minutes: float) -> None:
        if not minutes > 0:
            raise ValueError(f"TimeBudget minutes={minutes} must be positive, e.g. 60.")
        self.minutes = minutes
        self.clock = time.monotonic  # tests replace it with a fake clock
        self.progress = 0.0  # the fraction used, as read at the start of the current step
        self._trainer: L.Trainer | None = None
        self._start: float | None = None
        self._elapsed_before = 0.0  # seconds used before a resume
        # seconds kept off the schedule's clock, and since when the span under way has run
        self._off_clock_s = 0.0
        self._off_clock_since: float | None = None
        self._first_val_pending = False
        self._step: int | None = None  # the global step `progress` was read at

    @property
    def state_key(self) -> str:
        return "TimeBudget"  # one key for subclasses too, and for migrated checkpoints

    def elapsed_s(self) -> float:
        """Wall-clock seconds of training so far (validation included), across resumes."""
        return self._elapsed_before if self._start is None else self.clock() - self._start

    def fraction(self) -> float:
        """The fraction of the budget used, on the schedule's clock, in [0, 1]."""
        budget = 60.0 * self.minutes
        since = self._off_clock_since  # in a span off the clock, the schedule waits at its start
        elapsed = self._rank0_elapsed_s() if since is None else since
        if elapsed >= budget:
            return 1.0
        return max(0.0, (elapsed - self._off_clock_s) / (budget - self._off_clock_s))

    def update(self, trainer: L.Trainer) -> float:
        """`progress`, read once per step whoever asks first (the curricula, or this callback)."""
        if self._step != trainer.global_step:
            self._step, self.progress = trainer.global_step, self.fraction()
        return self.progress

    def _rank0_elapsed_s(self) -> float:
        elapsed = self.elapsed_s()
        return elapsed if self._trainer is None else self._trainer.strategy.broadcast(elapsed, 0)

    def _off_clock_now_s(self) -> float:
        if self._off_clock_since is None:
            return self._off_clock_s
        return self._off_clock_s + self._rank0_elapsed_s() - self._off_clock_since

    def _end_off_clock(self) -> None:
        self._off_clock_s, self._off_clock_since = self._off_clock_now_s(), None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        every = trainer.check_val_every_n_epoch
        if every not in (None, 1):
            raise ValueError(
                f"check_val_every_n_epoch={every} with vit.callbacks.TimeBudget: training stops "
                f"mid-epoch when the time is up, and Lightning validates there only in an epoch "
                f"it validates in. Use check_val_every_n_epoch: 1 and a time interval such as "
                f'val_check_interval: "00:00:05:00".'
            )
        self._start = self.clock() - self._elapsed_before
        self._step = None
        if pl_module.hparams.get("torch_compile"):
            self._off_clock_since, self._first_val_pending = self._elapsed_before, True

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.update(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._end_off_clock()  # after the fit's first step; then a no-op
        if self.fraction() >= 1.0:
            trainer.should_stop = True  # Lightning validates once more, then stops

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._first_val_pending and not trainer.sanity_checking:
            self._off_clock_since, self._first_val_pending = self._rank0_elapsed_s(), False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end_off_clock()  # after the fit's first validation; else a no-op

    def state_dict(self) -> dict[str, float]:
        return {"elapsed_s": self.elapsed_s(), "off_clock_s": self._off_clock_now_s()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._elapsed_before = float(state_dict.get("elapsed_s", 0.0))
        self._off_clock_s = float(state_dict.get("off_clock_s", 0.0))


def time_budget(trainer: L.Trainer) -> TimeBudget | None:
    """The fit's TimeBudget callback, if it has one."""
    return next((c for c in trainer.callbacks if isinstance(c, TimeBudget)), None)


def fit_progress(trainer: L.Trainer) -> float:
    """The fraction of training done, in [0, 1]: of the TimeBudget when the fit has one, else of
    the planned optimizer steps."""
    budget = time_budget(trainer)
    if budget is not None:
        return budget.update(trainer)
    return min(1.0, trainer.global_step / max(1, int(trainer.estimated_stepping_batches)))


class ResolutionSchedule(L.Callback):
    """A low-resolution curriculum: training images are resized to a smaller side for the early
    part of training (fewer tokens, more images per second), then to the full size. The position
    table is resized on the fly, so the model stays the same; evaluation is at the full size.

    Args:
        stages: [[fraction of training, image side], ...]; fractions start at 0 and rise, each
            side a multiple of the patch size. E.g. [[0, 16], [0.25, 24], [0.5, 32]].
    """

    EXAMPLE = (
        "e.g. [[0, 16], [0.3, 24], [0.55, 32]]: 16x16 images for the first 30% of training, "
        "24x24 until 55%, then 32x32"
    )

    def __init__(self, *, stages: list[tuple[float, int]]) -> None:
        self.stages = check_stages(
            stages, name="ResolutionSchedule stages", value="side", cast=int, example=self.EXAMPLE
        )

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        patch_embed = pl_module.model.patch_embed
        for _, side in self.stages:
            if side < patch_embed.patch_size or side % patch_embed.patch_size:
                raise ValueError(
                    f"ResolutionSchedule side {side} is not a positive multiple of the patch "
                    f"size {patch_embed.patch_size}; {self.EXAMPLE}"
                )
        patch_embed.dynamic_img_size = True  # other grids than the full one, in training

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        pl_module.train_side = stage_value(self.stages, fit_progress(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.train_side = None


class PatchDropSchedule(L.Callback):
    """Patch dropout by stage of training: the model drops this fraction of each image's patch
    tokens in training (never in evaluation), a different fraction per stage.

    Args:
        stages: [[fraction of training, rate], ...]; fractions start at 0 and rise, rates in
            [0, 1). E.g. [[0, 0], [0.25, 0.5], [0.85, 0]].
    """

    EXAMPLE = (
        "e.g. [[0, 0], [0.5, 0.5], [0.85, 0]]: every patch token until 50% of training, half of "
        "them (drawn per image) until 85%, then every token again"
    )

    def __init__(self, *, stages: list[tuple[float, float]]) -> None:
        self.stages = check_stages(
            stages, name="PatchDropSchedule stages", value="rate", cast=float, example=self.EXAMPLE
        )
        for _, rate in self.stages:
            if not 0 <= rate < 1:
                raise ValueError(
                    f"PatchDropSchedule rate {rate} must be in [0, 1): the fraction of patch "
                    f"tokens dropped; {self.EXAMPLE}"
                )

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        rate = pl_module.model.patch_drop_rate
        if stage == "fit" and rate != 0:
            raise ValueError(
                f"model.network.patch_drop_rate={rate} and PatchDropSchedule both set the "
                "patch-drop rate: use one (a constant rate is the stages [[0, rate]])."
            )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        pl_module.model.patch_drop_rate = stage_value(self.stages, fit_progress(trainer))


class FiniteLoss(L.Callback):
    """Stop on a training loss that is not finite, before the step and before any checkpoint
    can hold diverged weights. On a CPU the loss is read at once. On a GPU, reading it would
    make the host wait for the GPU on every step, so it is copied to the host without waiting
    and read at the start of the next step, before any checkpoint is saved, and when training
    ends: the error names the step of the loss all the same. ViTClassifier adds it itself."""

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
