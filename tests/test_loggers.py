"""Trackers added with `--trainer.logger+=`: W&B (offline) and MLflow (a local SQLite store) record
a tiny fit next to the config's CSV logger, each fit in a run of its own; only the CSV and
TensorBoard loggers share the version_N run folder (vit.commands.run_folders)."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import struct
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from jsonargparse import Namespace

from tests.helpers import REPO, train_args
from vit.commands.run_folders import (
    check_writable,
    new_run_folders,
    remove_if_empty,
    remove_unstarted,
    resume_latest_run,
    share_logger_version,
)
from vit.commands.train import ViTCLI, train_main
from vit.train.datamodule import CIFAR10DataModule
from vit.train.module import ViTClassifier

CSV = "lightning.pytorch.loggers.csv_logs.CSVLogger"  # a full module path, kept as given
TENSORBOARD = "lightning.pytorch.loggers.TensorBoardLogger"  # a short name, as parsed
WANDB = "lightning.pytorch.loggers.WandbLogger"
MLFLOW = "lightning.pytorch.loggers.MLFlowLogger"
FIT = ("--trainer.max_epochs=1", "--trainer.log_every_n_steps=1")  # 3 steps, each logged

# The README's lines, as users type them: `vit-train -c experiments/cpu60.yaml` and a W&B logger
# appended to the recipe's CSV and TensorBoard loggers, then the same for MLflow. The tests below
# run these very arguments, so the README cannot drift from what works.
README = (REPO / "README.md").read_text()
WANDB_LINE = re.compile(r"`vit-train -c experiments/cpu60\.yaml (--trainer\.logger\+=Wandb[^`]*)`")
MLFLOW_LINE = re.compile(r"`(--trainer\.logger\+=MLFlow[^`]*)`")


def _readme_args(line: re.Pattern[str]) -> list[str]:
    found = line.findall(README)
    assert len(found) == 1, f"README.md: {len(found)} lines match {line.pattern}"
    return shlex.split(found[0])


def _logger(class_path: str, **init_args: object) -> Namespace:
    """One trainer.logger entry as jsonargparse leaves it after parsing."""
    return Namespace(class_path=class_path, init_args=Namespace(**init_args))


def _mixed(runs: Path, tmp_path: Path) -> list[Namespace]:
    """W&B and MLflow first (their save_dirs hold no runs), then CSV and TensorBoard."""
    return [
        _logger(WANDB, save_dir=str(tmp_path / "wandb"), name="my-run", version=None),
        _logger(MLFLOW, save_dir="./mlruns", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
        _logger(CSV, save_dir=str(runs), name="tiny", version=None),
        _logger(TENSORBOARD, save_dir=str(runs), name="tiny", version=None),
    ]


def test_only_csv_and_tensorboard_share_the_version(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "tiny" / "version_0").mkdir(parents=True)
    loggers = _mixed(runs, tmp_path)
    share_logger_version(loggers)
    wandb, mlflow, csv_logger, tensorboard = (lg.init_args for lg in loggers)
    assert csv_logger.version == tensorboard.version == 1  # version_0 is taken
    assert wandb.version is None  # W&B's run id: it picks a fresh one per run
    assert "version" not in mlflow  # MLFlowLogger has no such argument


def test_the_shared_version_names_the_folder_and_shows_whole_in_the_progress_bar(
    tmp_path: Path,
) -> None:
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks.progress.progress_bar import get_standard_metrics
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    runs = tmp_path / "runs"
    for n in range(10):  # version_10: a string version would show as "n_10" in the bar
        (runs / "tiny" / f"version_{n}").mkdir(parents=True)
    loggers = _mixed(runs, tmp_path)[2:]
    share_logger_version(loggers)
    made = [CSVLogger(**loggers[0].init_args), TensorBoardLogger(**loggers[1].init_args)]
    assert [Path(lg.log_dir) for lg in made] == [runs / "tiny" / "version_10"] * 2
    trainer = Trainer(logger=made, default_root_dir=tmp_path, enable_checkpointing=False)
    assert str(get_standard_metrics(trainer)["v_num"]) == "10"  # two loggers: joined as a string


@pytest.mark.parametrize(
    ("folder", "version"),
    [
        ("version_3", 3),
        ("version_12", 12),
        ("version_03", "version_03"),
        ("version_best", "version_best"),
    ],
)
def test_resume_gives_the_loggers_the_version_that_writes_into_the_folder(
    tmp_path: Path, folder: str, version: int | str
) -> None:
    last = tmp_path / "runs" / "tiny" / folder / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    loggers = _mixed(tmp_path / "runs", tmp_path)[2:]
    assert resume_latest_run(loggers) == str(last)
    assert [lg.init_args.version for lg in loggers] == [version, version]
    from lightning.pytorch.loggers import CSVLogger

    assert Path(CSVLogger(**loggers[0].init_args).log_dir) == last.parent.parent


def test_only_the_runs_own_new_folder_goes_when_it_never_trained(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "tiny" / "version_0").mkdir(parents=True)  # an earlier run's
    loggers = _mixed(runs, tmp_path)
    share_logger_version(loggers)
    new = new_run_folders(loggers)
    assert new == [(runs / "tiny" / "version_1").absolute()]  # once for CSV and TensorBoard
    (new[0] / "checkpoints").mkdir(parents=True)
    (new[0] / "hparams.yaml").write_text("{}")
    remove_unstarted(new)
    assert not new[0].exists() and (runs / "tiny" / "version_0").is_dir()
    new[0].joinpath("checkpoints").mkdir(parents=True)
    new[0].joinpath("checkpoints", "last.ckpt").write_bytes(b"saved")  # SIGTERM's save, say
    remove_unstarted(new)
    assert (new[0] / "checkpoints" / "last.ckpt").read_bytes() == b"saved"
    resumed = _mixed(runs, tmp_path)
    for a in resumed[2:]:
        a.init_args.version = 1  # as resume_latest_run points them at version_1
    assert new_run_folders(resumed) == []  # an existing run is never this run's to remove


def test_resume_finds_the_run_through_csv_even_when_a_tracker_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    for n, mtime in ((3, 2_000_000_000), (0, 1_000_000_000)):
        last = runs / "tiny" / f"version_{n}" / "checkpoints" / "last.ckpt"
        last.parent.mkdir(parents=True)
        last.write_bytes(b"")
        os.utime(last, (mtime, mtime))
    loggers = _mixed(runs, tmp_path)
    assert resume_latest_run(loggers) == str(runs / "tiny/version_3/checkpoints/last.ckpt")
    wandb, mlflow, csv_logger, tensorboard = (lg.init_args for lg in loggers)
    assert csv_logger.version == tensorboard.version == 3
    assert wandb.version is None and "version" not in mlflow

    with pytest.raises(ValueError, match=r"CSVLogger or TensorBoardLogger.*'WandbLogger'"):
        resume_latest_run(loggers[:2])

    # the run folder is probed; nothing is made where a tracker only names a run (W&B's name)
    # or where MLflow's default save_dir goes unused (it was given a tracking_uri)
    monkeypatch.chdir(tmp_path)
    made = check_writable(loggers)
    assert (tmp_path / "wandb").is_dir() and not (tmp_path / "wandb" / "my-run").exists()
    assert not (tmp_path / "mlruns").exists()
    assert made == [tmp_path / "wandb"]  # the run folders were there already


def test_the_probes_folders_go_again_while_empty(tmp_path: Path) -> None:
    new = tmp_path / "new"
    loggers = [_logger(CSV, save_dir=str(new / "a"), name="tiny", version=None)]
    loggers += [_logger(TENSORBOARD, save_dir=str(new / "b"), name="tiny", version=None)]
    made = check_writable(loggers)
    assert (new / "a" / "tiny").is_dir() and (new / "b" / "tiny").is_dir()
    kept = new / "b" / "tiny" / "events"
    kept.write_text("a file written since")
    remove_if_empty(made)  # a later config error: what holds nothing goes, deepest first
    assert not (new / "a").exists() and kept.exists()
    kept.unlink()
    remove_if_empty(made)
    assert not new.exists() and tmp_path.is_dir()

    # a folder that cannot be made: the error, and the folders made before it are gone
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    loggers[1].init_args.save_dir = str(blocker / "runs")
    with pytest.raises(ValueError, match="cannot write the run folder.*a_file"):
        check_writable(loggers)
    assert not new.exists()


def _csv_metric(run: Path, key: str) -> list[float]:
    """The values of `key` in a run folder's metrics.csv, in order."""
    with (run / "metrics.csv").open() as f:
        return [float(row[key]) for row in csv.DictReader(f) if row.get(key)]


