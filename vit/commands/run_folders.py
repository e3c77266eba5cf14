"""Where a vit-train run writes: the CSV and TensorBoard loggers share one save_dir/name/version_N
folder, `--ckpt_path last` finds the newest run's last.ckpt, and a folder that cannot be written
fails before training. Trackers (W&B, MLflow, ...) keep their own run ids."""

from __future__ import annotations

import contextlib
import csv
import importlib
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

log = logging.getLogger(__name__)


def _logger_list(loggers: Any) -> list[Any]:
    """trainer.logger as a list of class_path/init_args Namespaces (one logger, or none)."""
    items = loggers if isinstance(loggers, list) else [loggers]
    return [lg for lg in items if getattr(lg, "init_args", None) is not None]


def configures(item: Any, classes: type | tuple[type, ...]) -> bool:
    """Whether a configured class_path/init_args item builds one of `classes` or a subclass, by
    any class_path (jsonargparse keeps a full module path such as
    lightning.pytorch.loggers.csv_logs.CSVLogger as given)."""
    module, _, name = str(getattr(item, "class_path", "")).rpartition(".")
    try:  # already imported: jsonargparse resolved it while parsing
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, classes)


def _writes_versions(logger: Any) -> bool:
    """Whether a configured logger writes save_dir/name/version_N folders: Lightning's CSVLogger
    and TensorBoardLogger or a subclass. Other loggers keep their own run ids: WandbLogger reads
    `version` as the W&B run id and MLFlowLogger has none."""
    return configures(logger, (CSVLogger, TensorBoardLogger))


def _versioned_args(loggers: Any) -> list[Any]:
    """init_args of the configured CSV and TensorBoard loggers: those that share a version."""
    return [
        lg.init_args
        for lg in _logger_list(loggers)
        if _writes_versions(lg) and lg.init_args.get("save_dir") is not None
    ]


def _run_folder(logger_args: Any) -> Path:
    """save_dir/name of one logger: where its version_N folders go."""
    return Path(logger_args.save_dir) / (logger_args.get("name") or "")


