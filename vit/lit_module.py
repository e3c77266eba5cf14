"""ViTClassifier: the LightningModule that trains a VisionTransformer (loss, metrics, optimizer, schedule)."""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from typing import Any, Literal, get_args

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities.enums import GradClipAlgorithmType
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from vit.attention import Kernel
from vit.augment import check_mix_args, mix_batch
from vit.evaluate import flip_averaged_logits
from vit.model import VisionTransformer, model_config
from vit.optim import MuonAdamW, check_momentum, check_ns_steps

Stage = Literal["train", "val", "test"]
OptimizerName = Literal["adamw", "muon"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


DECAYS = ("cosine", "linear")  # shapes of the learning-rate decay after warm-up


def check_lr_decay(decay: str) -> None:
    """The one check of a decay shape, for ViTClassifier (at construction) and WarmupCosine."""
    if decay not in DECAYS:
        raise ValueError(
            f"lr_decay={decay!r} is not a schedule shape: use one of {DECAYS} "
            "(cosine is the default; linear decays to min_lr in a straight line)."
        )


def check_cpp_compiler() -> None:
    """torch.compile's CPU code is C++ built at run time: fail at the start of the fit, with the
    fix, where inductor would fail inside the first step."""
    cxx = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")  # inductor's
    if shutil.which(cxx) is None:
        raise RuntimeError(
            f"model.torch_compile needs a C++ compiler on CPU and {cxx!r} (the CXX variable, or "
            f"the platform's default) is not on PATH: install one (e.g. apt install g++), point "
            f"CXX at it, or set model.torch_compile: false."
        )


class ViTClassifier(L.LightningModule):
    """Cross-entropy with label smoothing, AdamW, linear warm-up then cosine (or linear) decay.

    Options for short or long budgets: mixup/CutMix (`mixup_alpha`, `cutmix_alpha`), a
    low-resolution curriculum (`res_schedule`), patch dropout (`patch_drop_rate`, or by stage of
    training `patch_drop_schedule`), fused AdamW, Muon for the blocks' matrices (`optimizer`,
    with its own peak learning rate `muon_lr_scale` x lr, `muon_momentum`, `muon_ns_steps`,
    `muon_split_qkv` and `muon_patch_embed`), torch.compile
    in fit (`torch_compile`, with `compile_mode`), test-time flip (`test_flip`), and a
    wall-clock budget (`time_budget_min`): the schedule then runs on the fraction of the budget
    used, reaches its end when the time is up, and training stops there (after a last
    validation). With `torch_compile`, the first training step and the first validation of each
    fit, where the compiles happen, count toward the budget but not toward the schedule's clock;
    they would otherwise spend the warm-up (session 32: a CUDA-graph compile took 20 s of a 21 s
    warm-up).

    Model sizes come from `preset`; any size argument left at None takes the preset's value, so a
    config can say `preset: vit_tiny` and override one thing. Plain values only, so that
    hparams.yaml is clean and `ViTClassifier.load_from_checkpoint(path)` works without the CLI.
    """

    def __init__(
        self,
        *,
        preset: str = "vit_tiny",
        img_size: int = 32,
        patch_size: int = 4,
        num_classes: int = 10,
        embed_dim: int | None = None,
        depth: int | None = None,
        num_heads: int | None = None,
        mlp_ratio: float | None = None,
        qkv_bias: bool = True,
        class_token: bool = True,
        global_pool: Literal["token", "avg"] = "token",
        pos_embed: Literal["learned", "sincos"] = "learned",
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        patch_drop_rate: float = 0.0,
        kernel: Kernel = "auto",
        attn_init: Literal["default", "mimetic"] = "default",
        pos_init: Literal["trunc_normal", "sincos2d"] = "trunc_normal",
        lsa: bool = False,
        spt: bool = False,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_epochs: float = 1.0,
        warmup_fraction: float | None = None,
        time_budget_min: float | None = None,
        min_lr: float = 0.0,
        lr_decay: Literal["cosine", "linear"] = "cosine",
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mix_prob: float = 1.0,
        res_schedule: list[tuple[float, int]] | None = None,
        patch_drop_schedule: list[tuple[float, float]] | None = None,
        fused_adamw: bool | None = None,
        optimizer: OptimizerName = "adamw",
        muon_lr_scale: float = 1.0,
        muon_split_qkv: bool = False,
        muon_momentum: float = 0.95,
        muon_ns_steps: int = 5,
        muon_patch_embed: bool = False,
        torch_compile: bool = False,
        compile_mode: CompileMode = "default",
        test_flip: bool = False,
        class_names: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        _check_training_config(
            lr=lr,
            weight_decay=weight_decay,
            warmup_epochs=warmup_epochs,
            min_lr=min_lr,
            label_smoothing=label_smoothing,
            betas=betas,
            lr_decay=lr_decay,
        )
        check_mix_args(mixup_alpha, cutmix_alpha, mix_prob)
        if optimizer not in get_args(OptimizerName):
            raise ValueError(
                f"optimizer={optimizer!r}: expected 'adamw', or 'muon' (Muon for the blocks' "
                "weight matrices, AdamW for the rest: vit/optim.py)."
            )
        if not muon_lr_scale > 0:
            raise ValueError(
                f"muon_lr_scale={muon_lr_scale} must be positive: the Muon group's learning rate "
                "is lr times it (1.0: the same as AdamW's, Muon's updates scaled to AdamW's RMS)."
            )
        check_momentum(muon_momentum, "muon_momentum")  # here, before any data is read
        check_ns_steps(muon_ns_steps, "muon_ns_steps")
        muon_only = {  # the Muon group's settings, each with its value that asks nothing of it
            "muon_lr_scale": (muon_lr_scale, 1.0),
            "muon_momentum": (muon_momentum, 0.95),
            "muon_ns_steps": (muon_ns_steps, 5),
            "muon_split_qkv": (muon_split_qkv, False),
            "muon_patch_embed": (muon_patch_embed, False),
        }
        if optimizer != "muon" and (
            set_ := {k: (v, off) for k, (v, off) in muon_only.items() if v != off}
        ):
            values = ", ".join(f"{k}={v}" for k, (v, _) in set_.items())
            unset = ", ".join(f"{k}: {str(off).lower()}" for k, (_, off) in set_.items())
            flags = " ".join(f"--model.{k} {str(off).lower()}" for k, (_, off) in set_.items())
            raise ValueError(
                f"{values}: Muon's settings, and optimizer={optimizer!r} does not use Muon (it "
                f"has no Muon group): set optimizer: muon, or {unset} ({flags} over a config "
                "that sets them, such as cpu60.yaml)."
            )
        if compile_mode not in get_args(CompileMode):
            raise ValueError(
                f"compile_mode={compile_mode!r}: expected one of {get_args(CompileMode)} "
                "(torch.compile's modes; reduce-overhead adds CUDA graphs on a GPU)."
            )
        self.res_schedule = _check_res_schedule(res_schedule, patch_size=patch_size)
        self.patch_drop_schedule = _check_patch_drop_schedule(patch_drop_schedule)
        if patch_drop_schedule is not None and patch_drop_rate != 0:
            raise ValueError(
                f"patch_drop_rate={patch_drop_rate} and patch_drop_schedule={patch_drop_schedule} "
                "both set the patch-drop rate: use one (a constant rate is [[0, rate]])."
            )
        if warmup_fraction is not None and not 0 <= warmup_fraction < 1:
            raise ValueError(f"warmup_fraction={warmup_fraction} must be in [0, 1), e.g. 0.05.")
        if time_budget_min is not None:
            if not time_budget_min > 0:
                raise ValueError(f"time_budget_min={time_budget_min} must be positive minutes.")
            if warmup_fraction is None and warmup_epochs > 0:
                raise ValueError(
                    "with time_budget_min the number of epochs is not known in advance: set "
                    "model.warmup_fraction (e.g. 0.05 of the budget) instead of warmup_epochs."
                )
        self._clock = time.monotonic  # tests replace it with a fake clock
        self._clock_start: float | None = None
        self._elapsed_before = 0.0  # seconds of budget used before a resume
        # seconds of the budget kept off the schedule's clock (see progress), and since when the
        # span under way (the fit's first step or first validation) has run
        self._off_clock_s = 0.0
        self._off_clock_since: float | None = None
        self._first_val_pending = False
        self._total_steps = 1
        self._progress = 0.0
        # on a GPU, the last training loss on its way to the host: (value, copied, where)
        self._pending_loss: tuple[Tensor, Any, tuple[int, int, int]] | None = None
        self.model = VisionTransformer(
            **model_config(
                preset,
                img_size=img_size,
                patch_size=patch_size,
                num_classes=num_classes,
                embed_dim=embed_dim,
                depth=depth,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                class_token=class_token,
                global_pool=global_pool,
                pos_embed=pos_embed,
                drop_rate=drop_rate,
                attn_drop_rate=attn_drop_rate,
                drop_path_rate=drop_path_rate,
                patch_drop_rate=patch_drop_rate,
                kernel=kernel,
                attn_init=attn_init,
                pos_init=pos_init,
                lsa=lsa,
                spt=spt,
                dynamic_img_size=res_schedule is not None,
            )
        )
        # One metric object per stage and k, so that states never mix (Lightning's advice).
        # average="micro": the fraction of images right, as vit-evaluate and timm report it
        # (torchmetrics' default, "macro", is the mean of the per-class accuracies: the same on
        # a balanced split such as CIFAR-10's test, not on a random validation split).
        self.top_ks = sorted({1, min(5, num_classes)})  # top-5, or top-k for fewer classes
        self.metrics = nn.ModuleDict(
            {
                f"{stage}_acc{k}": MulticlassAccuracy(
                    num_classes=num_classes,
                    top_k=k,
                    average="micro",
                    # its label check (torch.unique) makes a GPU wait on every step; training
                    # labels come from the data module, so only evaluation checks them
                    validate_args=stage != "train",
                )
                for stage in ("train", "val", "test")
                for k in self.top_ks
            }
        )
        for metric in self.metrics.values():
            metric.persistent(True)  # saved in checkpoints: a mid-epoch resume keeps its counts

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def on_fit_start(self) -> None:
        """With torch_compile, compile the network in place for the fit (and the test after it):
        its parameter names and checkpoints stay those of the eager model, and loading a
        checkpoint for evaluation or prediction stays eager. Static shapes: each image size of
        the curriculum, and each batch size, compiles once."""
        if self.hparams.torch_compile:
            if self.device.type == "cpu":
                check_cpp_compiler()
            self.model.compile(dynamic=False, mode=self.hparams.compile_mode)

    def setup(self, stage: str) -> None:
        """Check that the data's classes match the head, and remember their names."""
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        classes = getattr(dm, "classes", None)
        if classes is None:
            return
        if len(classes) != self.hparams.num_classes:
            raise ValueError(
                f"the data has {len(classes)} classes ({', '.join(classes)}) but the model was "
                f"built with num_classes={self.hparams.num_classes}; set model.num_classes: "
                f"{len(classes)} in the config."
            )
        if self.hparams.class_names is None:
            self.hparams.class_names = list(classes)

    def train_resolution(self, progress: float) -> int | None:
        """The side training images are resized to at this fraction of training (None: as loaded)."""
        return _stage_value(self.res_schedule, progress)

    def elapsed_s(self) -> float:
        """Wall-clock seconds of training so far (validation included), across resumes."""
        if self._clock_start is None:
            return self._elapsed_before
        return self._clock() - self._clock_start

    def progress(self) -> float:
        """Fraction of training done, in [0, 1]: of the time budget, or of the planned steps.

        With a time budget and torch_compile, the first training step and the first validation
        of each fit (where the compiles happen) are off the schedule's clock: the schedule runs
        on the rest of the time, stretched so that it still ends when the whole budget is used.
        Under DDP the time is rank 0's, broadcast, so that every rank uses the same lr and stops
        at the same step.
        """
        if self.hparams.time_budget_min is None:
            return min(1.0, self.global_step / self._total_steps)
        budget = 60.0 * self.hparams.time_budget_min
        since = self._off_clock_since  # in a span off the clock, the schedule waits at its start
        elapsed = self._rank0_elapsed_s() if since is None else since
        if elapsed >= budget:
            return 1.0
        return max(0.0, (elapsed - self._off_clock_s) / (budget - self._off_clock_s))

    def _off_clock_now_s(self) -> float:
        """Seconds kept off the schedule's clock so far, the span under way included."""
        if self._off_clock_since is None:
            return self._off_clock_s
        return self._off_clock_s + self._rank0_elapsed_s() - self._off_clock_since

    def _end_off_clock(self) -> None:
        self._off_clock_s = self._off_clock_now_s()
        self._off_clock_since = None

    def _rank0_elapsed_s(self) -> float:
        elapsed = self.elapsed_s()
        if self._trainer is not None:
            elapsed = self.trainer.strategy.broadcast(elapsed, src=0)
        return elapsed

    def on_train_start(self) -> None:
        every = self.trainer.check_val_every_n_epoch
        if self.hparams.time_budget_min is not None and every not in (None, 1):
            raise ValueError(
                f"check_val_every_n_epoch={every} with model.time_budget_min: training stops "
                f"mid-epoch when the time is up, and Lightning validates there only in an epoch "
                f"it validates in. Use check_val_every_n_epoch: 1 and a time interval such as "
                f'val_check_interval: "00:00:05:00".'
            )
        self._clock_start = self._clock() - self._elapsed_before
        if self.hparams.time_budget_min is not None and self.hparams.torch_compile:
            self._off_clock_since, self._first_val_pending = self._elapsed_before, True

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._progress = self.progress()
        rate = _stage_value(self.patch_drop_schedule, self._progress)
        if rate is not None:  # the model drops this fraction of patch tokens in training
            self.model.patch_drop_rate = rate

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._end_off_clock()  # after the fit's first step; then a no-op
        if self.hparams.time_budget_min is not None and self.progress() >= 1.0:
            self.trainer.should_stop = True  # Lightning validates once more, then stops

    def on_validation_start(self) -> None:
        if self._first_val_pending and not self.trainer.sanity_checking:
            self._off_clock_since, self._first_val_pending = self._rank0_elapsed_s(), False

    def on_validation_end(self) -> None:
        self._end_off_clock()  # after the fit's first validation; else a no-op

    def _shared_step(self, batch: tuple[Tensor, Tensor], stage: Stage) -> Tensor:
        images, labels = batch
        targets = labels
        if stage == "train":
            hp = self.hparams
            if hp.mixup_alpha > 0 or hp.cutmix_alpha > 0:
                images, targets = mix_batch(
                    images,
                    labels,
                    num_classes=hp.num_classes,
                    mixup_alpha=hp.mixup_alpha,
                    cutmix_alpha=hp.cutmix_alpha,
                    prob=hp.mix_prob,
                )  # soft targets; accuracy stays against the labels
            side = self.train_resolution(self._progress)
            if side is not None and side != images.shape[-1]:  # the low-resolution curriculum
                images = F.interpolate(
                    images, size=(side, side), mode="bilinear", antialias=True, align_corners=False
                )
            logits = self(images).float()
        elif self.hparams.test_flip:  # mean of the image's and its mirror's logits
            logits = flip_averaged_logits(self, images)
        else:
            logits = self(images).float()
        smoothing = self.hparams.label_smoothing if stage == "train" else 0.0
        loss = F.cross_entropy(logits, targets, label_smoothing=smoothing)
        on_step = stage == "train"
        self.log(
            f"{stage}/loss",
            loss,
            on_step=on_step,
            on_epoch=True,
            prog_bar=True,
            sync_dist=stage != "train",
        )
        for k in self.top_ks:
            metric = self.metrics[f"{stage}_acc{k}"]
            metric(logits, labels)
            name = f"{stage}/acc" if k == 1 else f"{stage}/acc{k}"
            self.log(name, metric, on_step=False, on_epoch=True, prog_bar=k == 1)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        self._check_pending_loss()
        loss = self._shared_step(batch, "train")
        self._check_loss(loss, batch_idx)
        # a CPU tensor: Lightning would copy a float to the GPU, which waits for the GPU
        # the last group is AdamW's in both optimizers: the schedule's lr, not Muon's scaled one
        lr = torch.tensor(self.optimizers().param_groups[-1]["lr"])
        self.log("train/lr", lr, on_step=True, on_epoch=False)
        return loss

    def _check_loss(self, loss: Tensor, batch_idx: int) -> None:
        """Stop on a loss that is not finite, before any checkpoint can hold diverged weights.

        On a CPU the loss is read at once. On a GPU, reading it would make the host wait for the
        GPU on every step, so it is copied to the host without waiting and read at the start of the
        next step, before any checkpoint is saved, and when training ends: the error then names
        the step of the loss all the same."""
        where = (self.global_step, self.current_epoch, batch_idx)
        if loss.device.type != "cuda":
            self._raise_if_not_finite(loss.detach(), where)
            return
        host = torch.empty((), dtype=loss.dtype, pin_memory=True)
        host.copy_(loss.detach(), non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        self._pending_loss = (host, copied, where)

    def _check_pending_loss(self) -> None:
        if self._pending_loss is not None:
            host, copied, where = self._pending_loss
            self._pending_loss = None
            copied.synchronize()  # the forward that made it is long done: no wait in practice
            self._raise_if_not_finite(host, where)

    @staticmethod
    def _raise_if_not_finite(loss: Tensor, where: tuple[int, int, int]) -> None:
        if not torch.isfinite(loss):
            step, epoch, batch_idx = where
            raise FloatingPointError(
                f"training loss is {loss.item()} at step {step} (epoch {epoch}, batch "
                f"{batch_idx}); stopping so that no checkpoint holds diverged weights. Lower "
                f"model.lr, raise warmup_epochs, or use precision 32-true; resume from the last "
                f"good checkpoint with --ckpt_path."
            )

    def on_train_end(self) -> None:
        self._check_pending_loss()

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(images).float().softmax(dim=-1)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the global RNG state (dropout, drop-path) so that a resumed run draws alike.
        First, the last training loss must be finite (on a GPU it is read here, see
        `_check_loss`): an error here stops the save, so no checkpoint holds diverged weights."""
        self._check_pending_loss()
        checkpoint["rng_state"] = {"torch": torch.get_rng_state()}
        checkpoint["train_elapsed_s"] = self.elapsed_s()
        checkpoint["train_off_clock_s"] = self._off_clock_now_s()
        if torch.cuda.is_available():
            checkpoint["rng_state"]["cuda"] = torch.cuda.get_rng_state_all()

    def _check_resumed_optimizer(self, checkpoint: dict[str, Any]) -> None:
        """A fit resumed from a checkpoint restores its optimizer state, which fits only the
        parameter groups it was saved with: say which settings to resume with, before torch's
        "different number of parameter groups". (Loading weights alone, to evaluate or
        fine-tune, is not a resume and may change them.)"""
        trainer = self._trainer
        if trainer is None or trainer.state.fn != "fit" or not checkpoint.get("optimizer_states"):
            return
        saved = checkpoint.get("hyper_parameters") or {}
        layout = {"optimizer": "adamw", "muon_split_qkv": False, "muon_patch_embed": False}
        # (the defaults: what older checkpoints, saved before a key existed, were trained with)
        theirs = {key: saved.get(key, default) for key, default in layout.items()}
        ours = {key: self.hparams[key] for key in layout}
        if theirs != ours:
            flags = " ".join(f"--model.{key} {str(v).lower()}" for key, v in theirs.items())
            raise ValueError(
                f"--ckpt_path: the checkpoint's optimizer state was saved with {theirs} and this "
                f"run has {ours}; a resume needs the same optimizer layout. Resume with {flags}, "
                "or start a fresh run without --ckpt_path."
            )

    def _micro_metric_states(self, state_dict: dict[str, Any]) -> None:
        """Sum per-class accuracy counts (`metrics.*.tp` etc., shape (C,)) into the micro counts
        (1,) this module keeps, in place. Checkpoints from before val/acc became micro (session
        24) hold torchmetrics' macro counts; summed over classes they are exactly the micro
        counts, so a resume goes on. (Top-k > 1 keeps per-class counts either way.)"""
        own = self.metrics.state_dict(prefix="metrics.", keep_vars=True)
        for key, value in list(state_dict.items()):
            mine = own.get(key)
            if (
                mine is not None
                and isinstance(value, Tensor)
                and tuple(mine.shape) == (1,)
                and value.dim() == 1
                and value.numel() > 1
            ):
                state_dict[key] = value.sum().reshape(1).to(mine.dtype)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._check_resumed_optimizer(checkpoint)
        for key in ("state_dict", "current_model_state"):  # the latter: the EMA's live weights
            if isinstance(checkpoint.get(key), dict):
                self._micro_metric_states(checkpoint[key])
        self._elapsed_before = float(checkpoint.get("train_elapsed_s", 0.0))
        self._off_clock_s = float(checkpoint.get("train_off_clock_s", 0.0))
        state = checkpoint.get("rng_state") or {}
        if "torch" in state:
            torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        if hp.optimizer == "muon":
            from lightning.pytorch.strategies import FSDPStrategy

            if isinstance(self.trainer.strategy, FSDPStrategy):
                raise ValueError(
                    "model.optimizer: muon orthogonalises whole weight matrices, and FSDP shards "
                    "them across devices: use strategy ddp (each device holds every matrix) or "
                    "model.optimizer: adamw."
                )
            optimizer = MuonAdamW(  # the model is on its device: bf16 iterations where fast
                muon_param_groups(
                    self.model,
                    weight_decay=hp.weight_decay,
                    lr=hp.lr * hp.muon_lr_scale,
                    split_qkv=hp.muon_split_qkv,
                    patch_embed=hp.muon_patch_embed,
                ),
                lr=hp.lr,
                betas=tuple(hp.betas),
                momentum=hp.muon_momentum,
                ns_steps=hp.muon_ns_steps,
            )
        else:
            optimizer = torch.optim.AdamW(
                param_groups(self.model, weight_decay=hp.weight_decay),
                lr=hp.lr,
                betas=tuple(hp.betas),
                fused=hp.fused_adamw,
            )
        epochs = self.trainer.max_epochs
        if epochs is None or epochs < 1:
            raise ValueError(
                "set trainer.max_epochs: the learning-rate schedule ends with it (with "
                "model.time_budget_min it is an upper bound)."
            )
        min_ratio = hp.min_lr / hp.lr
        if hp.time_budget_min is not None:  # the schedule runs on the fraction of time used
            fine = 1_000_000
            schedule = WarmupCosine(
                total_steps=fine,
                warmup_steps=round(fine * (hp.warmup_fraction or 0.0)),
                min_ratio=min_ratio,
                decay=hp.lr_decay,
            )
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda _: schedule(round(fine * self._progress))
            )
        else:
            total = self._total_steps = max(1, int(self.trainer.estimated_stepping_batches))
            warmup = (
                round(total * hp.warmup_fraction)
                if hp.warmup_fraction is not None
                else round(total * hp.warmup_epochs / epochs)
            )
            schedule = WarmupCosine(
                total_steps=total,
                warmup_steps=warmup,
                min_ratio=min_ratio,
                decay=hp.lr_decay,
            )
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
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
        true gradients and clipping them before the fused step is exact: do it with the plain
        precision plugin's clipping. Everything else (float16, fp32, FSDP) goes to Lightning.
        """
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and plugin.scaler is None:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay matrices; spare biases, norms, the CLS token and positions."""
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def muon_param_groups(
    model: nn.Module,
    *,
    weight_decay: float,
    lr: float | None = None,
    split_qkv: bool = False,
    patch_embed: bool = False,
) -> list[dict[str, Any]]:
    """A Muon group of the blocks' weight matrices (decayed; its own peak `lr` if given, which
    the schedule scales as it does the others'), then `param_groups` of the rest (patch
    projection, head, biases, norms, CLS token, positions) for AdamW. `split_qkv`: the qkv
    matrices go in a Muon group of their own with split 3, so that the query, key and value
    projections are orthogonalized one by one (MuonAdamW._muon). `patch_embed`: the patch
    projection's weight joins the Muon group (a conv filter as its out x in*k*k matrix)."""
    muon = [
        p
        for name, p in model.named_parameters()
        if p.requires_grad
        and (
            (name.startswith("blocks.") and p.ndim == 2)
            or (patch_embed and name == "patch_embed.proj.weight")
        )
    ]
    taken = {id(p) for p in muon}
    rest = [
        dict(group, params=[p for p in group["params"] if id(p) not in taken])
        for group in param_groups(model, weight_decay=weight_decay)
    ]
    group = {"weight_decay": weight_decay, "use_muon": True} | ({} if lr is None else {"lr": lr})
    qkv = {
        id(p) for name, p in model.named_parameters() if split_qkv and name.endswith("qkv.weight")
    }
    muon_groups = [
        dict(group, params=[p for p in muon if id(p) not in qkv]),
        dict(group, params=[p for p in muon if id(p) in qkv], split=3),
    ]
    return [g for g in muon_groups if g["params"]] + rest


class WarmupCosine:
    """LR multiplier: linear from ~0 to 1 over warmup_steps, then down to min_ratio at total.

    `decay="cosine"` (the default) follows half a cosine; `decay="linear"` falls in a straight
    line: lower than the cosine in the first half of the decay, higher in the second ("Budgeted
    Training", Li et al. 2020, found linear-to-zero robust for short budgets).
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


def _stage_value(schedule: list[tuple[float, Any]] | None, progress: float) -> Any:
    """The value of the last stage of [[fraction, value], ...] that has started (None: no schedule)."""
    if schedule is None:
        return None
    return [value for start, value in schedule if start <= progress][-1]


def _check_stages(
    schedule: Any, *, name: str, value: str, cast: type, example: str
) -> list[tuple[float, Any]]:
    """[[fraction, value], ...] with fractions of training starting at 0, rising, below 1."""
    try:
        pairs = [(float(start), cast(v)) for start, v in schedule]
    except (TypeError, ValueError):
        msg = f"{name}={schedule!r} must be a list of [fraction, {value}]; {example}"
        raise ValueError(msg) from None
    starts = [start for start, _ in pairs]
    rising = all(b > a for a, b in zip(starts, starts[1:], strict=False))
    if not pairs or starts[0] != 0 or not rising or starts[-1] >= 1:
        raise ValueError(
            f"{name}={schedule!r}: the fractions must start at 0, rise, and stay below 1; {example}"
        )
    return pairs


def _check_res_schedule(
    schedule: list[tuple[float, int]] | None, *, patch_size: int
) -> list[tuple[float, int]] | None:
    """[[fraction, side], ...]: fractions of training rising from 0 (below 1), whole-patch sides."""
    if schedule is None:
        return None
    example = (
        "e.g. [[0, 16], [0.3, 24], [0.55, 32]]: 16x16 images for the first 30% of training, "
        "24x24 until 55%, then 32x32"
    )
    pairs = _check_stages(schedule, name="res_schedule", value="side", cast=int, example=example)
    for _, side in pairs:
        if side < patch_size or side % patch_size:
            raise ValueError(
                f"res_schedule side {side} is not a positive multiple of patch_size={patch_size}; "
                f"{example}"
            )
    return pairs


def _check_patch_drop_schedule(
    schedule: list[tuple[float, float]] | None,
) -> list[tuple[float, float]] | None:
    """[[fraction, rate], ...]: fractions of training rising from 0 (below 1), rates in [0, 1)."""
    if schedule is None:
        return None
    example = (
        "e.g. [[0, 0], [0.5, 0.5], [0.85, 0]]: every patch token until 50% of training, half of "
        "them (drawn per image) until 85%, then every token again"
    )
    pairs = _check_stages(
        schedule, name="patch_drop_schedule", value="rate", cast=float, example=example
    )
    for _, rate in pairs:
        if not 0 <= rate < 1:
            raise ValueError(
                f"patch_drop_schedule rate {rate} must be in [0, 1): the fraction of patch tokens "
                f"dropped; {example}"
            )
    return pairs


def _check_training_config(
    *,
    lr: float,
    weight_decay: float,
    warmup_epochs: float,
    min_lr: float,
    label_smoothing: float,
    betas: tuple[float, float],
    lr_decay: str = "cosine",
) -> None:
    check_lr_decay(lr_decay)
    if not lr > 0:
        raise ValueError(f"lr={lr} must be positive (1e-3 is a good start for AdamW on a ViT).")
    if weight_decay < 0:
        raise ValueError(f"weight_decay={weight_decay} must be >= 0.")
    if warmup_epochs < 0:
        raise ValueError(f"warmup_epochs={warmup_epochs} must be >= 0.")
    if not 0 <= min_lr <= lr:
        raise ValueError(f"min_lr={min_lr} must be between 0 and lr={lr}.")
    if not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1).")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"betas={betas} must be two numbers in [0, 1), e.g. [0.9, 0.999].")
