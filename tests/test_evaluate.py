"""evaluate_loader: counts, top-k, test-time flip and calibration, with models whose answers are
known; and the vit-evaluate command around it: its help, its file names and its refusals."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from torchmetrics.classification import MulticlassCalibrationError

from tests.helpers import SHIPPED, TINY, TINY_DATA_CLASSES, write_safetensors
from vit.commands.evaluate import _parser, evaluate_main, output_stem, run_evaluate
from vit.io.pretrained import trained_on_whole_split
from vit.model.vision_transformer import VisionTransformer
from vit.train.datamodule import CIFAR10DataModule
from vit.train.evaluation import evaluate_loader


class LeftOrRight(nn.Module):
    """Logit 0: mean of the left column; logit 1: mean of the right one. Mirroring swaps them."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))  # so that evaluate_loader finds a device

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([x[..., 0].mean((1, 2)), x[..., -1].mean((1, 2))], dim=1)


def _batches() -> list[tuple[Tensor, Tensor]]:
    images = torch.zeros(6, 3, 4, 4, dtype=torch.uint8)
    images[..., -1] = 200  # bright right column: the plain model answers 1 for every image
    return [
        (images[:4], torch.ones(4, dtype=torch.long)),
        (images[4:], torch.ones(2, dtype=torch.long)),
    ]


def test_plain_scores_match_the_model() -> None:
    result = evaluate_loader(
        LeftOrRight(), _batches(), preprocess=lambda x: x.float(), classes=["left", "right"]
    )
    assert result["num_images"] == 6 and result["top1"] == 1.0
    assert result["confusion_matrix"] == [[0, 0], [0, 6]]
    assert result["per_class"] == {"left": 0.0, "right": 1.0}


def test_flip_averages_the_mirror_image() -> None:
    # mirrored, the two logits tie and argmax takes class 0: every answer flips to wrong
    result = evaluate_loader(
        LeftOrRight(),
        _batches(),
        preprocess=lambda x: x.float(),
        classes=["left", "right"],
        flip=True,
    )
    assert result["top1"] == 0.0 and result["confusion_matrix"] == [[0, 0], [6, 0]]


def test_an_empty_loader_is_an_error() -> None:
    with pytest.raises(ValueError, match="yielded no images"):
        evaluate_loader(LeftOrRight(), [], preprocess=lambda x: x.float(), classes=["a", "b"])


