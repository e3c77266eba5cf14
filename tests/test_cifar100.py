"""CIFAR-100 end to end: a small archive in the official format trains with its own mean and std,
which travel with the weights (checkpoint, .safetensors, save_pretrained folder) and are what
vit-evaluate, vit-predict, the map commands and a fine-tune normalize with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

import vit
from tests.helpers import train_args, write_cifar100, write_image_tree
from vit.commands import evaluate, predict, visualize
from vit.commands.evaluate import run_evaluate
from vit.commands.predict import run_predict
from vit.commands.train import train_main
from vit.data.cifar100_source import load_cifar100
from vit.data.datasets import (
    CIFAR10_NORMALIZATION,
    Normalization,
    channel_statistics,
    checked_normalization,
    preprocess,
    recorded_normalization,
)
from vit.io.checkpoint import load_checkpoint
from vit.io.load import export_safetensors, load_model
from vit.train.datamodule import CIFAR10DataModule


def test_channel_statistics_match_a_float64_reference() -> None:
    images = torch.randint(0, 256, (7, 3, 5, 4), dtype=torch.uint8, generator=torch.Generator())
    images[:, 2] = 255  # a constant channel: mean 1, std 0
    pixels = images.double() / 255
    got = channel_statistics(images)
    # exact integer sums, then rounded to 6 decimals: within half a unit of the 6th decimal
    for ours, ref in (
        (got.mean, pixels.mean((0, 2, 3))),
        (got.std, pixels.std((0, 2, 3), correction=0)),
    ):
        assert (torch.tensor(ours, dtype=torch.float64) - ref).abs().max() <= 5e-7 + 1e-12
    assert got.mean[2] == 1.0 and got.std[2] == 0.0
    with pytest.raises(ValueError, match="expects uint8 images"):
        channel_statistics(pixels)


@pytest.mark.parametrize(
    ("mean", "std"),
    [([0.5, 0.5], [0.2, 0.2, 0.2]), ([0.5] * 3, [0.2, 0.0, 0.2]), ([0.5, "x", 0.5], [0.2] * 3),
     ([0.5, float("nan"), 0.5], [0.2] * 3), (None, [0.2] * 3)],
)  # fmt: skip
def test_bad_normalizations_are_named(mean: object, std: object) -> None:
    with pytest.raises(ValueError, match="expected three finite numbers each"):
        checked_normalization(mean, std, where="model.mean and model.std")


def test_a_checkpoint_without_a_recorded_normalization_reads_as_cifar10s() -> None:
    assert recorded_normalization({"hyper_parameters": {}}) == CIFAR10_NORMALIZATION
    recorded = {"hyper_parameters": {"mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6]}}
    assert recorded_normalization(recorded) == Normalization((0.1, 0.2, 0.3), (0.4, 0.5, 0.6))
    with pytest.raises(ValueError, match="checkpoint's hyper_parameters"):
        recorded_normalization({"hyper_parameters": {"mean": [0.1, 0.2, 0.3]}})  # no std


def test_coarse_labels_and_bad_options(tmp_path: Path) -> None:
    root = write_cifar100(tmp_path / "data", num_train=30, num_test=10)
    dm = CIFAR10DataModule(source="cifar100", data_dir=str(root), cifar100_labels="coarse")
    dm.setup("test")
    assert dm.num_classes == 20 and dm.classes[0] == "coarse_00"
    fine = load_cifar100(root, split="test", labels="fine")[1]
    assert torch.equal(dm.test_dataset.labels, fine // 5)  # the writer's superclasses
    with pytest.raises(ValueError, match="applies to `data.source: cifar100` only"):
        CIFAR10DataModule(source="folder", cifar100_labels="coarse")
    with pytest.raises(ValueError, match="'fine' .100 classes. or 'coarse'"):
        CIFAR10DataModule(source="cifar100", cifar100_labels="superclass")
    with pytest.raises(ValueError, match="'cifar10' or 'cifar100'"):
        CIFAR10DataModule(source="cifar1000")


@pytest.fixture(scope="module")
def cifar100_fit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny fit on a generated CIFAR-100 archive (the .tar.gz, as the release ships)."""
    root = tmp_path_factory.mktemp("cifar100")
    archive = write_cifar100(root / "data", num_train=48, num_test=20, archive=True)
    runs = root / "runs"
    extra = ("--data.source=cifar100", "--model.network.num_classes=100", "--trainer.max_epochs=1")
    train_main(train_args(archive, runs, *extra))
    ckpt = next((runs / "tiny").rglob("last.ckpt"))
    released = next((runs / "cache").rglob("cifar-100-python")).parent  # the extracted archive
    return {"root": root, "ckpt": ckpt, "released": released}


def test_a_cifar100_fit_records_its_own_mean_and_std(cifar100_fit: dict[str, Path]) -> None:
    ckpt = load_checkpoint(cifar100_fit["ckpt"])
    images = load_cifar100(cifar100_fit["released"], split="train")[0]
    own = channel_statistics(images)  # the whole training split, as the data module computes
    assert own != CIFAR10_NORMALIZATION
    assert recorded_normalization(ckpt) == own
    assert ckpt["hyper_parameters"]["class_names"][:2] == ["fine_00", "fine_01"]
    assert ckpt["datamodule_hyper_parameters"]["source"] == "cifar100"
    dm = CIFAR10DataModule.from_checkpoint(ckpt)  # what vit-evaluate rebuilds
    dm.setup("test")
    assert dm.normalization == own  # computed again from the training split, for the test only
    images, labels = dm.test_dataset.images[:4], dm.test_dataset.labels[:4]
    batch = dm.on_after_batch_transfer((images, labels), 0)[0]  # what the model is fed
    assert torch.equal(batch, preprocess(images, own))
    assert not torch.allclose(batch, preprocess(images))  # CIFAR-10's would differ


