"""`--data.val_size 0`: a fit on the whole training split, as the final fit once the choices are
made on a held-out split. With nothing to validate on, vit-train turns validation off and mends
the callbacks that act on a validation metric (a checkpoint ranked by val/acc would never save,
early stopping would fail), and `--test_after_fit` scores the fit's last checkpoint: under a time
budget and a schedule that anneals to zero, the last weights are the ones a validated fit picks.
`vit-train validate` on such a config, or of such a checkpoint, is refused: nothing held out;
so is one whose config draws a validation split the checkpoint's fit trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from vit.commands.run_folders import configures
from vit.io.pretrained import trained_on_whole_split
from vit.train.datamodule import validation_seed


def holds_out_nothing(config: Any) -> bool:
    """Whether a fit's config trains on the whole training split (data.val_size 0)."""
    data = config.get("data")
    return data is not None and data.get("val_size") == 0


def drop_validation(config: Any) -> str:
    """Turn a fit's validation off and mend each callback whose monitor is a validation metric
    (`val/...`): a ModelCheckpoint that saves last.ckpt keeps saving it, unranked; any other is
    left out. Returns a line saying what was done."""
    config.trainer.limit_val_batches = 0
    config.trainer.num_sanity_val_steps = 0
    kept, changed = [], []
    for callback in config.trainer.callbacks or []:
        init_args = getattr(callback, "init_args", None)
        monitor = init_args.get("monitor") if init_args is not None else None
        if not (isinstance(monitor, str) and monitor.startswith("val/")):
            kept.append(callback)
            continue
        name = f"{callback.class_path.rpartition('.')[2]}(monitor={monitor})"
        if configures(callback, ModelCheckpoint) and init_args.get("save_last"):
            init_args.monitor, init_args.save_top_k = None, 0
            kept.append(callback)
            changed.append(f"{name} saves last.ckpt only")
        else:
            changed.append(f"{name} left out")
    config.trainer.callbacks = kept
    said = "data.val_size 0: training on the whole training split, without validation"
    return f"{said}; {', '.join(changed)}" if changed else said


def check_checkpointing(config: Any) -> None:
    """Before the fit: --test_after_fit needs the fit's last weights saved somewhere."""
    if config.get("test_after_fit") and config.trainer.get("enable_checkpointing") is False:
        raise ValueError(
            "--test_after_fit with data.val_size 0 scores the fit's last checkpoint, and "
            "trainer.enable_checkpointing is false: nothing would be saved to score. Turn "
            "checkpointing on, or leave --test_after_fit out."
        )


def refuse_validation(config: Any) -> None:
    """`vit-train validate` with data.val_size 0 has no split to score: say so, before any work."""
    if holds_out_nothing(config):
        raise ValueError(
            "vit-train validate scores the validation split, and data.val_size is 0: there is "
            "none. Give --data.val_size N (the screens hold out 5000; a checkpoint fitted with "
            "val_size 0 has trained on those images too), or score the test split with "
            "`vit-train test` or `vit-evaluate CHECKPOINT`."
        )


def refuse_trained_on_validation(ckpt_path: str, ckpt: dict[str, Any], data: Any) -> None:
    """`vit-train validate` of a checkpoint whose fit trained on images of the config's
    validation split: fitted with data.val_size 0, with the split drawn by another seed, or
    holding out fewer images than the config scores. Its score there would not be a validation.
    A checkpoint without the datamodule's hyper-parameters says nothing, and passes."""
    fitted = ckpt.get("datamodule_hyper_parameters") or {}
    if fitted.get("val_size") == 0:
        raise ValueError(
            f"{ckpt_path} was trained on the whole training split (data.val_size 0): every "
            "image a validation split would hold was trained on, so its score would not be a "
            f"validation. Score the test split: `vit-train test` or `vit-evaluate {ckpt_path}`."
        )
    if data is None or validation_seed(fitted) is None or fitted.get("val_size") is None:
        return
    # split_train_val takes the validation images first from one seeded permutation: the same
    # seed and no more images than the fit held out score only images it never trained on
    seed, size = validation_seed(fitted), fitted["val_size"]
    if validation_seed(data) != seed or data.get("val_size") > size:
        raise ValueError(
            f"{ckpt_path} held out {size} images drawn by seed {seed}; this config's validation "
            f"split is {data.get('val_size')} images drawn by seed {validation_seed(data)} "
            "(data.split_seed, else data.seed), so it holds images that fit trained on. Give "
            f"--data.split_seed {seed} --data.val_size {size} (or fewer images), or score the "
            f"test split: `vit-evaluate {ckpt_path}` (it reads the split from the checkpoint)."
        )


def refuse_whole_split(checkpoint: str | Path, ckpt: dict[str, Any], val_size: int) -> None:
    """--split val of weights known to have trained on every training image: by their data
    config's `val_size`, as the data module reads it (a vit-train checkpoint's, or the
    `data_split` that export_safetensors and save_pretrained record), or for weights that record
    none (files exported before it, shipped names; their data module falls back to holding 5000
    out) by their metadata's `trained_on` note."""
    metadata = ckpt.get("safetensors_metadata") or {}
    if val_size == 0:
        why = "data.val_size 0"
    elif trained_on_whole_split(metadata):
        why = f"its metadata says trained_on {metadata['trained_on']!r}"
    else:
        return
    raise ValueError(
        f"{checkpoint} was trained on the whole training split ({why}): it has no validation "
        "split to score. Score the test split (--split test, the default)."
    )


def checkpoint_to_test(trainer: L.Trainer) -> str:
    """The checkpoint `--test_after_fit` scores after a fit that did not validate: last.ckpt
    (LastCheckpoint, or any ModelCheckpoint with save_last), else the latest an unmonitored
    ModelCheckpoint kept (Lightning's default one keeps the latest)."""
    checkpoints = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
    if any(c.last_model_path and Path(c.last_model_path).is_file() for c in checkpoints):
        return "last"
    if any(c.monitor is None and c.best_model_path for c in checkpoints):
        return "best"
    raise RuntimeError(
        "--test_after_fit with data.val_size 0 scores the fit's last checkpoint, and this fit "
        "saved none to score: add vit.train.callbacks.LastCheckpoint to trainer.callbacks "
        "(experiments/cpu60.yaml lists it), or score a checkpoint with vit-evaluate."
    )
