"""Weights by name: a shipped name resolves to its file, and load_model, vit-evaluate and
vit-visualize take the name (or a .safetensors) as they take a .ckpt. Tested on a tiny exported
model put in the registry's place, so no test depends on the shipped file itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.helpers import REPO, TINY, TINY_DATA_CLASSES, write_safetensors
from vit.commands.evaluate import default_eval_dir, run_evaluate
from vit.commands.visualize import run_visualize
from vit.io import pretrained
from vit.io.load import export_safetensors, load_model, weights_kind
from vit.io.pretrained import PRETRAINED, WeightsNotFoundError, resolve
from vit.model.vision_transformer import VisionTransformer

NAME = "tiny-test-weights"
EXTRA = {"recipe": "experiments/quick.yaml", "test_top1": "0.3333", "trained_on": "a test"}


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> VisionTransformer:
    """A tiny 3-class model, saved and registered under NAME in a stand-in weights folder."""
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "num_classes": 3}).eval()
    folder = tmp_path / "weights"
    folder.mkdir()
    write_safetensors(
        model, folder / "tiny.safetensors", class_names=list(TINY_DATA_CLASSES), **EXTRA
    )
    monkeypatch.setattr(pretrained, "WEIGHTS_DIR", folder)
    monkeypatch.setitem(PRETRAINED, NAME, "tiny.safetensors")
    return model


def test_names_paths_and_unknowns_resolve(shipped, tmp_path) -> None:
    assert resolve(NAME) == tmp_path / "weights" / "tiny.safetensors"
    assert resolve(tmp_path / "weights") == tmp_path / "weights"  # an existing path: itself
    with pytest.raises(WeightsNotFoundError) as err:
        resolve("vit-tiny-nothing")
    assert isinstance(err.value, ValueError) and isinstance(err.value, FileNotFoundError)
    message = str(err.value)
    assert "'vit-tiny-nothing' does not exist" in message
    assert NAME in message and "vit-tiny-d4-cifar10-cpu60" in message
    # every kind of weights the loaders take is named: a user may have meant any of them
    for kind in (".ckpt", ".safetensors", "folder save_pretrained wrote", "hf-hub:owner/name"):
        assert kind in message, kind


def test_a_registered_name_whose_file_is_absent_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(pretrained, "WEIGHTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="missing from this install"):
        resolve("vit-tiny-d4-cifar10-cpu60")


def test_the_shipped_files_are_package_data() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert 'vit = ["io/weights/*.safetensors", "io/weights/*.md", "maps/assets/*"]' in text
    assert all(name.endswith(".safetensors") for name in PRETRAINED.values())
    assert pretrained.WEIGHTS_DIR.parent == Path(pretrained.__file__).resolve().parent


def test_load_model_takes_a_name_or_a_safetensors_path(shipped, tmp_path) -> None:
    for source in (NAME, tmp_path / "weights" / "tiny.safetensors"):
        model, info = load_model(source)
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            assert torch.equal(model(x), shipped(x))
        assert info["hyper_parameters"] == {
            "class_names": list(TINY_DATA_CLASSES),
            "test_flip": False,
        }
        assert info["datamodule_hyper_parameters"] == {"image_size": 32}
        assert {k: info["safetensors_metadata"][k] for k in EXTRA} == EXTRA
        assert weights_kind(info) == "live"  # nothing recorded: plain weights
    _, info = load_model(
        write_safetensors(
            shipped,
            tmp_path / "ema.safetensors",
            class_names=list(TINY_DATA_CLASSES),
            weights="average",
        )
    )
    assert weights_kind(info) == "average"  # as export_safetensors recorded it
    with pytest.raises(ValueError, match="one set of plain weights"):
        load_model(NAME, weights="average")


def test_vit_evaluate_and_vit_visualize_take_the_name(shipped, image_tree, tmp_path) -> None:
    out = tmp_path / "eval"
    result = run_evaluate(
        [
            NAME,
            "--data-dir",
            str(image_tree),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--output-dir",
            str(out),
        ]  # fmt: skip
    )
    assert result["num_images"] == 12 and result["checkpoint"] == NAME
    assert json.loads((out / "metrics_test.json").read_text())["top1"] == result["top1"]
    assert default_eval_dir(Path(NAME)) == Path("eval") / NAME
    pictures = tmp_path / "p.png"
    from PIL import Image

    Image.new("RGB", (32, 32), (10, 120, 30)).save(pictures)
    paths = run_visualize([NAME, "--images", str(pictures), "--output-dir", str(tmp_path / "a")])
    assert sorted(p.name for p in paths) == [
        "heads_layer1_0.png",
        "layers_heads_0.png",
        "rollout.png",
    ]


def test_export_records_the_weights_and_extra_metadata(tiny_checkpoint, tmp_path) -> None:
    out = export_safetensors(tiny_checkpoint, tmp_path / "t.safetensors", metadata=EXTRA)
    with safe_open(str(out), framework="pt") as f:
        meta = f.metadata()
    assert {k: meta[k] for k in EXTRA} == EXTRA and meta["weights"] == "live"
    _, info = load_model(out)
    assert info["safetensors_metadata"] == meta
    for bad in ({"config": "{}"}, {"test_top1": 0.5}):
        with pytest.raises(ValueError, match="str -> str"):
            export_safetensors(tiny_checkpoint, tmp_path / "u.safetensors", metadata=bad)
