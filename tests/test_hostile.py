"""A checkpoint whose pickle would run code is refused, and the code never runs, through every
path that reads a checkpoint: the library loaders, ViTClassifier.load_from_checkpoint, and the
commands (vit-train's --ckpt_path and --model.init_from, vit-evaluate, vit-visualize, vit-explore,
vit-predict), fine-tuning's init_from and save_pretrained."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest

from tests.helpers import TINY, Payload, train_args, vit_train_checkpoint
from vit.commands.evaluate import evaluate_main
from vit.commands.explore import explore_main
from vit.commands.predict import predict_main
from vit.commands.train import train_main
from vit.commands.visualize import visualize_main
from vit.io.checkpoint import load_checkpoint
from vit.io.hub import save_pretrained
from vit.io.init_from import init_from
from vit.io.load import load_model, load_weights
from vit.model.vision_transformer import VisionTransformer
from vit.train.module import ViTClassifier


def _train(subcommand: str, ckpt_path: str) -> Callable[[Path, Path], object]:
    """vit-train SUBCOMMAND --ckpt_path CKPT_PATH on a tiny config; `last` finds `path` as the
    newest run's last.ckpt, where a resume looks for it."""

    def run(path: Path, tmp: Path) -> object:
        args = train_args(tmp / "data", tmp / "runs", f"--ckpt_path={ckpt_path or path}")
        args[0] = subcommand
        if ckpt_path == "last":
            last = tmp / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
            last.parent.mkdir(parents=True)
            path.rename(last)
        return train_main(args)

    return run


def _image(tmp: Path) -> Path:
    """A 32x32 PNG for vit-predict to read once the model loaded."""
    from PIL import Image

    Image.new("RGB", (32, 32)).save(tmp / "image.png")
    return tmp / "image.png"


# every path that reads a checkpoint, as a user reaches it: (path, tmp_path) -> anything
READERS: dict[str, Callable[[Path, Path], object]] = {
    "load_checkpoint": lambda p, tmp: load_checkpoint(p),
    "load_model": lambda p, tmp: load_model(p),
    "load_weights": lambda p, tmp: load_weights(VisionTransformer(**{**TINY, "num_classes": 3}), p),
    "ViTClassifier.load_from_checkpoint": lambda p, tmp: ViTClassifier.load_from_checkpoint(p),
    "vit-train fit --ckpt_path FILE": _train("fit", ""),
    "vit-train fit --ckpt_path last": _train("fit", "last"),
    "vit-train validate --ckpt_path FILE": _train("validate", ""),
    "vit-train test --ckpt_path FILE": _train("test", ""),
    "vit-evaluate": lambda p, tmp: evaluate_main([str(p), "--output-dir", str(tmp / "eval")]),
    "vit-visualize": lambda p, tmp: visualize_main([str(p), "--output-dir", str(tmp / "maps")]),
    "vit-explore": lambda p, tmp: explore_main([str(p), "--output", str(tmp / "page.html")]),
    "vit-predict": lambda p, tmp: predict_main([str(p), str(_image(tmp))]),
    "vit-train fit --model.init_from FILE": lambda p, tmp: train_main(
        train_args(tmp / "data", tmp / "runs", f"--model.init_from={p}")
    ),
    "init_from": lambda p, tmp: init_from(VisionTransformer(**{**TINY, "num_classes": 3}), p),
    "save_pretrained": lambda p, tmp: save_pretrained(p, tmp / "hub"),
}


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("reader", list(READERS))
def test_a_hostile_checkpoint_is_refused_and_its_code_never_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reader: str, zip_format: bool
) -> None:
    marker = tmp_path / "pwned"
    path = vit_train_checkpoint(
        tmp_path / "evil.ckpt", payload=Payload(marker), zip_format=zip_format
    )
    with pytest.raises((ValueError, SystemExit)) as err:
        READERS[reader](path, tmp_path)
    if isinstance(err.value, SystemExit):  # the console commands: one line on stderr, status 2
        assert err.value.code == 2
        message = capsys.readouterr().err
    else:
        message = str(err.value)
    assert "refusing to load" in message and "could run code" in message, message
    assert "last.ckpt" in message if reader.endswith("last") else str(path) in message
    assert not marker.exists()


def test_the_same_checkpoint_without_its_payload_loads(tmp_path: Path) -> None:
    """The control: only the payload is refused, not the checkpoint's shape."""
    path = vit_train_checkpoint(tmp_path / "plain.ckpt")
    assert load_checkpoint(path)["hyper_parameters"]["class_names"] == ["bird", "cat", "dog"]
    model, _ = load_model(path)
    assert model.num_classes == 3
    assert ViTClassifier.load_from_checkpoint(path).hparams.class_names == ["bird", "cat", "dog"]


def test_lightning_loads_the_ckpt_path_weights_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After vit-train's own read, Lightning's loader reads --ckpt_path again: it is told
    weights_only=True (None loads a URL with pickle's full power), and false is refused."""
    calls: list[dict[str, object]] = []

    @functools.wraps(L.Trainer.fit)  # the CLI reads fit's arguments from its signature
    def fit(self: L.Trainer, *args: object, **kwargs: object) -> None:
        calls.append(kwargs)

    monkeypatch.setattr(L.Trainer, "fit", fit)
    path = vit_train_checkpoint(tmp_path / "plain.ckpt")
    args = train_args(tmp_path / "data", tmp_path / "runs", f"--ckpt_path={path}")
    train_main(args)
    assert calls and calls[0]["ckpt_path"] == str(path) and calls[0]["weights_only"] is True
    with pytest.raises(ValueError, match="--weights_only false would let a checkpoint run code"):
        train_main([*args, "--weights_only=false"])