def resume_latest_run(loggers: Any) -> str:
    """`--ckpt_path last`: the newest save_dir/name/version_N/checkpoints/last.ckpt of the CSV or
    TensorBoard logger; those loggers are pointed at that same version, so the resumed run keeps
    writing into its own folder (a tracker such as W&B or MLflow starts a run of its own)."""
    args = _versioned_args(loggers)
    if not args:
        listed = [str(lg.class_path).rpartition(".")[2] for lg in _logger_list(loggers)]
        raise ValueError(
            "--ckpt_path last finds the run to resume through a CSVLogger or TensorBoardLogger "
            f"with save_dir and name, but trainer.logger lists {listed or 'none'}; add one (as "
            "experiments/*.yaml do) or pass the path of a checkpoint to --ckpt_path."
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
        a.version = _version_of(last.parent.parent.name)
    log.info("resuming %s", last)
    return str(last)


def keep_metrics_history(loggers: list[Any], resumed_step: int) -> None:
    """A resumed run's CSVLogger appends to its folder's metrics.csv instead of starting it anew
    (Lightning's CSV writer deletes the file when it opens a folder that has one), and its
    TensorBoardLogger marks the steps it logs again as purged. Lightning logs a step's metrics
    under the step count before it, so all that a run logged up to its checkpoint at
    `resumed_step` (the checkpoint's global step) sits at steps below it; the rows at that step
    and after came from steps the resumed run takes again: they go from metrics.csv, and
    TensorBoard's readers drop their events (SummaryWriter's purge_step; the event files keep
    them)."""
    for logger in loggers:
        # the writer is made lazily; the CLI passes purge_step=None when the config names none
        tensorboard = isinstance(logger, TensorBoardLogger) and logger._experiment is None
        if tensorboard and logger._kwargs.get("purge_step") is None:
            logger._kwargs["purge_step"] = resumed_step
        if not isinstance(logger, CSVLogger):
            continue
        path = Path(logger.log_dir) / "metrics.csv"
        if not path.is_file():
            continue
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            keys = list(reader.fieldnames or [])
            rows = [row for row in reader if _row_step(row) < resumed_step]
        with warnings.catch_warnings():  # the writer's "will be deleted": no longer so
            warnings.filterwarnings("ignore", message="Experiment logs directory")
            writer = logger.experiment  # opening the folder deletes metrics.csv
        with path.open("w", newline="") as file:
            out = csv.DictWriter(file, fieldnames=keys)
            out.writeheader()
            out.writerows(rows)
        writer.metrics_keys = keys  # the header it appends under (new keys rewrite it)


class RunConfig(SaveConfigCallback):
    """The run's resolved config in its folder: config.yaml, or, for a fit resumed at step
    `resumed_step` in a folder that holds one already, config-resumed-at-step-N.yaml beside it:
    the first records how the run began (a resume's config names the checkpoint, and may
    change more), so it is kept."""

    def __init__(self, *args: Any, resumed_step: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resumed_step = resumed_step

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.already_saved and self.save_to_log_dir and self.resumed_step is not None:
            log_dir = trainer.log_dir  # every rank asks: it is broadcast from rank 0
            if log_dir and os.path.isfile(os.path.join(log_dir, self.config_filename)):
                self.config_filename = f"config-resumed-at-step-{self.resumed_step}.yaml"
        super().setup(trainer, pl_module, stage)


def refuse_an_earlier_runs_folder(trainer: L.Trainer) -> None:
    """A new fit (not a resume) whose folder holds an earlier run's config.yaml stops here, before
    the trainer runs: Lightning opens the loggers before any callback's setup, and the CSV logger
    deletes the metrics.csv of a folder it opens. Under DDP every rank checks before this fit
    writes its own config.yaml: rank 0 writes it only once the other ranks have joined."""
    log_dir = trainer.log_dir
    path = os.path.join(log_dir, "config.yaml") if log_dir else ""
    if path and os.path.isfile(path):
        raise FileExistsError(shared_folder_message(trainer, path))


def shared_folder_message(trainer: L.Trainer, config_path: str) -> str:
    """Why a new fit finds an earlier run's config.yaml in its folder, and how to give it one."""
    first = trainer.loggers[0] if trainer.loggers else None
    over = "its config.yaml, and its checkpoints of the same names"
    if first is None:
        why = (
            "with no logger (--trainer.logger false) every fit writes into Lightning's "
            f"default_root_dir, {trainer.default_root_dir}"
        )
        fix = "--trainer.default_root_dir DIR, or the recipe's loggers: runs/<name>/version_N"
    elif isinstance(first, (CSVLogger, TensorBoardLogger)):
        why = f"the logger's version is fixed ({first.version!r}): it writes into that run's folder"
        fix = "leave the logger's version unset: each fit then takes the next version_N"
    else:
        over = "its config.yaml"
        why = f"the first logger, {type(first).__name__}, puts every fit's config in its save_dir"
        fix = (
            "--trainer.logger.save_dir DIR, or keep the recipe's CSV and TensorBoard loggers "
            "first and add the tracker after them: --trainer.logger+=..."
        )
    return (
        f"{config_path} is an earlier run's, and this fit would write over that run's files "
        f"({over}): {why}. Give this fit a folder of its own ({fix}), or continue that run "
        "with --ckpt_path and its last.ckpt."
    )


def _row_step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step") or "inf")
    except ValueError:  # not a number: not a row of this writer's
        return float("inf")


def _version_of(folder: str) -> int | str:
    """The logger version that writes into `folder`: N for version_N (Lightning's progress bar
    shows an int whole, a string by its last four characters), else the name itself."""
    number = folder.removeprefix("version_")
    return int(number) if number.isdigit() and number == str(int(number)) else folder


# what Lightning's --ckpt_path takes besides a path; "last" in a fit is resume_latest_run's
LIGHTNING_CKPT_NAMES = ("best", "last", "hpc", "registry")


def check_ckpt_path(ckpt_path: str, subcommand: str | None) -> None:
    """A local --ckpt_path that is not a file fails here, before any folder or data is made, saying
    what to give instead (a URL or one of Lightning's names is left to Lightning)."""
    if ckpt_path in LIGHTNING_CKPT_NAMES or ckpt_path.startswith("registry:") or "://" in ckpt_path:
        return
    path = Path(ckpt_path).expanduser()
    if path.is_file():
        return
    if path.is_dir():
        inside = sorted(path.rglob("*.ckpt"), key=lambda p: p.stat().st_mtime)[-3:]
        found = ", ".join(str(p) for p in reversed(inside)) or "none"
        raise IsADirectoryError(
            f"--ckpt_path {ckpt_path} is a folder; give one checkpoint file in it (newest found: "
            f"{found})."
        )
    fits = subcommand in ("fit", None)  # None: LightningCLI(run=False)
    resume = ", or `--ckpt_path last` to continue this config's newest run" if fits else ""
    raise FileNotFoundError(
        f"--ckpt_path {ckpt_path}: no such file; give a checkpoint vit-train wrote "
        f"(runs/<name>/version_N/checkpoints/last.ckpt, or a best one beside it){resume}."
    )


def _local_folders(loggers: Any) -> list[Path]:
    """The folders the configured loggers write: save_dir/name of CSV and TensorBoard, save_dir of
    the others (W&B's `name` is a run name, not a folder), none for a logger given a tracking_uri
    (MLflow then writes there; its default save_dir ./mlruns goes unused)."""
    folders = [_run_folder(a) for a in _versioned_args(loggers)]
    for lg in _logger_list(loggers):
        a = lg.init_args
        if not _writes_versions(lg) and a.get("save_dir") and not a.get("tracking_uri"):
            folders.append(Path(a.save_dir))
    return folders


def check_writable(loggers: Any) -> list[Path]:
    """Fail before training, not at the first checkpoint, when the run folder cannot be written.
    Returns the folders the probe made, for `remove_if_empty`."""
    made: list[Path] = []
    for folder in _local_folders(loggers):
        here = folder.absolute()
        made += [p for p in (here, *here.parents) if not p.exists() and p not in made]
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            remove_if_empty(made)
            raise ValueError(
                f"cannot write the run folder {str(folder)!r} ({err.strerror or err}); set "
                f"trainer.logger save_dir to a writable folder with free space."
            ) from None
    return made


def remove_if_empty(folders: list[Path]) -> None:
    """Remove the folders given that are still empty, deepest first: a config error found after
    the probe (the model's, the data's) leaves no empty run folder behind."""
    for folder in sorted(folders, key=lambda p: len(p.absolute().parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty, or gone: left as it is
            folder.rmdir()


def new_run_folders(loggers: Any) -> list[Path]:
    """The save_dir/name/version_N folders the CSV and TensorBoard loggers are set to write that
    do not exist yet: this run's own, for `remove_unstarted`. A logger left to pick its version
    at run time is not known here and is left out."""
    folders: list[Path] = []
    for a in _versioned_args(loggers):
        version = a.get("version")
        if version is None:
            continue
        name = version if isinstance(version, str) else f"version_{version}"
        folder = (_run_folder(a) / name).absolute()
        if not folder.exists() and folder not in folders:
            folders.append(folder)
    return folders


def remove_unstarted(folders: list[Path]) -> None:
    """Remove run folders made by a run that failed before its first step (a data setting found
    wrong at setup): what the loggers wrote at start, and no checkpoint. One holding a .ckpt stays."""
    for folder in folders:
        if folder.is_dir() and not any(folder.rglob("*.ckpt")):
            shutil.rmtree(folder, ignore_errors=True)


def share_logger_version(loggers: Any) -> None:
    """Give the CSV and TensorBoard loggers that share save_dir/name one version, so their logs and
    the checkpoints of a run land in one folder: save_dir/name/version_N. Other loggers (W&B,
    MLflow, ...) are left as configured: each run gets its own id there."""
    args = [a for a in _versioned_args(loggers) if a.get("version") is None]
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
        a.version = n  # an int: the loggers name the folder version_N, the progress bar shows N