def test_evaluate_predict_and_the_maps_normalize_as_the_model_was_trained(
    cifar100_fit: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = recorded_normalization(load_checkpoint(cifar100_fit["ckpt"]))
    seen: list[Normalization] = []

    def spy(real):  # noqa: ANN001, ANN202
        def preprocess(images, normalization=CIFAR10_NORMALIZATION):  # noqa: ANN001, ANN202
            seen.append(normalization)
            return real(images, normalization)

        return preprocess

    for module in (evaluate, predict):
        monkeypatch.setattr(module, "preprocess", spy(module.preprocess))
    result = run_evaluate([str(cifar100_fit["ckpt"]), "--output-dir", str(tmp_path / "eval")])
    assert result["num_images"] == 20 and result["normalization"]["mean"] == own.mean
    assert seen and set(seen) == {own}
    moved = [str(cifar100_fit["ckpt"]), "--data-dir", str(cifar100_fit["released"])]
    moved += ["--output-dir", str(tmp_path / "eval2")]  # the data named again: still CIFAR-100
    assert run_evaluate(moved)["top1"] == result["top1"]
    pictures = write_image_tree(tmp_path / "pictures", train_per_class=1, test_per_class=0)
    seen.clear()
    out = run_predict([str(cifar100_fit["ckpt"]), str(pictures), "--batch-size", "2"])
    assert len(out["predictions"]) == 3 and set(seen) == {own}
    assert str(list(own.mean)) in out["preprocess"]
    ns = visualize._parser().parse_args(
        [str(cifar100_fit["ckpt"]), "--images", *map(str, sorted(pictures.rglob("*.png")))]
    )
    assert visualize.model_and_images(ns, ns.checkpoint)[4] == own  # vit-visualize/explore/inspect


def test_the_mean_and_std_travel_with_the_weights(
    cifar100_fit: dict[str, Path], tmp_path: Path
) -> None:
    own = recorded_normalization(load_checkpoint(cifar100_fit["ckpt"]))
    single = export_safetensors(cifar100_fit["ckpt"], tmp_path / "m.safetensors")
    assert recorded_normalization(load_model(single)[1]) == own
    # and the dataset: evaluated without --data-dir, the weights look for CIFAR-100, not CIFAR-10
    dm = CIFAR10DataModule.from_checkpoint(load_model(single)[1])
    assert (dm.hparams.source, dm.hparams.val_size) == ("cifar100", 6)
    folder = vit.save_pretrained(
        cifar100_fit["ckpt"], tmp_path / "folder", metadata={"test_top1": "0.0125"}
    )
    config = json.loads((folder / "config.json").read_text())
    assert config["mean"] == list(own.mean) and config["std"] == list(own.std)
    assert recorded_normalization(load_model(folder)[1]) == own
    card = (folder / "README.md").read_text()
    assert f"its training images' mean ({own.mean[0]:.4f}" in card
    header = yaml.safe_load(card.split("---\n")[1])
    assert header["datasets"] == ["cifar100"]  # from the checkpoint's data settings
    assert header["model-index"][0]["results"][0]["dataset"]["type"] == "cifar100"
    model, _ = vit.load_model(cifar100_fit["ckpt"])
    model.save_pretrained(tmp_path / "method")  # the Hub method carries them too
    assert recorded_normalization(load_model(tmp_path / "method")[1]) == own


def test_a_fine_tune_normalizes_as_its_source_was_trained(
    cifar100_fit: dict[str, Path], tmp_path: Path
) -> None:
    own = recorded_normalization(load_checkpoint(cifar100_fit["ckpt"]))
    tree = write_image_tree(tmp_path / "tiny")  # a folder source: CIFAR-10's mean on a fresh fit
    runs = tmp_path / "runs"
    start = f"--model.init_from={cifar100_fit['ckpt']}"
    train_main(train_args(tree, runs, start, "--trainer.max_epochs=1"))
    tuned = load_checkpoint(next(runs.rglob("last.ckpt")))
    assert recorded_normalization(tuned) == own


def test_cifar100_given_to_the_cifar10_search_says_which_source_to_set(tmp_path: Path) -> None:
    root = write_cifar100(tmp_path / "data", num_train=10, num_test=5)
    for path in (root, root / "cifar-100-python"):
        with pytest.raises(ValueError, match="CIFAR-100's release.*--data.source cifar100"):
            CIFAR10DataModule(data_dir=str(path)).locate()


def test_the_onnx_file_states_the_models_own_mean_and_std(
    cifar100_fit: dict[str, Path], tmp_path: Path
) -> None:
    onnx = pytest.importorskip("onnx")
    from vit.commands.export import run_export

    own = recorded_normalization(load_checkpoint(cifar100_fit["ckpt"]))
    out = run_export([str(cifar100_fit["ckpt"]), "--output", str(tmp_path / "m.onnx")])
    props = {p.key: p.value for p in onnx.load(str(out["output"])).metadata_props}
    assert json.loads(props["mean"]) == list(own.mean)
    assert json.loads(props["std"]) == list(own.std)
