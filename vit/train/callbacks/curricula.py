"""Curricula by stage of training: the training image side, the patch-drop rate, and the share
of batches mixed (Mixup/CutMix)."""

from __future__ import annotations

from typing import Any

import lightning as L

from vit.train.callbacks.budget import fit_progress
from vit.train.schedule import check_stages, stage_value


class ResolutionSchedule(L.Callback):
    """A low-resolution curriculum: training images are resized to a smaller side for the early
    part of training (fewer tokens, more images per second), then to the full size. The position
    table is resized on the fly, so the model stays the same; evaluation is at the full size.
    The module does the resizing: this calls its plan_train_resolutions at setup and
    set_train_resolution at each step (vit.train.module.ViTClassifier).

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
        try:
            pl_module.plan_train_resolutions(self.stages)
        except ValueError as err:
            raise ValueError(f"ResolutionSchedule {err}; {self.EXAMPLE}") from None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        pl_module.set_train_resolution(stage_value(self.stages, fit_progress(trainer)))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.set_train_resolution(None)


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
        if stage == "fit":
            pl_module.plan_patch_drops(self.stages)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        pl_module.model.set_patch_drop(stage_value(self.stages, fit_progress(trainer)))


class MixSchedule(L.Callback):
    """The share of training batches mixed (Mixup/CutMix, set by model.mixup_alpha and
    cutmix_alpha) by stage of training: e.g. half the batches, then none for the last part, as
    CCT (arXiv 2104.05704) trains, so that the final steps see the images as they are scored.

    Args:
        stages: [[fraction of training, share mixed], ...]; fractions start at 0 and rise, shares
            in [0, 1]. E.g. [[0, 0.5], [0.85, 0]].
    """

    EXAMPLE = "e.g. [[0, 0.5], [0.85, 0]]: half the batches mixed until 85% of training, then none"

    def __init__(self, *, stages: list[tuple[float, float]]) -> None:
        self.stages = check_stages(
            stages, name="MixSchedule stages", value="share", cast=float, example=self.EXAMPLE
        )
        for _, share in self.stages:
            if not 0 <= share <= 1:
                raise ValueError(f"MixSchedule share {share} must be in [0, 1]; {self.EXAMPLE}")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and not pl_module.mixes_images:
            raise ValueError(
                "MixSchedule sets the share of batches mixed, but the model mixes none: set "
                "model.mixup_alpha or model.cutmix_alpha > 0 (0.8 and 1.0 are DeiT's)."
            )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        pl_module.set_mix_prob(stage_value(self.stages, fit_progress(trainer)))
