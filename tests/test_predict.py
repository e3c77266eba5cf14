"""`vit-predict`: the top-k classes of image files and folders, each probability equal to the
model's softmax on the image resized and normalised by hand; unreadable images named and skipped
(exit 1), bad arguments refused before anything runs (exit 2); CSV and JSON outputs."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2.functional import resize

from tests.helpers import TINY, forward_sums, sum_tol, write_safetensors
from vit.commands.predict import predict_main, run_predict
from vit.data.datasets import CIFAR10_MEAN, CIFAR10_STD
from vit.io.hub import save_pretrained
from vit.model.vision_transformer import VisionTransformer

NAMES = ["apple", "boat", "cloud"]
F32 = torch.float32


def _probability_tol(model: VisionTransformer) -> float:
    """Probabilities (<= 1) of two forwards whose products take other kernels (other batch
    sizes): every sum of the forward in another order, then a softmax of 3."""
    return sum_tol(F32, forward_sums(model) + 2 * 3)


@pytest.fixture
def weights(tmp_path: Path) -> tuple[VisionTransformer, Path]:
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "num_classes": 3}).eval()
    return model, write_safetensors(model, tmp_path / "tiny.safetensors", class_names=NAMES)


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """photos/: a 500x375 JPEG, a 32x32 PNG, an 8x8 grayscale PNG and an RGBA PNG below,
    a text file the folder search skips."""
    rng = np.random.default_rng(0)
    root = tmp_path / "photos"
    (root / "more").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (375, 500, 3), dtype=np.uint8)).save(root / "wide.jpg")
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / "same.png")
    Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(root / "gray.png")
    rgba = rng.integers(0, 256, (40, 24, 4), dtype=np.uint8)
    Image.fromarray(rgba).save(root / "more" / "alpha.png")
    (root / "notes.txt").write_text("not an image")
    return root


@torch.no_grad()
def by_hand(model: VisionTransformer, path: Path) -> torch.Tensor:
    """The model's probabilities for one file: RGB, resized to 32x32, normalised."""
    rgb = np.array(Image.open(path).convert("RGB"))
    image = resize(torch.from_numpy(rgb).permute(2, 0, 1), [32, 32], antialias=True)
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in (CIFAR10_MEAN, CIFAR10_STD))
    return model(((image.float() / 255 - mean) / std)[None]).softmax(-1)[0]


def test_each_image_gets_the_model_s_top_k_with_its_size(weights, photos, capsys) -> None:
    model, path = weights
    argv = [str(path), str(photos), "--top-k", "2", "--batch-size", "3", "--device", "cpu"]
    result = run_predict(argv)  # on the CPU, as by_hand: the numbers agree to float rounding
    got = {Path(r["path"]).name: r for r in result["predictions"]}
    assert sorted(got) == ["alpha.png", "gray.png", "same.png", "wide.jpg"]  # no notes.txt
    for name, row in got.items():
        want = by_hand(model, next(photos.rglob(name)))
        values, indices = want.topk(2)
        assert [t["class"] for t in row["top"]] == [NAMES[i] for i in indices]
        tol = _probability_tol(model)  # by_hand: one image a batch, run_predict: three
        assert [t["probability"] for t in row["top"]] == pytest.approx(values.tolist(), abs=tol)
    assert (got["wide.jpg"]["width"], got["wide.jpg"]["height"]) == (500, 375)
    assert (got["alpha.png"]["width"], got["alpha.png"]["height"]) == (24, 40)
    out = capsys.readouterr().out
    assert "top-1" in out and "top-3" not in out and "wide.jpg" in out
    assert "4 images predicted by" in out
    assert "3 resized (24x40, 500x375, 8x8) -> 32x32 as in training" in out
    assert result["errors"] == []
    run_predict([str(path), str(photos / "same.png"), "--device", "cpu"])
    assert "1 image predicted by" in capsys.readouterr().out  # not "1 images"


