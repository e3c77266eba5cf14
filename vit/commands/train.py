"""`vit-train`: a LightningCLI over ViTClassifier and CIFAR10DataModule, with one run folder
shared by the loggers, `--ckpt_path last`, and `--test_after_fit`."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from vit.io.checkpoint import load_checkpoint
from vit.io.init_from import check_init_source
from vit.io.migrate import LEGACY_CLASS_PATHS
from vit.system import mkl_amd
from vit.system.hardware import cpu_precision
from vit.train.callbacks.checkpointing import FiniteLoss
from vit.train.datamodule import CIFAR10DataModule
from vit.train.module import ViTClassifier

log = logging.getLogger(__name__)


SUBCOMMANDS = ("fit", "validate", "test", "predict")


class ViTCLI(LightningCLI):
    """LightningCLI with the image size linked from data to model, one run folder shared by all
    loggers, and `--test_after_fit` to score the best checkpoint on the test split when fit ends."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.image_size", "model.network.img_size")
        # always on, whatever the YAML lists: no checkpoint may hold diverged weights
        parser.add_lightning_class_args(FiniteLoss, "finite_loss")
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
            "where bf16 precisions train many times slower than float32 (experiments/record/benchmarks/"
            "fp32.md), use 32-true instead (with a "
            "warning); false keeps the bf16 precision asked for",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # train_main always passes args (sys.argv[1:], with `fit` put first where it was left
        # out), so Lightning's "do not provide both args and command line arguments" warning
        # would fire on every run; parse them as LightningCLI does, without it.
        self.config = parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """Lightning's step that reads a `--ckpt_path` checkpoint's hyper-parameters into the
        config, with the file read by vit.io.checkpoint.load_checkpoint, so that a checkpoint of an
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
        for callback in config.trainer.callbacks or []:  # saved under today's names from here on
            if getattr(callback, "class_path", None) in LEGACY_CLASS_PATHS:
                callback.class_path = LEGACY_CLASS_PATHS[callback.class_path]
        if self.subcommand == "fit" and config.get("ckpt_path") == "last":
            config.ckpt_path = resume_latest_run(config.trainer.logger)
            load_checkpoint(config.ckpt_path)  # a file that could run code: refused, clearly
        if self.subcommand == "fit" and config.model.get("init_from") and not config.ckpt_path:
            # a missing file or another architecture fails here, before the data is decoded
            check_init_source(config.model.init_from, vars(config.model.network.clone()))
        if "weights_only" in config:  # Lightning's own load of --ckpt_path: weights-only too
            if config.weights_only is False:
                raise ValueError(
                    "--weights_only false would let a checkpoint run code as it loads; vit-train "
                    "reads checkpoints weights-only. Drop the flag; for a trusted file holding "
                    "Python objects, re-save it as vit.io.checkpoint.load_checkpoint's error says."
                )
            config.weights_only = True  # None: remote paths would load with pickle's full power
        share_logger_version(config.trainer.logger)
        check_writable(config.trainer.logger)
        if config.bf16_fallback:
            config.trainer.precision = cpu_precision(
                config.trainer.precision, config.trainer.accelerator
            )
        mkl_amd.report(info=rank_zero_info)  # what vit-train's switch did (vit/commands/entry.py)

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


class _MovedModule(types.ModuleType):
    """A module name from before the sub-packages (vit.callbacks, vit.lit_module), so that a
    config.yaml saved then still loads: each old class path resolves to today's class."""

    def __getattr__(self, name: str) -> Any:
        old = f"{self.__name__}.{name}"
        if old not in LEGACY_CLASS_PATHS:
            raise AttributeError(f"{old} does not exist (and has no new name)")
        module, _, attr = LEGACY_CLASS_PATHS[old].rpartition(".")
        log.warning(
            "class_path %s is %s now; the old name still works", old, LEGACY_CLASS_PATHS[old]
        )
        return getattr(importlib.import_module(module), attr)


def accept_legacy_class_paths() -> None:
    """Let old class paths in configs resolve (vit-train only; `import vit` changes nothing)."""
    for name in sorted({path.rpartition(".")[0] for path in LEGACY_CLASS_PATHS}):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = _MovedModule(name)  # vit.data is a package today: not aliased


def train_main(args: list[str] | None = None) -> None:
    """`vit-train [fit|validate|test|predict] -c experiments/quick.yaml [--key value ...]`.

    With no subcommand, `fit` is assumed.
    """
    args = list(sys.argv[1:] if args is None else args)
    if not args or (args[0] not in SUBCOMMANDS and args[0] not in ("-h", "--help")):
        args = ["fit", *args]
    torch.set_float32_matmul_precision("high")
    accept_legacy_class_paths()
    ViTCLI(
        ViTClassifier,
        CIFAR10DataModule,
        args=args,
        save_config_kwargs={"overwrite": True},
    )
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # under DDP: shut down before the interpreter
