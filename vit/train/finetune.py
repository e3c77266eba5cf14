"""Fine-tuning: ViTClassifier's `init_from` applied when a fresh fit starts (the weights logic:
vit/io/init_from.py). A resumed fit (`--ckpt_path`) takes every weight from its checkpoint
instead, so the source is not read then and may have moved since."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from vit.data.datasets import Normalization, checked_normalization
from vit.io.init_from import InitReport, init_from, read_source


def start_from_weights(module: L.LightningModule) -> InitReport | None:
    """Load `module.hparams.init_from` into `module.model` at the start of a fresh fit, and log
    what was loaded, resized and newly initialised. Runs in on_fit_start: after the checkpoint
    of a resumed fit is restored (whose path the trainer then knows) and before any compile."""
    source = module.hparams.get("init_from")
    if not source:
        return None
    if module.trainer.ckpt_path:
        rank_zero_info(f"init_from {source}: not applied, the fit resumes from a checkpoint")
        return None
    report = init_from(module.model, source, class_names=module.hparams.get("class_names"))
    rank_zero_info(report.summary())
    return report


def source_normalization(source: str) -> Normalization | None:
    """The mean and std `source`'s weights record (None where they record none): a fine-tune
    feeds its model images normalized as the weights were trained on."""
    recorded = read_source(source).normalization
    if recorded is None:
        return None
    return checked_normalization(*recorded, where=f"init_from {source}")
