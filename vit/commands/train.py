"""`vit-train`: a LightningCLI over ViTClassifier and CIFAR10DataModule, with one run folder
shared by the loggers, `--ckpt_path last`, and `--test_after_fit`."""

from __future__ import annotations

import difflib
import importlib.util
import logging
import re
import sys
import types
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from vit.commands.float32_overrides import compile_if_possible, dotted, trains_float32_on_cpu
from vit.commands.run_folders import (
    RunConfig,
    check_ckpt_path,
    check_writable,
    keep_metrics_history,
    new_run_folders,
    refuse_an_earlier_runs_folder,
    remove_if_empty,
    remove_unstarted,
    resume_latest_run,
    share_logger_version,
)
from vit.commands.whole_split import (
    check_checkpointing,
    checkpoint_to_test,
    drop_validation,
    holds_out_nothing,
    refuse_trained_on_validation,
    refuse_validation,
)
from vit.io.checkpoint import load_checkpoint
from vit.io.init_from import check_init_source
from vit.io.migrate import LEGACY_CLASS_PATHS
from vit.system import malloc, mkl_amd
from vit.system.hardware import cpu_precision
from vit.train.callbacks.checkpointing import FiniteLoss, SaveOnSigterm
from vit.train.callbacks.hp_metric import HpMetric
from vit.train.datamodule import CIFAR10DataModule
from vit.train.module import ViTClassifier

log = logging.getLogger(__name__)


SUBCOMMANDS = ("fit", "validate", "test", "predict")


class SuggestingParser(LightningArgumentParser):
    """A parser whose error for an unknown option (a typo in the YAML or on the command line)
    names the closest options it knows."""

    def error(self, message: str, ex: Exception | None = None) -> Any:
        parser = getattr(ex, "subcommand_parser", None) or self
        return super().error(message + closest_options(message, parser), ex)


# the two ways jsonargparse names an option it does not know: from a config, from the command line
UNKNOWN_OPTION = re.compile(r"does not accept option '([\w.]+)'|unrecognized arguments: --([\w.]+)")


def closest_options(message: str, parser: Any) -> str:
    """The "; did you mean X?" to add to an error that names an option `parser` does not know,
    from the options it knows; nothing where none is close."""
    found = UNKNOWN_OPTION.search(message)
    if found is None:
        return ""
    key, dashes = (found[1], "") if found[1] else (found[2], "--")
    known = [a.dest for a in getattr(parser, "_actions", []) if "." in a.dest]
    group, _, name = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == group}
    # a misspelt name beside its siblings first; else a misspelt group (model.netwrk.depth)
    near = [siblings[n] for n in difflib.get_close_matches(name, siblings, n=2, cutoff=0.8)]
    near = near or difflib.get_close_matches(key, known, n=1, cutoff=0.85)
    return f"; did you mean {' or '.join(dashes + k for k in near)}?" if near else ""


