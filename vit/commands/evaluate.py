"""`vit-evaluate`: a checkpoint's top-1, top-5, per-class accuracy, confusion matrix and
calibration on a split, as JSON and figures."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from vit.commands.whole_split import refuse_whole_split
from vit.data.datasets import preprocess, recorded_normalization
from vit.io.checkpoint import CHECKPOINT_HELP, WEIGHTS, WEIGHTS_HELP
from vit.io.load import load_model, weights_kind
from vit.io.pretrained import PRETRAINED
from vit.system.errors import exit_on_user_error
from vit.system.hardware import resolve_device
from vit.train.datamodule import CIFAR10DataModule
from vit.train.evaluation import evaluate_loader

log = logging.getLogger(__name__)


def evaluate_main(argv: list[str] | None = None) -> None:
    """`vit-evaluate CHECKPOINT [--split test] [--data-dir ...] [--output-dir ...]`."""
    exit_on_user_error(lambda: run_evaluate(argv))


def default_eval_dir(checkpoint: Path) -> Path:
    """eval/ beside a run's checkpoints/ folder, or beside a .safetensors or save_pretrained
    folder; eval/NAME in the working folder for shipped weights, which live inside the installed
    package, and for hf-hub:owner/name (the Hub's cache)."""
    if str(checkpoint) in PRETRAINED:
        return Path("eval") / str(checkpoint)
    if str(checkpoint).startswith("hf-hub:"):
        return Path("eval") / str(checkpoint).removeprefix("hf-hub:").replace("/", "--")
    if checkpoint.suffix == ".safetensors" or checkpoint.is_dir():
        return checkpoint.parent / "eval"
    return checkpoint.parent.parent / "eval"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vit-evaluate",
        description="Top-1, top-5 and per-class accuracy, the negative log-likelihood and the "
        "expected calibration error of a checkpoint, written as JSON, with a confusion-matrix "
        "PNG and a reliability diagram.",
    )
    parser.add_argument("checkpoint", type=Path, help=CHECKPOINT_HELP)
    parser.add_argument(
        "--split",
        choices=("test", "val"),
        default="test",
        help="the split scored; val: the images the checkpoint's fit held out (default: test)",
    )
    parser.add_argument(
        "--source",
        choices=("folder", "cifar10", "cifar100"),
        default=None,
        help="data source (default: the one the checkpoint was trained with)",
    )
    parser.add_argument(
        "--data-dir", default=None, help="data folder or archive (default: as trained)"
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="where decoded images are cached (default: as trained, else $VIT_CACHE_DIR or "
        "~/.cache/vit)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=500, help="images per forward pass (default: 500)"
    )
    parser.add_argument(
        "--precision",
        choices=("32", "bf16"),
        default="32",
        help="bf16 is faster on GPUs and CPUs with native bf16 (AVX512-BF16, AMX), many times "
        "slower on AVX2-only CPUs (default: 32)",
    )
    parser.add_argument(
        "--flip",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="test-time flip: average the logits of each image and its mirror "
        "(default: the checkpoint's model.test_flip)",
    )
    parser.add_argument("--weights", choices=WEIGHTS, default=None, help=WEIGHTS_HELP)
    parser.add_argument(
        "--device",
        default="auto",
        help="where to run: auto (a CUDA GPU when one is visible, else the CPU), cpu, cuda or "
        "cuda:N",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="the folder metrics_STEM.json, confusion_matrix_STEM.png and reliability_STEM.png "
        "go to, made if missing; STEM is the split, then _live or _average with --weights and "
        "_flip with flip on (test, test_flip, val_live, ...), so each choice keeps its own files "
        "(default: an eval/ folder beside the checkpoint; eval/NAME for shipped weights)",
    )
    return parser