class Fixed(nn.Module):
    """Answers each image with the logits stored in its first pixel's place: logits[index]."""

    def __init__(self, logits: Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.logits[x[:, 0, 0, 0].long()]


def _indexed(n: int, labels: Tensor, batch: int = 3) -> list[tuple[Tensor, Tensor]]:
    images = torch.arange(n, dtype=torch.uint8)[:, None, None, None].expand(n, 3, 2, 2)
    return [(images[i : i + batch], labels[i : i + batch]) for i in range(0, n, batch)]


def test_calibration_by_hand() -> None:
    # confidences 0.9 (right, wrong) and 0.7 (right, right), each the softmax of [0, log odds]
    p = torch.tensor([0.9, 0.9, 0.7, 0.7], dtype=torch.float64)
    logits = torch.stack([torch.zeros(4, dtype=torch.float64), (p / (1 - p)).log()], dim=1)
    labels = torch.tensor([1, 0, 1, 1])
    result = evaluate_loader(
        Fixed(logits), _indexed(4, labels), preprocess=lambda x: x.float(), classes=["a", "b"]
    )
    # evaluate_loader rounds logits to float32 (log odds < 3: off by < 3 eps), and a probability
    # or a log-likelihood moves at most one to one with a logit
    tol = 3 * torch.finfo(torch.float32).eps
    # bin 13 (0.9 in (13/15, 14/15]): accuracy 0.5, gap 0.4; bin 10 (0.7): accuracy 1, gap 0.3
    assert result["ece"] == pytest.approx((2 * 0.4 + 2 * 0.3) / 4, abs=tol)
    cal = result["calibration"]
    assert cal["bins"] == 15 and cal["images"] == [0] * 10 + [2, 0, 0, 2, 0]
    assert cal["accuracy"][13] == 0.5 and cal["accuracy"][10] == 1.0
    assert cal["confidence"][13] == pytest.approx(0.9, abs=tol) and cal["confidence"][0] is None
    # the mean negative log-likelihood of the true class: -log 0.9, -log 0.1, -log 0.7 twice
    nll = -(math.log(0.9) + math.log(0.1) + 2 * math.log(0.7)) / 4
    assert result["nll"] == pytest.approx(nll, abs=tol)


def test_calibration_error_is_torchmetrics_and_nll_is_cross_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(200, 10, generator=g)
    labels = torch.randint(0, 10, (200,), generator=g)
    result = evaluate_loader(
        Fixed(logits),
        _indexed(200, labels, batch=64),
        preprocess=lambda x: x.float(),
        classes=[str(c) for c in range(10)],
    )
    probs = logits.softmax(dim=-1)  # probabilities: torchmetrics would not softmax them again
    expected = MulticlassCalibrationError(num_classes=10, n_bins=15, norm="l1")(probs, labels)
    # the same bins (no confidence lies on a bin edge here); float32 sums of 200 terms <= 1
    assert result["ece"] == pytest.approx(expected.item(), abs=200 * torch.finfo().eps)
    per_image = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    # torch's float32 mean of 200 terms: off by at most 200 eps times the largest term
    bound = 200 * torch.finfo().eps * per_image.max().item()
    assert result["nll"] == pytest.approx(per_image.mean().item(), abs=bound)
    assert sum(result["calibration"]["images"]) == 200


def test_each_confidence_falls_in_its_own_bin_from_the_first_to_the_last() -> None:
    """Confidence c falls in bin ceil(15c) - 1: with 100 classes (CIFAR-100) the top class can
    hold under 1/15, the first bin; a confidence near 1 falls in the last."""
    confidence = (torch.arange(15, dtype=torch.float64) + 0.5) / 15  # the middle of each bin
    logits = ((1 - confidence[:, None]) / 99).expand(15, 100).clone()
    logits[:, 0] = confidence  # each row sums to 1: its own softmax, as log-probabilities
    result = evaluate_loader(
        Fixed(logits.log()),
        _indexed(15, torch.zeros(15, dtype=torch.long)),
        preprocess=lambda x: x.float(),
        classes=[str(c) for c in range(100)],
    )
    assert result["calibration"]["images"] == [1] * 15


def test_a_model_that_answers_nan_is_scored_not_a_crash() -> None:
    """A diverged checkpoint (NaN logits) still gets its report: its calibration error reads
    NaN, and every image is counted."""
    logits = torch.full((4, 10), float("nan"))
    result = evaluate_loader(
        Fixed(logits),
        _indexed(4, torch.zeros(4, dtype=torch.long)),
        preprocess=lambda x: x.float(),
        classes=[str(c) for c in range(10)],
    )
    assert result["num_images"] == 4 and math.isnan(result["ece"])
    assert sum(result["calibration"]["images"]) == 4


def test_top5_counts_the_true_class_among_the_five_highest_logits() -> None:
    # ten classes; image i's true class holds rank i + 1 (the highest logit at rank 1)
    ranks = torch.arange(10, 0, -1, dtype=torch.float32)  # class c's logit: 10 - c
    logits = ranks.expand(10, 10).clone()
    labels = torch.arange(10)  # image i's label is class i: rank i + 1
    result = evaluate_loader(
        Fixed(logits),
        _indexed(10, labels, batch=4),
        preprocess=lambda x: x.float(),
        classes=[str(c) for c in range(10)],
    )
    assert result["top1"] == 0.1 and result["top5"] == 0.5


def test_with_two_classes_top_k_is_top2() -> None:
    result = evaluate_loader(
        LeftOrRight(), _batches(), preprocess=lambda x: x.float(), classes=["left", "right"]
    )
    assert result["top2"] == 1.0 and "top5" not in result


class Spy(LeftOrRight):
    """LeftOrRight that records the mode and the autocast state each forward ran under."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bool, bool, torch.dtype]] = []

    def forward(self, x: Tensor) -> Tensor:
        dtype = torch.get_autocast_dtype("cpu")
        self.seen.append((self.training, torch.is_autocast_enabled("cpu"), dtype))
        return super().forward(x)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_model_runs_in_eval_mode_under_the_autocast_asked_for(
    dtype: torch.dtype | None,
) -> None:
    model = Spy().train()
    evaluate_loader(
        model, _batches(), preprocess=lambda x: x.float(), classes=["l", "r"], dtype=dtype
    )
    assert len(model.seen) == 2  # one forward per batch
    for training, autocast, autocast_dtype in model.seen:
        assert not training  # dropout and stochastic depth off
        assert autocast == (dtype is not None)
        assert dtype is None or autocast_dtype == dtype


# ---- the vit-evaluate command --------------------------------------------------------------


def _weights(path: Path, **metadata: str) -> Path:
    """A tiny 3-class model as a .safetensors: like shipped weights, no data config."""
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "num_classes": 3}).eval()
    return write_safetensors(model, path, class_names=list(TINY_DATA_CLASSES), **metadata)


def _data(image_tree: Path, tmp_path: Path) -> list[str]:
    return ["--data-dir", str(image_tree), "--cache-dir", str(tmp_path / "cache")]


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """vit-evaluate's stderr for argv, which must be a user error: exit 2, one line."""
    with pytest.raises(SystemExit) as exit_:
        evaluate_main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_val_of_the_shipped_weights_is_refused_they_trained_on_every_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no data config in the file: the split would be the data module's default 5000, trained on;
    # the data folder given does not exist, so the refusal comes before any data is looked for
    argv = [SHIPPED, "--split", "val", "--data-dir", str(tmp_path / "no_data")]
    err = _one_line_exit_2([*argv, "--output-dir", str(tmp_path / "eval")], capsys)
    assert "was trained on the whole training split" in err
    assert "all 50,000 training images" in err and "--split test" in err
    assert not (tmp_path / "eval").exists()


def test_weights_whose_metadata_says_whole_split_are_refused_on_val_only(
    image_tree: Path, tmp_path: Path
) -> None:
    weights = _weights(tmp_path / "w.safetensors", trained_on="CPU, all 36 training images")
    args = [str(weights), *_data(image_tree, tmp_path), "--output-dir", str(tmp_path / "eval")]
    with pytest.raises(ValueError, match=r"whole training split \(its metadata says trained_on "):
        run_evaluate([*args, "--split", "val"])
    assert run_evaluate(args)["num_images"] == 12  # its test split is scored as before


@pytest.mark.parametrize(
    ("trained_on", "whole"),
    [
        ("2-core Intel Xeon with AMX-BF16, bf16-mixed, 60 minutes, all 50,000 training images, "
         "2026-12-01", True),  # the shipped weights' own words
        ("the whole training split", True),
        ("cpu60.yaml with --data.val_size 0", True),
        ("data.val_size: 0, 60 minutes", True),
        ("CPU", False),
        ("45,000 training images, 5,000 held out (data.val_size 5000)", False),
        ("val_size 0.1", False),
        (None, False),
    ],
)  # fmt: skip
def test_trained_on_notes_that_say_every_training_image(
    trained_on: str | None, whole: bool
) -> None:
    metadata = {"format": "vit.VisionTransformer"}
    if trained_on is not None:
        metadata["trained_on"] = trained_on
    assert trained_on_whole_split(metadata) is whole


def _fail_if_evaluated(*args: object, **kwargs: object) -> None:
    raise AssertionError("evaluated before the output folder was checked")


@pytest.mark.parametrize("case", ["a file", "under a file", "unwritable", "default is a file"])
def test_an_output_dir_that_cannot_be_written_is_refused_before_evaluating(
    case: str,
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("vit.commands.evaluate.evaluate_loader", _fail_if_evaluated)
    weights = _weights(tmp_path / "w.safetensors")
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(b"a picture")
    out, expected = {
        "a file": (photo, "is a file, not a folder"),
        "under a file": (photo / "eval", f"would be inside {str(photo)!r}, which is a file"),
        "unwritable": (tmp_path / "locked" / "eval", "cannot be written"),
        "default is a file": (None, "the output folder"),
    }[case]
    if case == "unwritable":  # chmod does not stop root: the check asks os.access
        (tmp_path / "locked").mkdir()
        real = os.access
        monkeypatch.setattr(
            os, "access", lambda p, mode, **kw: Path(p) != out.parent and real(p, mode, **kw)
        )
    if case == "default is a file":
        (tmp_path / "eval").write_text("not a folder")  # where eval/ beside the weights goes
    argv = [str(weights), *_data(image_tree, tmp_path)]
    err = _one_line_exit_2(argv if out is None else [*argv, "--output-dir", str(out)], capsys)
    assert expected in err and "pass --output-dir with a folder" in err
    assert photo.read_bytes() == b"a picture"


def test_flip_keeps_its_own_files_beside_the_plain_ones(image_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    args = [str(_weights(tmp_path / "w.safetensors")), *_data(image_tree, tmp_path)]
    run_evaluate([*args, "--output-dir", str(out)])
    plain = (out / "metrics_test.json").read_text()
    run_evaluate([*args, "--flip", "--output-dir", str(out)])
    assert sorted(p.name for p in out.iterdir()) == [
        "confusion_matrix_test.png",
        "confusion_matrix_test_flip.png",
        "metrics_test.json",
        "metrics_test_flip.json",
        "reliability_test.png",
        "reliability_test_flip.png",
    ]
    assert (out / "metrics_test.json").read_text() == plain  # the first result kept
    assert json.loads(plain)["flip"] is False
    assert json.loads((out / "metrics_test_flip.json").read_text())["flip"] is True


@pytest.mark.parametrize(
    ("split", "weights", "flip", "stem"),
    [
        ("test", None, False, "test"),  # the names scripts/ and the record read: unchanged
        ("val", None, False, "val"),
        ("test", "live", False, "test_live"),
        ("test", None, True, "test_flip"),
        ("val", "average", True, "val_average_flip"),
    ],
)
def test_each_choice_has_its_own_stem(
    split: str, weights: str | None, flip: bool, stem: str
) -> None:
    assert output_stem(split, weights=weights, flip=flip) == stem


@pytest.mark.parametrize("size", ["0", "-3"])
def test_a_batch_size_below_1_names_the_flag_typed(
    size: str, image_tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(_weights(tmp_path / "w.safetensors")), *_data(image_tree, tmp_path)]
    err = _one_line_exit_2([*argv, "--batch-size", size], capsys)
    assert f"--batch-size={size} must be at least 1" in err and "eval_batch_size" not in err
    # vit-train's word for the same mistake still names its config key
    with pytest.raises(ValueError, match="fix `eval_batch_size` in the data config"):
        CIFAR10DataModule(eval_batch_size=int(size))


def test_the_help_shows_the_defaults() -> None:
    text = " ".join(_parser().format_help().split())  # unwrapped
    options = text.split(" options: ", 1)[1]  # past the usage line
    for option, default in (("--split", "test"), ("--batch-size", "500"), ("--precision", "32")):
        entry = options.split(f" {option} ", 1)[1].split(" --", 1)[0]  # up to the next option
        assert entry.endswith(f"(default: {default})"), entry
