"""The commands: `vit-train` (a LightningCLI) and `vit-evaluate` (checkpoint -> metrics JSON +
figure), reached through vit/entry.py, which switches MKL first; nothing else imports this module."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from vit import mkl_amd
from vit.checkpoint import (
    CHECKPOINT_HELP,
    WEIGHTS,
    WEIGHTS_HELP,
    load_checkpoint,
    load_model,
    weights_kind,
)
from vit.data import CIFAR10DataModule
from vit.errors import exit_on_user_error
from vit.evaluate import evaluate_loader
from vit.hardware import cpu_precision, resolve_device
from vit.lit_module import ViTClassifier
from vit.pretrained import PRETRAINED

log = logging.getLogger(__name__)
SUBCOMMANDS = ("fit", "validate", "test", "predict")


class ViTCLI(LightningCLI):
    """LightningCLI with the image size linked from data to model, one run folder shared by all
    loggers, and `--test_after_fit` to score the best checkpoint on the test split when fit ends."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.image_size", "model.network.img_size")
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="after fit, evaluate the best checkpoint (by val/acc) on the test split once",
        )
        parser.add_argument(
            "--bf16_fallback",
            type=bool,
            default=True,
            help="on a CPU without native bfloat16 matrix products (no AVX512-BF16 or AMX), "
            "where bf16 precisions train ~13x slower than float32, use 32-true instead (with a "
            "warning); false keeps the bf16 precision asked for",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # train_main always passes args (sys.argv[1:], with `fit` put first where it was left
        # out), so Lightning's "do not provide both args and command line arguments" warning
        # would fire on every run; parse them as LightningCLI does, without it.
        self.config = parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """Lightning's step that reads a `--ckpt_path` checkpoint's hyper-parameters into the
        config, with the file read by vit.checkpoint.load_checkpoint, so that a checkpoint of an
        older layout (flat options) is migrated to today's first instead of failing to parse."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        hparams = dict(load_checkpoint(ckpt_path).get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if hparams:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if self.subcommand == "fit" and config.get("ckpt_path") == "last":
            config.ckpt_path = resume_latest_run(config.trainer.logger)
            load_checkpoint(config.ckpt_path)  # a file that could run code: refused, clearly
        if "weights_only" in config:  # Lightning's own load of --ckpt_path: weights-only too
            if config.weights_only is False:
                raise ValueError(
                    "--weights_only false would let a checkpoint run code as it loads; vit-train "
                    "reads checkpoints weights-only. Drop the flag; for a trusted file holding "
                    "Python objects, re-save it as vit.checkpoint.load_checkpoint's error says."
                )
            config.weights_only = True  # None: remote paths would load with pickle's full power
        share_logger_version(config.trainer.logger)
        check_writable(config.trainer.logger)
        if config.bf16_fallback:
            config.trainer.precision = cpu_precision(
                config.trainer.precision, config.trainer.accelerator
            )
        mkl_amd.report(info=rank_zero_info)  # what vit-train's switch did (vit/entry.py)

    def after_fit(self) -> None:
        if self.config.fit.test_after_fit and not self.trainer.fast_dev_run:
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best")


def _logger_args(loggers: Any) -> list[Any]:
    """init_args of the configured loggers that write under save_dir/name."""
    if not isinstance(loggers, list):
        return []
    args = [getattr(lg, "init_args", None) for lg in loggers]
    return [a for a in args if a is not None and "save_dir" in a]


def _run_folder(logger_args: Any) -> Path:
    """save_dir/name of one logger: where its version_N folders go."""
    return Path(logger_args.save_dir) / (logger_args.get("name") or "")


def resume_latest_run(loggers: Any) -> str:
    """`--ckpt_path last`: the newest save_dir/name/version_N/checkpoints/last.ckpt; the loggers are
    pointed at that same version, so the resumed run keeps writing into its own folder."""
    args = _logger_args(loggers)
    if not args:
        raise ValueError(
            "--ckpt_path last needs loggers with save_dir/name (as in experiments/*.yaml)."
        )
    folder = _run_folder(args[0])
    found = sorted(folder.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ValueError(
            f"--ckpt_path last: no {folder}/version_*/checkpoints/last.ckpt to resume from; start "
            f"a fresh run without --ckpt_path, or pass the path of a checkpoint."
        )
    last = found[-1]
    for a in args:
        a.version = last.parent.parent.name
    log.info("resuming %s", last)
    return str(last)


def check_writable(loggers: Any) -> None:
    """Fail before training, not at the first checkpoint, when the run folder cannot be written."""
    for a in _logger_args(loggers):
        folder = _run_folder(a)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise ValueError(
                f"cannot write the run folder {str(folder)!r} ({err.strerror or err}); set "
                f"trainer.logger save_dir to a writable folder with free space."
            ) from None


def share_logger_version(loggers: Any) -> None:
    """Give loggers that share save_dir/name one version, so CSV and TensorBoard logs and the
    checkpoints of a run land in one folder: save_dir/name/version_N."""
    args = [a for a in _logger_args(loggers) if a.get("version") is None]
    if len(args) < 2:
        return
    taken = set()
    for a in args:
        folder = _run_folder(a)
        taken |= {p.name for p in folder.glob("version_*")} if folder.is_dir() else set()
    n = 0
    while f"version_{n}" in taken:
        n += 1
    for a in args:
        a.version = f"version_{n}"


def train_main(args: list[str] | None = None) -> None:
    """`vit-train [fit|validate|test|predict] -c experiments/quick.yaml [--key value ...]`.

    With no subcommand, `fit` is assumed.
    """
    args = list(sys.argv[1:] if args is None else args)
    if not args or (args[0] not in SUBCOMMANDS and args[0] not in ("-h", "--help")):
        args = ["fit", *args]
    torch.set_float32_matmul_precision("high")
    ViTCLI(
        ViTClassifier,
        CIFAR10DataModule,
        args=args,
        save_config_kwargs={"overwrite": True},
    )
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # under DDP: shut down before the interpreter


def evaluate_main(argv: list[str] | None = None) -> None:
    """`vit-evaluate CHECKPOINT [--split test] [--data-dir ...] [--output-dir ...]`."""
    exit_on_user_error(lambda: run_evaluate(argv))


def default_eval_dir(checkpoint: Path) -> Path:
    """eval/ beside a run's checkpoints/ folder, or beside a .safetensors; eval/NAME in the working
    folder for shipped weights, which live inside the installed package."""
    if str(checkpoint) in PRETRAINED:
        return Path("eval") / str(checkpoint)
    if checkpoint.suffix == ".safetensors":
        return checkpoint.parent / "eval"
    return checkpoint.parent.parent / "eval"


def run_evaluate(argv: list[str] | None = None) -> dict[str, Any]:
    """What `vit-evaluate` does; returns the metrics it printed and wrote."""
    parser = argparse.ArgumentParser(
        prog="vit-evaluate",
        description="Top-1, top-5 and per-class accuracy of a checkpoint, written as JSON, with a "
        "confusion-matrix PNG.",
    )
    parser.add_argument("checkpoint", type=Path, help=CHECKPOINT_HELP)
    parser.add_argument("--split", choices=("test", "val"), default="test")
    parser.add_argument(
        "--source",
        choices=("folder", "cifar10"),
        default=None,
        help="data source (default: the one the checkpoint was trained with)",
    )
    parser.add_argument(
        "--data-dir", default=None, help="data folder or archive (default: as trained)"
    )
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument(
        "--precision",
        choices=("32", "bf16"),
        default="32",
        help="bf16 is faster on GPUs and CPUs with native bf16 (AVX512-BF16, AMX), ~13x slower "
        "on AVX2-only CPUs",
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
        help="where metrics.json and confusion_matrix.png go (default: an eval/ folder beside "
        "the checkpoint; eval/NAME for shipped weights)",
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    device = resolve_device(ns.device)  # before the checkpoint loads: a typo fails at once
    model, ckpt = load_model(ns.checkpoint, weights=ns.weights)
    model.to(device)
    weights = ns.weights or weights_kind(ckpt)
    hparams = ckpt.get("hyper_parameters") or {}
    dm = CIFAR10DataModule.from_checkpoint(
        ckpt,
        source=ns.source,
        data_dir=ns.data_dir,
        cache_dir=ns.cache_dir,
        eval_batch_size=ns.batch_size,
    )
    del ckpt  # optimizer state: not needed here
    dm.prepare_data()
    dm.setup("test" if ns.split == "test" else "validate")
    loader = dm.test_dataloader() if ns.split == "test" else dm.val_dataloader()
    classes = list(hparams.get("class_names") or dm.classes)
    flip = bool(hparams.get("test_flip", False)) if ns.flip is None else ns.flip
    result = evaluate_loader(
        model,
        loader,
        preprocess=dm.preprocess,
        classes=classes,
        dtype=torch.bfloat16 if ns.precision == "bf16" else None,
        flip=flip,
    )
    result.update(
        checkpoint=str(ns.checkpoint),
        split=ns.split,
        weights=weights,
        flip=flip,
        device=str(device),
        data=dict(dm.hparams),
    )

    out = ns.output_dir or default_eval_dir(ns.checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    from vit.plots import plot_confusion_matrix, save_figure  # matplotlib only for figures

    confusion = result.pop("confusion_matrix")
    fig = plot_confusion_matrix(
        torch.tensor(confusion), classes=classes, title=f"{ns.split}: top-1 {result['top1']:.2%}"
    )
    stem = ns.split if ns.weights is None else f"{ns.split}_{ns.weights}"  # one file per choice
    save_figure(fig, out / f"confusion_matrix_{stem}.png", dpi=120, bbox_inches="tight")
    result["confusion_matrix"] = confusion
    (out / f"metrics_{stem}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "confusion_matrix"}, indent=2))
    print(f"wrote {out / f'metrics_{stem}.json'} and {out / f'confusion_matrix_{stem}.png'}")
    return result


if __name__ == "__main__":  # python -m vit.cli: vit-train, but torch is loaded before the switch
    mkl_amd.enable()  # so on an AMD CPU this says to use vit-train or python -m vit.entry instead
    train_main()
