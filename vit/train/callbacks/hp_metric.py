"""The validation accuracy as TensorBoard's `hp_metric`, the column its HParams tab compares
runs by."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger


class HpMetric(L.Callback):
    """After each validation, log `monitor`'s value as `hp_metric` to the TensorBoard loggers.

    Lightning's TensorBoardLogger declares `hp_metric` with the run's hyperparameters and logs a
    placeholder, -1, at step 0: with nothing after it, the HParams tab shows -1 for every run.
    The tab shows a metric's latest value, so after this callback it shows the run's last
    validation accuracy. Only TensorBoard gets it: in metrics.csv it would copy `val/acc`.
    A resumed fit logs the placeholder again; the value its checkpoint holds follows it, at the
    resumed step. vit-train adds it to every fit (vit/commands/train.py).

    Args:
        monitor: The logged metric to show as hp_metric.
    """

    def __init__(self, *, monitor: str = "val/acc") -> None:
        self.monitor = monitor
        self.last: float | None = None  # the latest value logged, kept in checkpoints
        self._to_resume: float | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.last = None  # a fit's own: a resumed one's comes from its checkpoint, after this
        self._to_resume = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._to_resume = self.last  # resumed: the run's value, after Lightning's placeholder

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        # at the first step's start: Lightning's count of batches stepped, the step the logs go
        # on from, is one short until then after a resume
        if self._to_resume is not None:
            self._log(trainer, self._to_resume)
            self._to_resume = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or value is None:
            return
        self.last = float(value)
        self._log(trainer, self.last)

    @staticmethod
    def _log(trainer: L.Trainer, value: float) -> None:
        # the step Lightning logs val/acc at: its count of batches stepped, raised only after
        # the validation that ends a step (global_step is one ahead there)
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):  # its log_metrics writes on rank 0 only
                logger.log_metrics({"hp_metric": value}, step=step)

    def state_dict(self) -> dict[str, float | None]:
        return {"last": self.last}

    def load_state_dict(self, state_dict: dict[str, float | None]) -> None:
        self.last = state_dict["last"]