def test_batches_and_save_pretrained_folders_predict_alike(weights, photos, tmp_path) -> None:
    model, path = weights
    folder = save_pretrained(model, tmp_path / "hub", class_names=NAMES)
    cpu = ["--device", "cpu"]  # a GPU's TF32 products differ by batch size in the 5th digit
    one = run_predict([str(path), str(photos), "--batch-size", "1", *cpu])["predictions"]
    many = run_predict([str(folder), str(photos), "--batch-size", "64", *cpu])["predictions"]
    assert [r["path"] for r in one] == [r["path"] for r in many]
    for a, b in zip(one, many, strict=True):
        assert [t["class"] for t in a["top"]] == [t["class"] for t in b["top"]]
        assert [t["probability"] for t in a["top"]] == pytest.approx(
            [t["probability"] for t in b["top"]], abs=_probability_tol(model)
        )


def test_an_unreadable_image_is_named_and_the_others_are_predicted(
    weights, photos, tmp_path, capsys
) -> None:
    (photos / "broken.png").write_bytes(b"\x89PNG but cut short")
    out = tmp_path / "predictions.csv"
    with pytest.raises(SystemExit) as exit_:
        predict_main([str(weights[1]), str(photos), "--output", str(out)])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "1 of 5 images could not be read" in err and "broken.png" in err
    assert "0x" not in err  # no memory address from the decoder's message
    rows = list(csv.DictReader(out.open()))
    assert [Path(r["path"]).name for r in rows][-1] == "broken.png"
    assert "cannot decode image file" in rows[-1]["error"] and rows[-1]["class_1"] == ""
    good = rows[:-1]
    assert len(good) == 4 and all(r["error"] == "" and r["class_3"] in NAMES for r in good)
    # all 3 classes, written to 6 decimals (half a unit each) from a float32 softmax of 3
    tol = 3 * 0.5e-6 + sum_tol(F32, 2 * 3)
    assert all(abs(sum(float(r[f"probability_{i}"]) for i in (1, 2, 3)) - 1) <= tol for r in good)


def test_json_output_and_top_k_beyond_the_classes(weights, photos, tmp_path, capsys) -> None:
    out = tmp_path / "p.json"
    run_predict([str(weights[1]), str(photos / "same.png"), "--top-k", "5", "--output", str(out)])
    saved = json.loads(out.read_text())
    assert saved["classes"] == NAMES and saved["top_k"] == 3
    assert (
        "resized to 32x32" in saved["preprocess"] and "CIFAR-10 mean and std" in saved["preprocess"]
    )
    assert [len(r["top"]) for r in saved["predictions"]] == [3]
    assert "--top-k 5: the model has 3 classes, all shown" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["PHOTOS/nothing_here.jpg"], "'PHOTOS/nothing_here.jpg' does not exist"),
        (["EMPTY"], "holds no images"),
        (["PIPE"], "'PIPE' is neither an image file nor a folder; pass image files or folders"),
        (["PHOTOS", "--top-k", "0"], "--top-k=0 must be at least 1"),
        (["PHOTOS", "--batch-size", "0"], "--batch-size=0 must be at least 1"),
        (["PHOTOS", "--output", "p.txt"], "name a .csv or .json file"),
        (["PHOTOS", "--device", "tpu"], "expected auto, cpu, cuda or cuda:N"),
    ],
)
def test_bad_arguments_exit_2_before_predicting(
    weights, photos, tmp_path, capsys, args: list[str], expected: str
) -> None:
    (tmp_path / "empty").mkdir()
    os.mkfifo(tmp_path / "pipe")  # there, but neither file nor folder
    swap = {"PHOTOS": str(photos), "EMPTY": str(tmp_path / "empty"), "PIPE": str(tmp_path / "pipe")}
    argv = [str(weights[1]), *(swap.get(a, a).replace("PHOTOS", str(photos)) for a in args)]
    with pytest.raises(SystemExit) as exit_:
        predict_main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert expected.replace("PHOTOS", str(photos)).replace("PIPE", swap["PIPE"]) in captured.err
    assert "top-1" not in captured.out  # nothing was predicted


def test_missing_weights_are_named(photos, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        predict_main(["no-such-weights", str(photos)])
    assert exit_.value.code == 2
    assert "'no-such-weights' does not exist" in capsys.readouterr().err
