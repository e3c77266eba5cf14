"""FitControls: the methods through which callbacks change ViTClassifier during a fit.

The callbacks (vit/train/callbacks/) never import the LightningModule: the budget, the curricula
and the mixing schedule call these methods; besides Lightning's own API, callbacks read only the
network (`model`, whose set_patch_drop PatchDropSchedule calls) and `class_names`
(tests/test_layering.py holds this). ViTClassifier inherits the class and calls `_init_controls`
in its constructor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vit.data.augment import check_mix_args


class FitControls:
    """The methods a fit's callbacks call on the module: the schedule's clock (TimeBudget), the
    training image side and patch-drop rates (ResolutionSchedule, PatchDropSchedule) and the
    share of batches mixed (MixSchedule). Expects `model`, `hparams` and `_trainer` of a
    LightningModule wrapping a VisionTransformer."""

    def _init_controls(self, mix_prob: float) -> None:
        self.train_side: int | None = None  # the training images' side, when not the full one
        self.mix_prob = mix_prob  # the share of batches mixed now: a curriculum may change it
        # the curricula's stages [(fraction of training, value)]: their shapes compile at fit start
        self._planned_sides: list[tuple[float, int]] = []
        self._planned_drops: list[tuple[float, float]] = []
        self._progress: Callable[[], float] | None = None  # the schedule's clock, if not the steps

    @property
    def compiles_in_fit(self) -> bool:
        """Whether the fit compiles the network or the augmentation (on_fit_start) or the
        optimizer's step (its first): its first steps then include compiling."""
        augment = getattr(getattr(self._trainer, "datamodule", None), "train_augment", None)
        compiled_step = (self.hparams.get("optimizer") or {}).get("compile", False)
        return bool(
            self.hparams.torch_compile or compiled_step or getattr(augment, "compiled", False)
        )

    def schedule_on(self, progress: Callable[[], float] | None) -> None:
        """Run the learning-rate schedule on `progress()`, the fraction of training done in [0, 1]
        (a wall-clock budget's: vit.train.callbacks.TimeBudget calls this at setup), instead of
        on the optimizer steps; None: on the steps. Takes effect when the optimizers are built."""
        self._progress = progress

    def plan_train_resolutions(self, stages: Sequence[tuple[float, int]]) -> None:
        """Check that each stage's training image side ([(fraction, side)]) is a positive multiple
        of the patch, and let the network take those grids (VisionTransformer.set_dynamic_img_size): what a resolution
        curriculum calls at setup, before any compile."""
        patch = self.model.patch_embed.patch_size
        for _, side in stages:
            if side < patch or side % patch:
                raise ValueError(
                    f"side {side} is not a positive multiple of the patch size {patch}"
                )
        self.model.set_dynamic_img_size(True)
        self._planned_sides = list(stages)

    def plan_patch_drops(self, stages: Sequence[tuple[float, float]]) -> None:
        """The patch-drop rates a curriculum will set, by stage: with torch_compile, each (side,
        rate) that occurs is a shape that on_fit_start compiles before training starts."""
        self._planned_drops = list(stages)

    @property
    def mixes_images(self) -> bool:
        """Whether training mixes images (mixup_alpha or cutmix_alpha > 0)."""
        return self.hparams.mixup_alpha > 0 or self.hparams.cutmix_alpha > 0

    def set_mix_prob(self, prob: float) -> None:
        """Mix this share of the training batches from the next step on (a curriculum's call)."""
        check_mix_args(self.hparams.mixup_alpha, self.hparams.cutmix_alpha, prob)
        self.mix_prob = prob

    def set_train_resolution(self, side: int | None) -> None:
        """Resize training images to side x side before the network from the next step on (None:
        train at the data's size). Evaluation always runs at the full size."""
        self.train_side = side
