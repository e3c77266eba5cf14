"""`--data.val_size 0`: a fit on the whole training split, without validation, whose
`--test_after_fit` scores the last checkpoint; and the clear errors around it."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from tests.helpers import tiny_classifier, tiny_datamodule, train_args
from vit.commands.evaluate import evaluate_main, run_evaluate
from vit.commands.train import ViTCLI, train_main
from vit.train.datamodule import CIFAR10DataModule
from vit.train.module import ViTClassifier

TRAIN_IMAGES = 3 * 12  # image_tree: 3 classes, 12 training images each


def _whole_split_args(data_dir: Path, runs: Path, *extra: str) -> list[str]:
    args = train_args(data_dir, runs, *extra)
    args[args.index("--data.val_size=6")] = "--data.val_size=0"
    return args


def test_a_fit_on_the_whole_split_tests_its_last_checkpoint(
    image_tree: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    train_main(_whole_split_args(image_tree, runs, "--test_after_fit=true"))
    run = runs / "tiny" / "version_0"
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert not any(row.get("val/acc") for row in rows)  # no validation ran
    saved = yaml.safe_load((run / "config.yaml").read_text())  # what the fit ran with
    assert saved["trainer"]["limit_val_batches"] == 0
    assert saved["trainer"]["callbacks"][0]["init_args"]["monitor"] is None
    tested = [float(row["test/acc"]) for row in rows if row.get("test/acc")]
    assert len(tested) == 1  # --test_after_fit ran, on a checkpoint (not "best": none exists)

    last = run / "checkpoints" / "last.ckpt"
    # the ModelCheckpoint ranked by val/acc kept saving last.ckpt, and ranked nothing
    assert [p.name for p in last.parent.iterdir()] == ["last.ckpt"]
    ckpt = torch.load(last, weights_only=True, map_location="cpu")
    # every training image was trained on: two epochs of whole batches of 8 out of all 36
    assert ckpt["global_step"] == 2 * (TRAIN_IMAGES // 8)
    # what the test after fit scored is last.ckpt: vit-evaluate finds the same fraction right
    # of its 12 test images (k/12 in float32: within 1e-7 of the exact fraction)
    result = run_evaluate([str(last), "--no-flip", "--output-dir", str(tmp_path / "eval")])
    assert result["num_images"] == 12 and tested[0] == pytest.approx(result["top1"], abs=1e-6)

    # its validation split is empty: vit-evaluate says so and what to score instead
    with pytest.raises(ValueError, match=r"whole training split \(data.val_size 0\).*--split test"):
        run_evaluate([str(last), "--split", "val", "--output-dir", str(tmp_path / "val")])


def test_the_command_line_says_what_a_fit_without_validation_changes(
    image_tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stop = (
        '[{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": '
        '{"monitor": "val/acc", "mode": "max", "save_last": true}}, '
        '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": '
        '{"monitor": "val/acc", "mode": "max"}}, '
        '{"class_path": "lightning.pytorch.callbacks.EarlyStopping", "init_args": '
        '{"monitor": "val/loss"}}, '
        '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": '
        '{"monitor": "train/loss_step", "save_top_k": 2}}]'
    )
    args = _whole_split_args(image_tree, tmp_path / "runs")
    at = next(i for i, a in enumerate(args) if a.startswith("--trainer.callbacks="))
    args[at] = f"--trainer.callbacks={stop}"  # in place of train_args' list
    with caplog.at_level("INFO"):
        cli = ViTCLI(ViTClassifier, CIFAR10DataModule, args=args[1:], run=False)
    trainer = cli.trainer
    assert trainer.limit_val_batches == 0 and trainer.num_sanity_val_steps == 0
    assert not any(isinstance(c, EarlyStopping) for c in trainer.callbacks)
    checkpoints = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
    # the one that saved last.ckpt keeps it, unranked; the one that only ranked by val/acc is
    # gone; one ranked by a training metric is left as it was
    assert [(c.monitor, c.save_top_k, c.save_last) for c in checkpoints] == [
        (None, 0, True),
        ("train/loss_step", 2, None),
    ]
    said = caplog.text
    assert "data.val_size 0: training on the whole training split, without validation" in said
    assert "ModelCheckpoint(monitor=val/acc) saves last.ckpt only" in said
    assert "ModelCheckpoint(monitor=val/acc) left out" in said
    assert "EarlyStopping(monitor=val/loss) left out" in said


def test_a_validated_fit_is_left_as_it_was(image_tree: Path, tmp_path: Path) -> None:
    args = train_args(image_tree, tmp_path / "runs")
    cli = ViTCLI(ViTClassifier, CIFAR10DataModule, args=args[1:], run=False)
    assert cli.trainer.limit_val_batches == 1.0
    (checkpoint,) = [c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)]
    assert (checkpoint.monitor, checkpoint.save_top_k) == ("val/acc", 1)


def test_nothing_to_score_is_refused_before_the_fit(image_tree: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    args = _whole_split_args(
        image_tree,
        runs,
        "--test_after_fit=true",
        "--trainer.enable_checkpointing=false",
    )
    args.remove(next(a for a in args if a.startswith("--trainer.callbacks=")))
    with pytest.raises(ValueError, match="enable_checkpointing is false: nothing would be saved"):
        train_main(args)
    assert not (runs / "tiny").exists()  # refused before any folder or step


def test_vit_train_validate_refuses_an_empty_validation_split(
    image_tree: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    args = _whole_split_args(image_tree, runs)
    args[0] = "validate"
    with pytest.raises(ValueError, match=r"data.val_size is 0: there is none.*vit-evaluate"):
        train_main(args)
    assert not (runs / "tiny").exists()  # refused before any folder was made

    # a checkpoint fitted on the whole split, validated with a held-out split in the config:
    # every image of that split was trained on, so it is refused too
    train_main(_whole_split_args(image_tree, runs, "--trainer.max_epochs=1"))
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    held_out = train_args(image_tree, runs, f"--ckpt_path={last}")
    held_out[0] = "validate"
    with pytest.raises(ValueError, match=r"trained on the whole training split.*vit-train test"):
        train_main(held_out)
    assert not (runs / "tiny" / "version_1").exists()


def test_vit_train_validate_refuses_a_split_the_checkpoint_trained_on(
    image_tree: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    train_main(train_args(image_tree, runs, "--trainer.max_epochs=1"))  # 6 held out, seed 0
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"

    def validate(*extra: str) -> list[str]:
        args = train_args(image_tree, runs, f"--ckpt_path={last}", *extra)
        args[0] = "validate"
        return args

    # another seed draws another split: most of its images were trained on
    with pytest.raises(ValueError, match=r"held out 6 images drawn by seed 0.*--data.split_seed 0"):
        train_main(validate("--data.seed=1"))
    # the same permutation, one image more than the fit held out: that image was trained on
    with pytest.raises(ValueError, match=r"split is 7 images drawn by seed 0"):
        train_main(validate("--data.val_size=7"))
    assert not (runs / "tiny" / "version_1").exists()  # refused before any folder was made

    # split_seed pins the fit's split under another seed; fewer images are a subset of it
    train_main(validate("--data.seed=1", "--data.split_seed=0", "--data.val_size=5"))
    rows = list(csv.DictReader((runs / "tiny" / "version_1" / "metrics.csv").open()))
    assert [row["val/acc"] for row in rows if row.get("val/acc")]  # it validated


def test_trainer_validate_from_python_refuses_an_empty_validation_split(
    image_tree: Path, tmp_path: Path
) -> None:
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = tiny_classifier(network={"num_classes": 3})
    cache = str(tmp_path / "cache")
    whole = tiny_datamodule(image_tree, val_size=0, cache_dir=cache)
    with pytest.raises(ValueError, match=r"trainer.validate with data.val_size 0.*trainer.test"):
        trainer.validate(model, datamodule=whole, verbose=False)
    # with images held out the same call scores them
    (scores,) = trainer.validate(model, datamodule=tiny_datamodule(image_tree, cache_dir=cache))
    assert 0.0 <= scores["val/acc"] <= 1.0


def test_vit_evaluate_reports_the_empty_validation_split_without_a_traceback(
    image_tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    train_main(_whole_split_args(image_tree, runs, "--trainer.max_epochs=1"))
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    with pytest.raises(SystemExit) as stop:
        evaluate_main([str(last), "--split", "val", "--output-dir", str(tmp_path / "val")])
    assert stop.value.code == 2
    assert "no validation split to score" in capsys.readouterr().err


def test_with_lightnings_default_checkpoint_the_test_scores_its_latest(
    image_tree: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    args = _whole_split_args(image_tree, runs, "--test_after_fit=true")
    args.remove(next(a for a in args if a.startswith("--trainer.callbacks=")))
    train_main(args)  # no checkpoint callback configured: Lightning's own keeps the latest
    run = runs / "tiny" / "version_0"
    (kept,) = (run / "checkpoints").iterdir()
    assert kept.name == f"epoch=1-step={2 * (TRAIN_IMAGES // 8)}.ckpt"  # the fit's last step
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    tested = [float(row["test/acc"]) for row in rows if row.get("test/acc")]
    result = run_evaluate([str(kept), "--no-flip", "--output-dir", str(tmp_path / "eval")])
    assert len(tested) == 1 and tested[0] == pytest.approx(result["top1"], abs=1e-6)


def test_exported_weights_keep_the_images_they_held_out(image_tree: Path, tmp_path: Path) -> None:
    """export_safetensors and save_pretrained record the split settings (data_split): their
    weights' validation split is the checkpoint's, not the default one."""
    import vit
    from vit.io.checkpoint import load_checkpoint
    from vit.io.load import export_safetensors, load_model

    runs, cache = tmp_path / "runs", str(tmp_path / "cache")
    extra = ("--trainer.max_epochs=1", "--data.seed=5", "--data.split_seed=3")
    train_main(train_args(image_tree, runs, *extra))
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    trained = CIFAR10DataModule.from_checkpoint(load_checkpoint(last), cache_dir=cache)
    trained.setup("validate")
    default = CIFAR10DataModule(data_dir=str(image_tree), cache_dir=cache, val_size=6)
    default.setup("validate")  # what weights that record no split fall back to
    assert not torch.equal(trained.val_dataset.images, default.val_dataset.images)
    single = export_safetensors(last, tmp_path / "m.safetensors")
    for weights in (single, vit.save_pretrained(last, tmp_path / "folder")):
        info = load_model(weights)[1]
        split = {k: info["datamodule_hyper_parameters"][k] for k in ("val_size", "seed")}
        assert split == {"val_size": 6, "seed": 5}
        assert info["datamodule_hyper_parameters"]["split_seed"] == 3
        dm = CIFAR10DataModule.from_checkpoint(info, data_dir=str(image_tree), cache_dir=cache)
        dm.setup("validate")
        assert torch.equal(dm.val_dataset.images, trained.val_dataset.images), weights


def test_exported_weights_of_a_whole_split_fit_refuse_the_validation_split(
    image_tree: Path, tmp_path: Path
) -> None:
    import vit
    from vit.io.load import export_safetensors

    runs = tmp_path / "runs"
    train_main(_whole_split_args(image_tree, runs, "--trainer.max_epochs=1"))
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    single = export_safetensors(last, tmp_path / "m.safetensors")
    for weights in (single, vit.save_pretrained(last, tmp_path / "folder")):
        argv = [str(weights), "--split", "val", "--data-dir", str(image_tree)]
        with pytest.raises(ValueError, match=r"whole training split \(data.val_size 0\)"):
            run_evaluate([*argv, "--output-dir", str(tmp_path / "val")])
        assert not (tmp_path / "val").exists()  # refused before anything was written


def test_a_damaged_data_split_entry_is_named(image_tree: Path, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    from vit.io.load import export_safetensors, load_model

    runs = tmp_path / "runs"
    train_main(train_args(image_tree, runs, "--trainer.max_epochs=1"))
    good = export_safetensors(
        runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt", tmp_path / "g.safetensors"
    )
    with safe_open(str(good), "pt") as f:
        state, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    for bad in ("{not json", '{"val_size": 6, "data_dir": "/elsewhere"}', "[6]"):
        save_file(
            state, str(tmp_path / "bad.safetensors"), metadata={**metadata, "data_split": bad}
        )
        with pytest.raises(ValueError, match="data_split=.*re-export the weights"):
            load_model(tmp_path / "bad.safetensors")
