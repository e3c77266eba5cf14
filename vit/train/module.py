"""ViTClassifier: the LightningModule that trains a VisionTransformer: the network, the loss, the
metrics and the steps. The optimizer is built by vit/train/optim.py, the schedule by
vit/train/schedule.py. Behaviour that cuts across the steps lives in callbacks (vit/train/callbacks/),
which this module does not import: they change it only through the methods it inherits from
FitControls (vit/train/controls.py)."""

from __future__ import annotations

import inspect
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal, get_args

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities.enums import GradClipAlgorithmType
from torch import Tensor

from vit.data.augment import check_mix_args, mix_batch
from vit.data.datasets import Normalization, checked_normalization, recorded_normalization
from vit.io.checkpoint import load_checkpoint
from vit.io.migrate import is_old_layout, migrate_checkpoint, migrate_metric_states
from vit.model.config import NetworkConfig
from vit.system.hardware import check_cpp_compiler
from vit.train.controls import FitControls
from vit.train.evaluation import flip_averaged_logits
from vit.train.finetune import source_normalization, start_from_weights
from vit.train.metrics import accuracy_metrics
from vit.train.optim import OptimizerConfig, build_optimizer, check_resume_layout
from vit.train.resume import restore_rng_and_loss, save_rng_and_loss
from vit.train.schedule import ScheduleConfig, check_resumed_schedule, lr_scheduler
from vit.train.warmup import compile_augment_for_fit, compile_for_fit