def run_evaluate(argv: list[str] | None = None) -> dict[str, Any]:
    """What `vit-evaluate` does; returns the metrics it printed and wrote."""
    ns = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if ns.batch_size < 1:  # here, not the data module's check: that names a config key
        raise ValueError(f"--batch-size={ns.batch_size} must be at least 1 (default: 500).")

    device = resolve_device(ns.device)  # before the checkpoint loads: a typo fails at once
    model, ckpt = load_model(ns.checkpoint, weights=ns.weights)
    model.to(device)
    out = ns.output_dir or default_eval_dir(ns.checkpoint)
    check_output_dir(out, given=ns.output_dir is not None)  # before a minute of evaluation
    weights = ns.weights or weights_kind(ckpt)
    hparams = ckpt.get("hyper_parameters") or {}
    flip = bool(hparams.get("test_flip", False)) if ns.flip is None else ns.flip
    normalization = recorded_normalization(ckpt)  # the model's, whatever the data's would be
    dm = CIFAR10DataModule.from_checkpoint(
        ckpt,
        source=ns.source,
        data_dir=ns.data_dir,
        cache_dir=ns.cache_dir,
        eval_batch_size=ns.batch_size,
    )
    if ns.split == "val":
        refuse_whole_split(ns.checkpoint, ckpt, dm.hparams.val_size)
    del ckpt  # optimizer state: not needed here
    dm.prepare_data()
    dm.setup("test" if ns.split == "test" else "validate")
    loader = dm.test_dataloader() if ns.split == "test" else dm.val_dataloader()
    classes = list(hparams.get("class_names") or dm.classes)
    result = evaluate_loader(
        model,
        loader,
        preprocess=lambda images: preprocess(images, normalization),
        classes=classes,
        dtype=torch.bfloat16 if ns.precision == "bf16" else None,
        flip=flip,
    )
    result.update(
        checkpoint=str(ns.checkpoint),
        split=ns.split,
        weights=weights,
        flip=flip,
        normalization=normalization._asdict(),
        device=str(device),
        data=dict(dm.hparams),
    )
    _write(result, out, output_stem(ns.split, weights=ns.weights, flip=flip), classes)
    return result


def output_stem(split: str, *, weights: str | None, flip: bool) -> str:
    """The name shared by one evaluation's files: one per choice, so that scoring a checkpoint
    again another way keeps the first result; without choices just the split, the name the
    scripts and the record read (metrics_test.json)."""
    return "_".join([split, *([weights] if weights else []), *(["flip"] if flip else [])])


def check_output_dir(out: Path, *, given: bool) -> None:
    """Refuse, before any data is read, an output folder that cannot be made or written: a file
    there, a file in its path, a folder this user cannot write in. (A folder that exists is
    fine: its files of the same STEM are replaced.)"""
    flag = f"--output-dir {str(out)!r}" if given else f"the output folder {str(out)!r}"
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"{flag} is a file, not a folder; pass --output-dir with a folder's path (a "
            "missing folder is made)."
        )
    folder = next(p for p in (out, *out.absolute().parents) if p.exists())  # nearest that is
    if not folder.is_dir():
        raise ValueError(
            f"{flag} would be inside {str(folder)!r}, which is a file, not a folder; pass "
            "--output-dir with a folder's path."
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(
            f"{flag} cannot be written: {str(folder)!r} does not let this user write in it; "
            "pass --output-dir with a folder you can write."
        )


def _write(result: dict[str, Any], out: Path, stem: str, classes: list[str]) -> None:
    """metrics_STEM.json, confusion_matrix_STEM.png and reliability_STEM.png under `out`; the
    metrics printed, less the long tables."""
    out.mkdir(parents=True, exist_ok=True)
    # matplotlib only for figures
    from vit.maps.plots import plot_confusion_matrix, plot_reliability, save_figure

    confusion = result.pop("confusion_matrix")  # back at the end: the JSON's last, long entry
    title = f"{result['split']}: top-1 {result['top1']:.2%}"
    fig = plot_confusion_matrix(torch.tensor(confusion), classes=classes, title=title)
    save_figure(fig, out / f"confusion_matrix_{stem}.png", dpi=120, bbox_inches="tight")
    title = f"{result['split']}: ECE {result['ece']:.2%}, top-1 {result['top1']:.2%}"
    fig = plot_reliability(result["calibration"], ece=result["ece"], title=title)
    save_figure(fig, out / f"reliability_{stem}.png", dpi=120, bbox_inches="tight")
    result["confusion_matrix"] = confusion
    (out / f"metrics_{stem}.json").write_text(json.dumps(result, indent=2))
    long = ("confusion_matrix", "calibration")
    print(json.dumps({k: v for k, v in result.items() if k not in long}, indent=2))
    figures = f"confusion_matrix_{stem}.png and reliability_{stem}.png"
    print(f"wrote {out / f'metrics_{stem}.json'}, {figures}")
