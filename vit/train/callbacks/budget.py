"""A wall-clock budget for a fit, and the fraction of training done that the schedule and the
curricula run on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import lightning as L


@runtime_checkable
class Scheduled(Protocol):
    """What TimeBudget needs of the LightningModule (ViTClassifier offers it): to run the
    learning-rate schedule on the budget's clock, and whether the fit starts by compiling."""

    compiles_in_fit: bool

    def schedule_on(self, progress: Callable[[], float] | None) -> None: ...


def _scheduled(pl_module: L.LightningModule) -> Scheduled:
    if not isinstance(pl_module, Scheduled):
        raise TypeError(
            f"TimeBudget needs a LightningModule with schedule_on() and compiles_in_fit, as "
            f"vit.train.module.ViTClassifier has; {type(pl_module).__name__} has not."
        )
    return pl_module


class TimeBudget(L.Callback):
    """A wall-clock budget for a fit: training stops when `minutes` are used (validation counts),
    after a last validation, and the learning-rate schedule and the curricula run on the fraction
    of the budget used instead of the steps (set model.schedule.warmup_fraction; max_epochs is
    then only an upper bound). Not bitwise reproducible: the clock decides at which step each
    thing happens. The time used is saved in checkpoints, so a resumed fit goes on from there.

    With model.torch_compile, the compiles at fit start (every shape of the curricula:
    vit/train/warmup.py), the fit's first training step and its first validation count toward
    the budget but not toward the schedule's clock: they would otherwise spend the warm-up. Under DDP the time is rank 0's, so every rank agrees.

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
        self._fit_start: float | None = None
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
        if stage == "fit":
            _scheduled(pl_module).schedule_on(lambda: self.progress)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            _scheduled(pl_module).schedule_on(None)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_start = self.clock()  # callbacks' on_fit_start runs before the module's compile

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        every = trainer.check_val_every_n_epoch
        if every not in (None, 1):
            raise ValueError(
                f"check_val_every_n_epoch={every} with vit.train.callbacks.TimeBudget: training stops "
                f"mid-epoch when the time is up, and Lightning validates there only in an epoch "
                f"it validates in. Use check_val_every_n_epoch: 1 and a time interval such as "
                f'val_check_interval: "00:00:05:00".'
            )
        # compiling: the budget runs from fit start, where the curricula's shapes were compiled
        since = self._fit_start if _scheduled(pl_module).compiles_in_fit else None
        self._start = (self.clock() if since is None else since) - self._elapsed_before
        self._step = None
        if _scheduled(pl_module).compiles_in_fit:
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


def expected_steps(trainer: L.Trainer) -> float | None:
    """The optimizer steps the fit will have made when it ends: under a TimeBudget, the steps
    made before the current one over the share of the budget they used (None until some time is
    used), else the planned steps."""
    budget = time_budget(trainer)
    if budget is None:
        return float(trainer.estimated_stepping_batches)
    before = trainer.global_step - 1  # the progress was read as the step just made began
    return before / budget.progress if before > 0 and budget.progress > 0 else None


def fit_progress(trainer: L.Trainer) -> float:
    """The fraction of training done, in [0, 1]: of the TimeBudget when the fit has one, else of
    the planned optimizer steps."""
    budget = time_budget(trainer)
    if budget is not None:
        return budget.update(trainer)
    return min(1.0, trainer.global_step / max(1, int(trainer.estimated_stepping_batches)))