Stage = Literal["train", "val", "test"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class ViTClassifier(FitControls, L.LightningModule):
    """A VisionTransformer trained with cross-entropy: label smoothing, optional mixup/CutMix,
    top-1 and top-5 accuracy per stage. Plain values only, so that hparams.yaml is clean and
    `ViTClassifier.load_from_checkpoint(path)` works without the CLI.

    Args:
        network: The VisionTransformer: a preset and the options that override it.
        optimizer: The optimizer (AdamW, or Muon with AdamW) and its settings.
        schedule: The learning-rate schedule: warm-up, then cosine or linear decay.
        label_smoothing: Label smoothing of the training loss, in [0, 1).
        mixup_alpha: Mixup's Beta(alpha, alpha) mixing of image pairs (0: off).
        cutmix_alpha: CutMix's Beta(alpha, alpha) box size (0: off).
        mix_prob: Fraction of training batches mixed, when mixup or CutMix is on.
        test_flip: Score validation and test on the mean of each image's and its mirror's logits.
        torch_compile: Compile the network for the fit (needs a C++ compiler on a CPU).
        compile_mode: torch.compile's mode (reduce-overhead adds CUDA graphs on a GPU).
        class_names: Names of the classes in label order (None: taken from the data).
        init_from: Trained weights to start a fresh fit from (fine-tuning): a .ckpt, a
            .safetensors, a save_pretrained folder, hf-hub:owner/name or a shipped name.
        mean: Per-channel mean (pixels in [0, 1]) the inputs are normalized with; None: what
            init_from's weights record, else the data's (CIFAR-100's own, CIFAR-10's otherwise).
        std: Per-channel std, with mean.
    """

    def __init__(
        self,
        *,
        network: NetworkConfig = NetworkConfig(),  # noqa: B008  (a frozen-by-use default)
        optimizer: OptimizerConfig = OptimizerConfig(),  # noqa: B008
        schedule: ScheduleConfig = ScheduleConfig(),  # noqa: B008
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mix_prob: float = 1.0,
        test_flip: bool = False,
        torch_compile: bool = False,
        compile_mode: CompileMode = "default",
        class_names: list[str] | None = None,
        init_from: str | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
    ) -> None:
        super().__init__()
        # dicts come from checkpoints and hparams.yaml; the configs check their own values
        net = network if isinstance(network, NetworkConfig) else NetworkConfig(**network)
        opt = optimizer if isinstance(optimizer, OptimizerConfig) else OptimizerConfig(**optimizer)
        sched = schedule if isinstance(schedule, ScheduleConfig) else ScheduleConfig(**schedule)
        network, optimizer, schedule = asdict(net), asdict(opt), asdict(sched)
        self.save_hyperparameters()  # plain dicts: what hparams.yaml and checkpoints hold
        self.optimizer_config, self.schedule_config = opt, sched
        if not 0 <= sched.min_lr <= opt.lr:
            raise ValueError(f"schedule.min_lr={sched.min_lr} must be between 0 and lr={opt.lr}.")
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1).")
        check_mix_args(mixup_alpha, cutmix_alpha, mix_prob)
        if mean is not None or std is not None:
            checked_normalization(mean, std, where="model.mean and model.std")
        if compile_mode not in get_args(CompileMode):
            raise ValueError(
                f"compile_mode={compile_mode!r}: expected one of {get_args(CompileMode)} "
                "(torch.compile's modes; reduce-overhead adds CUDA graphs on a GPU)."
            )
        self.model = net.build()
        self._init_controls(mix_prob)
        # the epoch's mean training loss, kept here (not in Lightning's logger state) so that a
        # checkpoint saved mid-epoch holds it and a resumed epoch logs the same mean
        self.register_buffer("train_loss_sum", torch.zeros(()), persistent=False)
        self.register_buffer("train_loss_count", torch.zeros(()), persistent=False)
        self.top_ks, self.metrics = accuracy_metrics(net.num_classes)

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls,
        checkpoint_path: str | Path,
        map_location: Any = None,
        strict: bool = True,
        weights_only: bool | None = None,
        **overrides: Any,
    ) -> ViTClassifier:
        """The module a checkpoint was trained as, read weights-only (never running code from
        the file), from any layout vit-train has written; `overrides` replace its settings.
        `weights_only` is taken as Lightning's method takes it, and changes nothing."""
        ckpt = load_checkpoint(checkpoint_path)
        accepted = inspect.signature(cls.__init__).parameters
        saved = {k: v for k, v in ckpt["hyper_parameters"].items() if k in accepted}
        # its weights are loaded here: a later fit must not start again from init_from's
        module = cls(**{**saved, "init_from": None, **overrides})
        module.load_state_dict(ckpt["state_dict"], strict=strict)
        return module if map_location is None else module.to(map_location)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    @property
    def class_names(self) -> list[str]:
        """The classes in label order: from the data, or "0", "1", ... where it gave none."""
        names = self.hparams.get("class_names")
        return list(names) if names else [str(i) for i in range(self.model.num_classes)]

    def setup(self, stage: str) -> None:
        """Check that the data's classes match the head, and remember their names."""
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        classes = getattr(dm, "classes", None)
        if classes is None:
            return
        num_classes = self.hparams.network["num_classes"]
        if len(classes) != num_classes:
            raise ValueError(
                f"the data has {len(classes)} classes ({', '.join(classes)}) but the model was "
                f"built with num_classes={num_classes}; set model.network.num_classes: "
                f"{len(classes)} in the config."
            )
        if self.hparams.class_names is None:
            self.hparams.class_names = list(classes)
        if hasattr(dm, "use_normalization"):
            self._agree_on_normalization(dm)

    def _agree_on_normalization(self, dm: Any) -> None:
        """Record the mean and std the model is trained with (the hparams' own, or a fresh
        fine-tune's source's, or the data's) and have the data module normalize with them."""
        hp = self.hparams
        if hp.get("mean") is None:
            norm = None
            if hp.get("init_from") and not self.trainer.ckpt_path:
                norm = source_normalization(hp.init_from)
            norm = norm or dm.normalization
            hp.mean, hp.std = list(norm.mean), list(norm.std)
        dm.use_normalization(Normalization(tuple(hp.mean), tuple(hp.std)))

    def on_fit_start(self) -> None:
        """With torch_compile, compile the network in place for the fit (and the test after it):
        its parameter names and checkpoints stay those of the eager model, and loading a
        checkpoint for evaluation stays eager. Static shapes: each image size of a resolution
        curriculum, and each batch size, compiles once."""
        start_from_weights(self)  # init_from, before any compile
        if self.compiles_in_fit and self.device.type == "cpu":
            check_cpp_compiler()
        if self.hparams.torch_compile:
            self.model.compile(dynamic=False, mode=self.hparams.compile_mode)
            compile_for_fit(self, sides=self._planned_sides, drop_rates=self._planned_drops)
        compile_augment_for_fit(self)

    def _shared_step(self, batch: tuple[Tensor, Tensor], stage: Stage) -> Tensor:
        images, labels = batch
        targets = labels
        hp = self.hparams
        if stage == "train":
            if hp.mixup_alpha > 0 or hp.cutmix_alpha > 0:
                images, targets = mix_batch(
                    images,
                    labels,
                    num_classes=hp.network["num_classes"],
                    mixup_alpha=hp.mixup_alpha,
                    cutmix_alpha=hp.cutmix_alpha,
                    prob=self.mix_prob,
                )  # soft targets; accuracy stays against the labels
            side = self.train_side
            if side is not None and side != images.shape[-1]:  # a resolution curriculum
                images = F.interpolate(
                    images, size=(side, side), mode="bilinear", antialias=True, align_corners=False
                )
            logits = self(images).float()
        elif hp.test_flip:  # mean of the image's and its mirror's logits
            logits = flip_averaged_logits(self, images)
        else:
            logits = self(images).float()
        smoothing = hp.label_smoothing if stage == "train" else 0.0
        loss = F.cross_entropy(logits, targets, label_smoothing=smoothing)
        if stage == "train":
            self.log("train/loss_step", loss, on_step=True, on_epoch=False, prog_bar=True)
            self.train_loss_sum += loss.detach() * labels.shape[0]
            self.train_loss_count += labels.shape[0]
        else:
            self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=True, sync_dist=True)
        for k in self.top_ks:
            metric = self.metrics[f"{stage}_acc{k}"]
            metric(logits, labels)
            name = f"{stage}/acc" if k == 1 else f"{stage}/acc{k}"
            self.log(name, metric, on_step=False, on_epoch=True, prog_bar=k == 1)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._shared_step(batch, "train")
        # a CPU tensor: Lightning would copy a float to the GPU, which waits for the GPU
        # the last group is AdamW's in both optimizers: the schedule's lr, not Muon's scaled one
        lr = torch.tensor(self.optimizers().param_groups[-1]["lr"])
        self.log("train/lr", lr, on_step=True, on_epoch=False)
        return loss

    def on_train_start(self) -> None:
        if self.trainer.ckpt_path:  # resumed: the schedule is the checkpoint's (LambdaLR state)
            for config in self.trainer.lr_scheduler_configs:
                check_resumed_schedule(
                    config.scheduler,
                    planned_steps=int(self.trainer.estimated_stepping_batches),
                    step=self.trainer.global_step,
                    ckpt=str(self.trainer.ckpt_path),
                )

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # CUDA graphs (compile_mode reduce-overhead): each step starts a new generation, as
        # torch asks of training loops; unmarked, outputs of the last step still alive (the
        # gradients) can make the graph trees record again instead of replaying
        torch.compiler.cudagraph_mark_step_begin()

    def on_validation_batch_start(
        self, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        # each evaluation batch a generation too: the last batch's logits may still be held
        # (metrics, callbacks) when the next forward replays into the same memory
        torch.compiler.cudagraph_mark_step_begin()

    on_test_batch_start = on_validation_batch_start  # the same reason

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # the gradients go now, not after the next forward (Lightning zeroes them before each
        # backward): under CUDA graphs they are the graph's outputs (callbacks' hooks ran first)
        if self.trainer.accumulate_grad_batches == 1:
            for optimizer in self.trainer.optimizers:
                optimizer.zero_grad(set_to_none=True)

    def on_train_epoch_end(self) -> None:
        if self.train_loss_count > 0:
            mean = self.train_loss_sum / self.train_loss_count
            # under DDP the ranks' means, each over as many images (DistributedSampler), averaged
            self.log("train/loss_epoch", mean, sync_dist=True)
            # the name callbacks monitor, as before
            self.log("train/loss", mean, logger=False, sync_dist=True)
        self.train_loss_sum.zero_()
        self.train_loss_count.zero_()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(images).float().softmax(dim=-1)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the global RNG state (dropout, drop-path) so that a resumed run draws alike."""
        save_rng_and_loss(checkpoint, self.train_loss_sum, self.train_loss_count)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if is_old_layout(checkpoint):  # read by Lightning itself: not migrated yet
            migrate_checkpoint(checkpoint)
        trainer = self._trainer
        resuming = trainer is not None and trainer.state.fn == "fit"
        if resuming and checkpoint.get("optimizer_states"):
            check_resume_layout(checkpoint["hyper_parameters"]["optimizer"], self.optimizer_config)
        own = self.metrics.state_dict(prefix="metrics.", keep_vars=True)
        for key in ("state_dict", "current_model_state"):  # the latter: the EMA's live weights
            if isinstance(checkpoint.get(key), dict):
                migrate_metric_states(checkpoint[key], own)
        restore_rng_and_loss(checkpoint, self.train_loss_sum, self.train_loss_count)
        # the weights' own normalization (CIFAR-10's for a checkpoint that records none)
        norm = recorded_normalization(checkpoint)
        self.hparams.mean, self.hparams.std = list(norm.mean), list(norm.std)
        dm = getattr(trainer, "datamodule", None) if trainer is not None else None
        if hasattr(dm, "use_normalization"):
            dm.use_normalization(norm)

    def configure_optimizers(self) -> dict[str, Any]:
        from lightning.pytorch.strategies import FSDPStrategy

        sharded = isinstance(self.trainer.strategy, FSDPStrategy)
        optimizer = build_optimizer(self.model, self.optimizer_config, sharded=sharded)
        epochs = self.trainer.max_epochs
        if epochs is None or epochs < 1:
            raise ValueError(
                "set trainer.max_epochs: the learning-rate schedule ends with it (with "
                "vit.train.callbacks.TimeBudget it is an upper bound)."
            )
        scheduler = lr_scheduler(
            optimizer,
            self.schedule_config,
            lr=self.optimizer_config.lr,
            total_steps=max(1, int(self.trainer.estimated_stepping_batches)),
            epochs=epochs,
            progress=self._progress,
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """`trainer.gradient_clip_val` with fused AdamW under bf16-mixed: clip here.

        Lightning refuses to clip for any optimizer that unscales gradients itself (fused AdamW),
        which guards float16's loss scaler. bf16-mixed has no scaler, so the gradients are already
        true gradients and clipping them before the fused step is exact.
        """
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and plugin.scaler is None:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
