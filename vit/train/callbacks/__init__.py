"""Lightning callbacks, one file per family: the wall-clock budget, the curricula, the weight
average, checkpointing and its guards, and attention pictures. The recipes' YAML adds them by
class path (vit.train.callbacks.TimeBudget, ...); vit-train adds FiniteLoss, SaveOnSigterm and
HpMetric to every fit."""

from vit.train.callbacks.budget import TimeBudget, fit_progress, time_budget
from vit.train.callbacks.checkpointing import FiniteLoss, LastCheckpoint, SaveOnSigterm
from vit.train.callbacks.curricula import MixSchedule, PatchDropSchedule, ResolutionSchedule
from vit.train.callbacks.ema import EMA
from vit.train.callbacks.hp_metric import HpMetric
from vit.train.callbacks.pictures import AttentionMapLogger

__all__ = [
    "EMA",
    "AttentionMapLogger",
    "FiniteLoss",
    "HpMetric",
    "LastCheckpoint",
    "MixSchedule",
    "PatchDropSchedule",
    "ResolutionSchedule",
    "SaveOnSigterm",
    "TimeBudget",
    "fit_progress",
    "time_budget",
]