def _fit(data: Path, runs: Path, *tracker: str) -> None:
    train_main(train_args(data, runs, *FIT, *tracker))


def _home_in(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$HOME and the XDG folders under `home`: a tracker's ids and caches stay out of the user's."""
    for key, value in dict(
        HOME=home, XDG_CACHE_HOME=home / ".cache", XDG_CONFIG_HOME=home / ".config"
    ).items():
        monkeypatch.setenv(key, str(value))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_second_fit_without_a_logger_leaves_the_first_runs_files(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--trainer.logger false: every fit writes into default_root_dir (the working folder). A
    second fit there stops before training, saying how to give it a folder; the first run's
    config.yaml and checkpoints are as it left them."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    args = [*train_args(image_tree, tmp_path / "runs", *FIT), "--trainer.logger=false"]
    train_main(args)
    first = _files(cwd)
    assert "config.yaml" in first and "checkpoints/last.ckpt" in first
    with pytest.raises(FileExistsError, match=r"config\.yaml is an earlier run's") as refused:
        train_main([*args, "--trainer.max_epochs=2"])
    assert "--trainer.default_root_dir DIR" in str(refused.value)
    assert _files(cwd) == first
    train_main([*args, f"--trainer.default_root_dir={tmp_path / 'second'}"])  # as it says
    assert (tmp_path / "second" / "checkpoints" / "last.ckpt").is_file()


def test_a_fixed_logger_version_does_not_write_over_its_earlier_run(
    image_tree: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    logger = json.dumps(
        [{"class_path": CSV, "init_args": {"save_dir": str(runs), "name": "tiny", "version": 0}}]
    )
    args = [*train_args(image_tree, runs, *FIT), f"--trainer.logger={logger}"]
    train_main(args)
    first = _files(runs / "tiny" / "version_0")
    with pytest.raises(FileExistsError, match=r"version is fixed \(0\).*leave the logger's"):
        train_main(args)
    assert _files(runs / "tiny" / "version_0") == first


def test_a_tracker_first_is_told_to_give_its_save_dir() -> None:
    import lightning as L
    from lightning.pytorch.loggers import Logger

    from vit.commands.run_folders import shared_folder_message

    class Tracker(Logger):
        name, version, save_dir = "t", "run-1", "."

        def log_metrics(self, metrics, step=None) -> None: ...

        def log_hyperparams(self, params, *args, **kwargs) -> None: ...

    trainer = L.Trainer(logger=Tracker(), enable_progress_bar=False, enable_model_summary=False)
    message = shared_folder_message(trainer, "./config.yaml")
    assert "the first logger, Tracker, puts every fit's config in its save_dir" in message
    assert "--trainer.logger.save_dir DIR" in message and "checkpoints" not in message


# ---- W&B, offline --------------------------------------------------------------------------


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """wandb in offline mode with every folder it uses (and $HOME) under tmp_path: nothing is
    written in the user's home and nothing touches the network."""
    wandb = pytest.importorskip("wandb")
    home = tmp_path / "home"
    _home_in(home, monkeypatch)
    env = dict(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_ERROR_REPORTING="false",
        WANDB_DIR=home / "wandb",
        WANDB_CACHE_DIR=home / "cache",
        WANDB_CONFIG_DIR=home / "config",
        WANDB_DATA_DIR=home / "data",
        WANDB_ARTIFACT_DIR=home / "artifacts",
    )
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    yield wandb
    wandb.finish()  # a run left open would be reused by the next WandbLogger in this process
    wandb.teardown()  # and its service, stopped, has closed every run file


def _wandb_records(path: Path) -> Iterator[object]:
    """The protobuf records of a .wandb file: a 7-byte header (":W&B", magic, version), then
    LevelDB-log chunks (crc32, length, type; full=1, first=2, middle=3, last=4) in 32 KiB
    blocks. wandb ships no reader for offline runs; this is the format its service writes."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, payload = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: zero padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            payload = b""
            yield record


def _wandb_run(folder: Path) -> tuple[str, dict[str, list[float]]]:
    """The run id and the history (metric -> values in order) of one offline run folder."""
    (path,) = folder.glob("run-*.wandb")
    run_id, history, kinds = None, {}, []
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        kinds.append(kind)
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                history.setdefault(key, []).append(json.loads(item.value_json))
    found = f"{path} ({path.stat().st_size} bytes) holds records {sorted(set(kinds))}"
    assert run_id is not None and "exit" in kinds, f"no run or no exit record: {found}"
    return run_id, history


def test_wandb_logger_records_each_fit_in_a_run_of_its_own(
    image_tree: Path, tmp_path: Path, wandb_offline: ModuleType
) -> None:
    runs, save_dir = tmp_path / "runs", tmp_path / "tracker"
    wandb = [
        *_readme_args(WANDB_LINE),
        "--trainer.logger.offline=true",
        f"--trainer.logger.save_dir={save_dir}",
    ]
    for _ in range(2):
        _fit(image_tree, runs, *wandb)
        # As vit-train's exit does (wandb's atexit hook): finish() alone returns before wandb's
        # service has written the run file (seen: 7 bytes, the header), teardown() waits for it;
        # and the next fit starts a run of its own (an open run would be reused).
        wandb_offline.finish()
        wandb_offline.teardown()

    folders = sorted((save_dir / "wandb").glob("offline-run-*"), key=lambda p: p.stat().st_mtime)
    assert len(folders) == 2, folders
    for n, folder in enumerate(folders):
        run_id, history = _wandb_run(folder)
        assert not run_id.startswith("version_")  # W&B's own id, not the CSV folder's name
        assert folder.name.endswith(run_id)
        csv_run = runs / "tiny" / f"version_{n}"  # CSV and TensorBoard still share version_N
        assert list(csv_run.glob("events.out.tfevents.*"))
        assert (csv_run / "checkpoints" / "last.ckpt").is_file()  # the fit ran to its end
        for key in ("val/acc", "val/loss", "train/loss_step"):
            assert history[key] == pytest.approx(_csv_metric(csv_run, key)), key
    assert _wandb_run(folders[0])[0] != _wandb_run(folders[1])[0]


# ---- MLflow, a local SQLite store ------------------------------------------------------------


@pytest.fixture
def mlflow_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """mlflow.tracking with no usage reports sent and $HOME (its installation id) under tmp_path."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    _home_in(tmp_path / "home", monkeypatch)
    return pytest.importorskip("mlflow.tracking")


def test_mlflow_logger_records_each_fit_in_a_run_of_its_own(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_local: ModuleType
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # the README's sqlite:///mlflow.db is relative: cwd/mlflow.db
    runs = tmp_path / "runs"
    mlflow = [*_readme_args(MLFLOW_LINE), "--trainer.logger.experiment_name=vit"]
    _fit(image_tree, runs, *mlflow)
    _fit(image_tree, runs, *mlflow)

    assert (cwd / "mlflow.db").is_file()
    client = mlflow_local.MlflowClient("sqlite:///mlflow.db")
    experiment = client.get_experiment_by_name("vit")
    found = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    assert len(found) == 2
    assert len({run.info.run_id for run in found}) == 2  # two fits, two runs
    for n, run in enumerate(found):
        assert run.info.status == "FINISHED"
        assert not run.info.run_id.startswith("version_")
        csv_run = runs / "tiny" / f"version_{n}"
        assert (csv_run / "checkpoints" / "last.ckpt").is_file()
        for key in ("val/acc", "val/loss", "train/loss_step"):
            history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
            assert [m.value for m in history] == pytest.approx(_csv_metric(csv_run, key)), key
    assert not (cwd / "mlruns").exists()  # MLflow's default save_dir, unused: not made


# ---- the README's recipe ---------------------------------------------------------------------


def test_the_readme_s_command_appends_the_tracker_to_the_recipe_s_loggers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wandb_offline: ModuleType
) -> None:
    monkeypatch.chdir(tmp_path)  # the recipe's runs/ goes there
    args = ["-c", str(REPO / "experiments" / "cpu60.yaml"), *_readme_args(WANDB_LINE)]
    cli = ViTCLI(ViTClassifier, CIFAR10DataModule, args=args, run=False)
    csv_logger, tensorboard, wandb = cli.trainer.loggers
    assert type(wandb).__name__ == "WandbLogger"
    assert csv_logger.log_dir == tensorboard.log_dir == str(Path("runs/cpu60/version_0"))
    assert wandb.name == "vit" and wandb.version is None  # the project; W&B picks the run id


# ---- TensorBoard's HParams tab ---------------------------------------------------------------


def test_tensorboard_s_hp_metric_is_each_validation_s_accuracy(
    image_tree: Path, tmp_path: Path
) -> None:
    """The HParams tab compares runs by hp_metric's latest value: Lightning logs only a -1
    placeholder at step 0; vit-train logs val/acc there after each validation."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = tmp_path / "runs"
    train_main(train_args(image_tree, runs, "--trainer.log_every_n_steps=1"))  # two epochs
    events = EventAccumulator(str(runs / "tiny" / "version_0"))
    events.Reload()
    accuracy = {e.step: e.value for e in events.Scalars("val/acc")}
    hp_metric = events.Scalars("hp_metric")
    assert len(accuracy) == 2 and 0 not in accuracy  # one validation an epoch
    assert {e.step: e.value for e in hp_metric} == {0: -1.0, **accuracy}
    assert hp_metric[-1].value == accuracy[max(accuracy)]  # the value the tab shows
    with (runs / "tiny" / "version_0" / "metrics.csv").open() as f:
        assert "hp_metric" not in next(csv.reader(f))  # no copy of val/acc there


def test_hp_metric_of_a_new_fit_starts_afresh_with_the_same_callback(tmp_path: Path) -> None:
    """A callback reused by a second fit that is not a resume carries no value into it."""
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.helpers import quiet_trainer, random_loader, tiny_classifier
    from vit.train.callbacks import HpMetric

    hp = HpMetric()
    for version in (0, 1):
        logger = TensorBoardLogger(tmp_path, name="tb", version=version)
        trainer = quiet_trainer(tmp_path, max_epochs=1, logger=logger, callbacks=[hp])
        trainer.fit(tiny_classifier(), random_loader(), random_loader(16))
    events = EventAccumulator(str(tmp_path / "tb" / "version_1"))
    events.Reload()
    accuracy = {e.step: e.value for e in events.Scalars("val/acc")}
    assert {e.step: e.value for e in events.Scalars("hp_metric")} == {0: -1.0, **accuracy}
