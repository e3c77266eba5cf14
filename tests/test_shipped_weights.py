"""The weights shipped in the package score on CIFAR-10's test split what the run they came from
recorded (experiments/record/results/<run>/metrics_test.json), and their metadata says the same."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import CIFAR_ARCHIVE, SHIPPED, SHIPPED_RUN, recorded_test_metrics
from vit.io.pretrained import PRETRAINED, resolve


def metadata(name: str) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(resolve(name)), framework="pt") as f:
        return f.metadata()


def test_the_shipped_weights_say_how_they_were_made() -> None:
    meta = metadata(SHIPPED)
    assert SHIPPED in PRETRAINED
    assert meta["recipe"] == "experiments/cpu60.yaml" and meta["weights"] == "average"
    config = json.loads(meta["config"])
    assert (config["depth"], config["embed_dim"], config["spt"], config["lsa"]) == (
        4,
        192,
        True,
        True,
    )
    assert json.loads(meta["class_names"])[:2] == ["airplane", "automobile"]
    assert resolve(SHIPPED).stat().st_size < 8_000_000  # a few MB


def test_the_metadata_names_the_run_and_its_recorded_test_accuracy() -> None:
    meta, run = metadata(SHIPPED), recorded_test_metrics()
    assert Path(meta["results"]).name == SHIPPED_RUN.name  # its folder (whose parent has moved)
    assert (run["split"], run["num_images"], run["flip"]) == ("test", 10_000, False)
    assert run["weights"] == meta["weights"] == "average"
    assert float(meta["test_top1"]) == run["top1"]  # 0.8828: swapped metadata would differ


def test_the_shipped_weights_score_their_recorded_test_accuracy(
    tmp_path: Path, cifar10_cache: Path
) -> None:
    from vit.commands.evaluate import run_evaluate

    result = run_evaluate(
        [SHIPPED, "--data-dir", str(CIFAR_ARCHIVE), "--cache-dir", str(cifar10_cache),
         "--output-dir", str(tmp_path / "eval")]
    )  # fmt: skip
    assert result["num_images"] == 10_000
    top1 = recorded_test_metrics()["top1"]
    assert abs(result["top1"] - top1) <= 0.0005  # 0.05 points of the stored run's
