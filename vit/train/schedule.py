"""The learning-rate schedule (warm-up, then cosine or linear decay) and the stage lists that
curricula are written in, both driven by the fraction of training done."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

log = logging.getLogger(__name__)
DECAYS = ("cosine", "linear")  # shapes of the learning-rate decay after warm-up
FINE = 1_000_000  # steps of the schedule's table when it runs on a fraction of the time


@dataclass
class ScheduleConfig:
    """The learning-rate schedule: linear warm-up from ~0 to the peak, then a decay to min_lr.

    Args:
        warmup_epochs: Epochs of warm-up; used when warmup_fraction is None.
        warmup_fraction: Fraction of training spent warming up (e.g. 0.05); required with a
            wall-clock budget (vit.train.callbacks.TimeBudget), where the epochs are not known ahead.
        min_lr: The learning rate at the end of training (0: decay to zero).
        decay: Shape of the decay: cosine, or linear (robust for short budgets: "Budgeted
            Training", Li et al. 2020).
    """

    warmup_epochs: float = 1.0
    warmup_fraction: float | None = None
    min_lr: float = 0.0
    decay: Literal["cosine", "linear"] = "cosine"

    def __post_init__(self) -> None:
        check_lr_decay(self.decay)
        if self.warmup_epochs < 0:
            raise ValueError(f"schedule.warmup_epochs={self.warmup_epochs} must be >= 0.")
        if self.warmup_fraction is not None and not 0 <= self.warmup_fraction < 1:
            raise ValueError(
                f"schedule.warmup_fraction={self.warmup_fraction} must be in [0, 1), e.g. 0.05."
            )
        if self.min_lr < 0:
            raise ValueError(f"schedule.min_lr={self.min_lr} must be >= 0.")


def check_lr_decay(decay: str) -> None:
    """The one check of a decay shape, for ScheduleConfig and WarmupCosine."""
    if decay not in DECAYS:
        raise ValueError(
            f"decay={decay!r} is not a schedule shape: use one of {DECAYS} "
            "(cosine is the default; linear decays to min_lr in a straight line)."
        )


class WarmupCosine:
    """LR multiplier: linear from ~0 to 1 over warmup_steps, then down to min_ratio at total.

    `decay="cosine"` (the default) follows half a cosine; `decay="linear"` falls in a straight
    line: lower than the cosine in the first half of the decay, higher in the second.
    """

    def __init__(
        self,
        *,
        total_steps: int,
        warmup_steps: int,
        min_ratio: float = 0.0,
        decay: Literal["cosine", "linear"] = "cosine",
    ) -> None:
        check_lr_decay(decay)
        self.total, self.warmup, self.min_ratio = total_steps, warmup_steps, min_ratio
        self.decay = decay

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        shape = 1 - progress if self.decay == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return self.min_ratio + (1 - self.min_ratio) * shape


def lr_scheduler(
    optimizer: torch.optim.Optimizer,
    config: ScheduleConfig,
    *,
    lr: float,
    total_steps: int,
    epochs: int,
    progress: Callable[[], float] | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step LambdaLR. With `progress` (a wall-clock budget: the fraction of the time used)
    the schedule runs on that fraction; else on the step count out of `total_steps`."""
    min_ratio = config.min_lr / lr
    if progress is not None:
        if config.warmup_fraction is None and config.warmup_epochs > 0:
            raise ValueError(
                "with a wall-clock budget (vit.train.callbacks.TimeBudget) the number of epochs is not "
                "known in advance: set model.schedule.warmup_fraction (e.g. 0.05 of the budget) "
                "and model.schedule.warmup_epochs: 0."
            )
        fine = WarmupCosine(
            total_steps=FINE,
            warmup_steps=min(FINE - 1, round(FINE * (config.warmup_fraction or 0.0))),
            min_ratio=min_ratio,
            decay=config.decay,
        )
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda _: fine(round(FINE * progress()))
        )
    warmup = (
        round(total_steps * config.warmup_fraction)
        if config.warmup_fraction is not None
        else round(total_steps * config.warmup_epochs / epochs)
    )
    if warmup >= total_steps > 1:  # a warm-up that long would end training at the peak
        log.warning(
            "the warm-up (%d steps) is not shorter than training (%d steps): warming up for %d "
            "so that the learning rate still decays; lower model.schedule.warmup_epochs or "
            "raise trainer.max_epochs",
            warmup,
            total_steps,
            total_steps // 2,
        )
        warmup = total_steps // 2
    schedule = WarmupCosine(
        total_steps=total_steps, warmup_steps=warmup, min_ratio=min_ratio, decay=config.decay
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def check_resumed_schedule(
    scheduler: torch.optim.lr_scheduler.LRScheduler, *, planned_steps: int, step: int, ckpt: str
) -> None:
    """A resumed fit keeps the step schedule its checkpoint saved: LambdaLR restores a callable
    object's fields, so a larger trainer.max_epochs does not stretch it. Past the old end the
    learning rate stays at min_lr: with min_lr 0 the extra steps change nothing, so such a fit is
    refused; with min_lr > 0 it is said."""
    schedules = [f for f in getattr(scheduler, "lr_lambdas", []) if isinstance(f, WarmupCosine)]
    if not schedules or planned_steps <= schedules[0].total:
        return
    end = schedules[0].total
    if step >= end and schedules[0].min_ratio == 0:
        raise ValueError(
            f"the checkpoint's learning-rate schedule ended at step {end} (the max_epochs it was "
            f"trained with); resumed at step {step}, the {planned_steps - step} more steps of this "
            "fit would train at learning rate 0 and change nothing. To train these weights "
            f"further, start a new run from them with a schedule of its own: --model.init_from "
            f"{ckpt} instead of --ckpt_path."
        )
    log.warning(
        "the resumed learning-rate schedule ends at step %d (the checkpoint's max_epochs), not at "
        "this fit's %d: the steps after it train at min_lr. --model.init_from %s instead of "
        "--ckpt_path starts a new run from the weights with a schedule of its own.",
        end,
        planned_steps,
        ckpt,
    )


def stage_value(stages: list[tuple[float, Any]], progress: float) -> Any:
    """The value of the last stage of [[fraction, value], ...] that has started."""
    return [value for start, value in stages if start <= progress][-1]


def check_stages(
    stages: Any, *, name: str, value: str, cast: type, example: str
) -> list[tuple[float, Any]]:
    """[[fraction, value], ...] with fractions of training starting at 0, rising, below 1."""
    try:
        pairs = [(float(start), cast(v)) for start, v in stages]
    except (TypeError, ValueError):
        raise ValueError(
            f"{name}={stages!r} must be a list of [fraction, {value}]; {example}"
        ) from None
    starts = [start for start, _ in pairs]
    rising = all(b > a for a, b in zip(starts, starts[1:], strict=False))
    if not pairs or starts[0] != 0 or not rising or starts[-1] >= 1:
        raise ValueError(
            f"{name}={stages!r}: the fractions must start at 0, rise, and stay below 1; {example}"
        )
    return pairs
