"""The validation accuracy as TensorBoard's `hp_metric`, the column its HParams tab compares
runs by."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger


class HpMetric(L.Callback):
    """After each validation, log `monitor`'s value as `hp_metric` to the TensorBoard loggers.

    Lightning's TensorBoardLogger declares `hp_metric` with the run's hyperparameters and logs a
    placeholder, -1, at step 0: with nothing after it, the HParams tab shows -1 for every run.
    The tab shows a metric's latest value, so after this callback it shows the run's last
    validation accuracy. Only TensorBoard gets it: in metrics.csv it would copy `val/acc`.
    vit-train adds it to every fit (vit/commands/train.py).

    Args:
        monitor: The logged metric to show as hp_metric.
    """

    def __init__(self, *, monitor: str = "val/acc") -> None:
        self.monitor = monitor

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or value is None:
            return
        # the step Lightning logs val/acc at: its count of batches stepped, raised only after
        # the validation that ends a step (global_step is one ahead there)
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):  # its log_metrics writes on rank 0 only
                logger.log_metrics({"hp_metric": float(value)}, step=step)
