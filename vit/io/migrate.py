"""Older checkpoint layouts read as today's: flat options grouped, the budget's clock moved into
its callback, per-class metric counts summed to micro counts, and class paths from before the
package had sub-packages (vit.lit_module.ViTClassifier, vit.callbacks.TimeBudget, ...) renamed."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from vit.model.config import NetworkConfig

# ViTClassifier's options before they were grouped into network, optimizer and schedule: each
# flat key, and where it lives now (a key of the group, or "" where it became a callback's)
_FLAT_NETWORK = set(NetworkConfig.__dataclass_fields__)
_FLAT_OPTIMIZER = {"optimizer": "name", "lr": "lr", "weight_decay": "weight_decay",
                   "betas": "betas", "fused_adamw": "fused"}  # fmt: skip
_FLAT_MUON = {
    f"muon_{k}": k for k in ("lr_scale", "momentum", "ns_steps", "split_qkv", "patch_embed")
}
_FLAT_SCHEDULE = {"warmup_epochs": "warmup_epochs", "warmup_fraction": "warmup_fraction",
                  "min_lr": "min_lr", "lr_decay": "decay"}  # fmt: skip
_FLAT_TO_CALLBACKS = ("time_budget_min", "res_schedule", "patch_drop_schedule")


_CALLBACKS = ("TimeBudget", "ResolutionSchedule", "PatchDropSchedule", "EMA", "LastCheckpoint",
              "FiniteLoss", "AttentionMapLogger")  # fmt: skip
# class paths that checkpoints and saved config.yaml files hold, before the sub-packages -> now
LEGACY_CLASS_PATHS = {
    "vit.lit_module.ViTClassifier": "vit.train.module.ViTClassifier",
    "vit.data.CIFAR10DataModule": "vit.train.datamodule.CIFAR10DataModule",
    **{f"vit.callbacks.{name}": f"vit.train.callbacks.{name}" for name in _CALLBACKS},
}


def is_old_layout(ckpt: dict[str, Any]) -> bool:
    """Whether migrate_checkpoint has anything to change: so that a dict read by load_checkpoint
    (already migrated) is not migrated a second time where Lightning hands it on."""
    return (
        _is_flat(ckpt.get("hyper_parameters"))
        or "train_elapsed_s" in ckpt
        or any(_legacy_class_path(ckpt.get(key)) for key in _HPARAM_KEYS)
    )


_HPARAM_KEYS = ("hyper_parameters", "datamodule_hyper_parameters")


def _is_flat(hp: Any) -> bool:
    """ViTClassifier's options from before they were grouped into network, optimizer, schedule."""
    return isinstance(hp, dict) and "preset" in hp and "network" not in hp


def _legacy_class_path(saved: Any) -> bool:
    return isinstance(saved, dict) and saved.get("_class_path") in LEGACY_CLASS_PATHS


def migrate_checkpoint(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A vit-train checkpoint of an older layout, in place, as today's: flat hyper-parameters
    grouped into network, optimizer and schedule (the budget and the curricula are callbacks
    now, configured in the trainer, so their old settings are dropped), and the time budget's
    clock moved into its callback's state, and old class paths renamed. Today's checkpoints pass
    unchanged; migrating twice changes nothing."""
    for key in _HPARAM_KEYS:
        saved = ckpt.get(key)
        if _legacy_class_path(saved):
            saved["_class_path"] = LEGACY_CLASS_PATHS[saved["_class_path"]]
    hp = ckpt.get("hyper_parameters")
    if _is_flat(hp):
        flat = dict(hp)
        optimizer = {new: flat.pop(old) for old, new in _FLAT_OPTIMIZER.items() if old in flat}
        optimizer["muon"] = {new: flat.pop(old) for old, new in _FLAT_MUON.items() if old in flat}
        if optimizer.get("name", "adamw") != "muon":
            optimizer["muon"] = {}  # the defaults: AdamW refuses Muon settings
        schedule = {new: flat.pop(old) for old, new in _FLAT_SCHEDULE.items() if old in flat}
        network = {k: flat.pop(k) for k in list(flat) if k in _FLAT_NETWORK}
        for key in _FLAT_TO_CALLBACKS:
            flat.pop(key, None)
        hp.clear()
        hp.update(flat, network=network, optimizer=optimizer, schedule=schedule)
    if "train_elapsed_s" in ckpt:
        callbacks = ckpt.setdefault("callbacks", {})
        callbacks.setdefault(
            "TimeBudget",
            {
                "elapsed_s": ckpt.pop("train_elapsed_s"),
                "off_clock_s": ckpt.pop("train_off_clock_s", 0.0),
            },
        )
    return ckpt


def migrate_metric_states(state_dict: dict[str, Any], own: dict[str, Tensor]) -> None:
    """Sum per-class accuracy counts (`metrics.*.tp` etc., shape (C,)) into the micro counts (1,)
    a module keeps (`own`: its metric states), in place. Checkpoints from before val/acc became
    the fraction of images right hold torchmetrics' macro counts; summed over classes they are
    exactly the micro counts, so a resume goes on. (Top-k > 1 keeps per-class counts.)"""
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
