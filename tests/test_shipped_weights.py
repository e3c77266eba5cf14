"""The weights shipped in the package score on CIFAR-10's test split what their metadata says."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CIFAR_ARCHIVE
from vit.pretrained import PRETRAINED, resolve

NAME = "vit-tiny-d4-cifar10-cpu60"


def metadata(name: str) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(resolve(name)), framework="pt") as f:
        return f.metadata()


def test_the_shipped_weights_say_how_they_were_made() -> None:
    meta = metadata(NAME)
    assert NAME in PRETRAINED
    assert meta["recipe"] == "experiments/cpu60.yaml" and meta["weights"] == "average"
    config = json.loads(meta["config"])
    assert (config["depth"], config["embed_dim"], config["spt"], config["lsa"]) == (
        4,
        192,
        True,
        True,
    )
    assert json.loads(meta["class_names"])[:2] == ["airplane", "automobile"]
    assert resolve(NAME).stat().st_size < 8_000_000  # a few MB


@pytest.mark.skipif(not CIFAR_ARCHIVE.is_file(), reason=f"needs the JPEG copy at {CIFAR_ARCHIVE}")
def test_the_shipped_weights_score_their_recorded_test_accuracy(tmp_path) -> None:
    from vit.cli import run_evaluate

    result = run_evaluate(
        [NAME, "--data-dir", str(CIFAR_ARCHIVE), "--cache-dir", str(tmp_path / "cache"),
         "--output-dir", str(tmp_path / "eval")]
    )  # fmt: skip
    assert result["num_images"] == 10_000
    assert abs(result["top1"] - float(metadata(NAME)["test_top1"])) <= 0.0005  # 0.05 points