class ViTCLI(LightningCLI):
    """LightningCLI with the image size linked from data to model, one run folder shared by the CSV
    and TensorBoard loggers, and `--test_after_fit` to score the best checkpoint on the test split
    when fit ends."""

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        # a subcommand's parse error prints its usage line first: listing every option, that
        # ran ~125 lines ahead of the one-line error; its --help still lists them all. (The
        # main parser, made first, keeps its own: the subcommands' names are built from it.)
        if hasattr(self, "parser"):
            kwargs.setdefault("usage", "%(prog)s [-c CONFIG] [--KEY VALUE ...]")
        return super().init_parser(**kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.image_size", "model.network.img_size")
        # always on, whatever the YAML lists: no checkpoint may hold diverged weights
        parser.add_lightning_class_args(FiniteLoss, "finite_loss")
        # always on too: SIGTERM saves last.ckpt at the current step (after the YAML's callbacks,
        # so it saves what they have done at that step, EMA's average included)
        parser.add_lightning_class_args(SaveOnSigterm, "save_on_sigterm")
        # TensorBoard's HParams tab compares runs by hp_metric: the validation accuracy there
        parser.add_lightning_class_args(HpMetric, "hp_metric")
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="after fit, evaluate the best checkpoint (by val/acc) on the test split once; "
            "with data.val_size 0 (no validation split), the last",
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
        parser.add_argument(
            "--float32_overrides",
            type=dict[str, Any],
            default={},
            help="options that replace the config's where a fit on a CPU trains in float32 (the "
            "bf16 fallback, or 32-true asked for): fewer steps fit in a time budget there; nested "
            "as in the config, e.g. {model: {network: {drop_path_rate: 0.0}}}; they win over "
            "the same options given elsewhere ({} turns them off)",
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
        if not ckpt_path:
            return
        check_ckpt_path(ckpt_path, subcommand)  # a local path naming no file: refused here
        if not Path(ckpt_path).is_file():  # Lightning's names (last, best, ...) and URLs
            return
        ckpt = load_checkpoint(ckpt_path)
        if subcommand == "fit":
            self._resumed_step = ckpt.get("global_step")
        if subcommand == "validate":  # checked here, where the file is read anyway
            refuse_trained_on_validation(ckpt_path, ckpt, self.config[subcommand].get("data"))
        hparams = dict(ckpt.get("hyper_parameters") or {})
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
            # a file that could run code: refused, clearly
            self._resumed_step = load_checkpoint(config.ckpt_path).get("global_step")
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
        if config.bf16_fallback:
            config.trainer.precision = cpu_precision(
                config.trainer.precision, config.trainer.accelerator
            )
        if config.get("float32_overrides"):
            float32 = trains_float32_on_cpu(config.trainer)
            if float32:
                config.float32_overrides = compile_if_possible(config.float32_overrides)
            # checked on every machine, before any folder is made: a typo fails where it is made
            merged = self._merged(config.float32_overrides, "float32_overrides")
            if float32:
                self.config = merged
                config = self.config[self.subcommand] if self.subcommand else self.config
                applied = ", ".join(f"{k}={v}" for k, v in dotted(config.float32_overrides).items())
                rank_zero_info(
                    f"training in float32 on a CPU: float32_overrides applied ({applied})"
                )
        if self.subcommand in ("fit", None) and holds_out_nothing(config):  # None: run=False
            check_checkpointing(config)
            rank_zero_info(drop_validation(config))
        if self.subcommand == "validate":
            refuse_validation(config)
        if self.subcommand == "fit":  # the first config.yaml of a resumed run is kept
            self.save_config_kwargs["resumed_step"] = getattr(self, "_resumed_step", None)
        share_logger_version(config.trainer.logger)
        self._new_runs = new_run_folders(config.trainer.logger)
        self._probed_folders = check_writable(config.trainer.logger)
        mkl_amd.report(info=rank_zero_info)  # what vit-train's switches did (vit/commands/entry.py)
        malloc.report(info=rank_zero_info)

    def before_fit(self) -> None:
        """A resumed run's metrics.csv goes on from its checkpoint's step, its history kept; a
        fast_dev_run saves no checkpoint."""
        step = getattr(self, "_resumed_step", None)
        if step is not None:
            keep_metrics_history(self.trainer.loggers, step)
        elif not self.trainer.fast_dev_run:  # a new run: not into an earlier one's folder
            refuse_an_earlier_runs_folder(self.trainer)
        if self.trainer.fast_dev_run:  # Lightning's ModelCheckpoint still saves last.ckpt at
            for c in self.trainer.checkpoint_callbacks:  # train end: into ./checkpoints
                if isinstance(c, ModelCheckpoint):
                    c.save_last = False

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except BaseException:
            self._remove_unstarted_run()
            raise

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except BaseException:
            if self.trainer.global_step == 0:  # failed before training: no run worth keeping
                self._remove_unstarted_run()
            raise
        # a run whose loggers wrote nothing (fast_dev_run swaps them out) leaves no empty folder
        remove_if_empty(getattr(self, "_probed_folders", []))

    def _remove_unstarted_run(self) -> None:
        """The folders this run made and never trained in: its version_N (none with a checkpoint),
        then the probe's, if empty."""
        remove_unstarted(getattr(self, "_new_runs", []))
        remove_if_empty(getattr(self, "_probed_folders", []))

    def _merged(self, overrides: dict[str, Any], name: str) -> Any:
        """The parsed config with a nested mapping of options merged in, each checked by the
        parser as if given on the command line; a name the config does not have fails clearly."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        unknown = [key for key in dotted(overrides) if key not in config]
        if unknown:
            raise ValueError(
                f"{name}: {', '.join(unknown)} is not an option of vit-train "
                f"{self.subcommand or 'fit'}; give options nested as in the config, e.g. "
                "{model: {network: {drop_path_rate: 0.0}}} (`vit-train fit --help` lists them)."
            )
        wrapped = {self.subcommand: overrides} if self.subcommand else overrides
        return self.parser.parse_object(wrapped, self.config.clone())

    def after_fit(self) -> None:
        if self.config.fit.test_after_fit and not self.trainer.fast_dev_run:
            # the best by val/acc; a fit without a validation split (val_size 0): its last
            validated = not holds_out_nothing(self.config.fit)
            ckpt_path = "best" if validated else checkpoint_to_test(self.trainer)
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)


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
        parser_class=SuggestingParser,
        save_config_callback=RunConfig,
        save_config_kwargs={"overwrite": True},
    )
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # under DDP: shut down before the interpreter
