"""Fine-tuning (`--model.init_from`, vit/io/init_from.py): every matching weight loaded, a fresh
head for another class count or other classes, positions resized for another image size, a
report of each; the architecture and the path checked before any data is read; a resumed fit
never reads the source again."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from PIL import Image

from tests.helpers import (
    RESULTS,
    TINY,
    TINY_DATA_CLASSES,
    load_script,
    quiet_trainer,
    tiny_classifier,
    tiny_datamodule,
    train_args,
)
from vit.commands.train import train_main
from vit.io.hub import save_pretrained
from vit.io.init_from import init_from
from vit.io.load import load_model
from vit.model.embed import resize_pos_embed
from vit.model.vision_transformer import VisionTransformer

CIFAR_NAMES = [f"class{i}" for i in range(10)]


def source_checkpoint(path: Path, *, seed: int = 1, **network: object) -> Path:
    """A vit-train-shaped checkpoint of the tiny 10-class model (its own seed)."""
    torch.manual_seed(seed)
    module = tiny_classifier(network=dict(network), class_names=CIFAR_NAMES)
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, path)
    return path


class Snapshot(L.Callback):
    """The network's weights when training starts (after on_fit_start) and when it ends."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = {k: v.detach().cpu().clone() for k, v in pl_module.model.state_dict().items()}

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.end = {k: v.detach().cpu().clone() for k, v in pl_module.model.state_dict().items()}


def test_a_few_steps_fine_tune_from_a_checkpoint_with_a_fresh_3_class_head(
    tmp_path, make_image_tree
) -> None:
    source = source_checkpoint(tmp_path / "source.ckpt")
    theirs, _ = load_model(source)
    data = tiny_datamodule(make_image_tree(tmp_path / "tiny"), cache_dir=str(tmp_path / "cache"))
    torch.manual_seed(0)
    module = tiny_classifier(network={"num_classes": 3}, init_from=str(source))
    fresh_head = module.model.head.weight.detach().clone()
    snap = Snapshot()
    quiet_trainer(tmp_path, max_steps=3, max_epochs=1, callbacks=[snap]).fit(module, data)

    for key, value in theirs.state_dict().items():  # at step 0: the source's, but the head
        if key.startswith("head."):
            assert snap.start[key].shape[0] == 3 and value.shape[0] == 10
        else:
            assert torch.equal(snap.start[key], value), key
    assert torch.equal(snap.start["head.weight"], fresh_head)  # the model's own init, kept
    assert not torch.equal(
        snap.end["blocks.0.attn.qkv.weight"], snap.start["blocks.0.attn.qkv.weight"]
    )
    assert module.hparams.init_from == str(source)
    assert module.hparams.class_names == list(TINY_DATA_CLASSES)


def test_positions_are_resized_for_another_image_size(tmp_path) -> None:
    source = source_checkpoint(tmp_path / "source.ckpt")  # 32x32 images, 8x8 patches: 4x4 grid
    theirs, _ = load_model(source)
    model = VisionTransformer(**{**TINY, "img_size": 16, "num_classes": 3})  # a 2x2 grid
    report = init_from(model, source, class_names=["a", "b", "c"])
    want = resize_pos_embed(theirs.pos_embed.detach(), new_grid=2)
    assert torch.equal(model.pos_embed.detach(), want)
    assert report.resized == ["pos_embed (learned): 4x4 -> 2x2 patch grid"]
    assert report.fresh == ["head.weight", "head.bias"]
    assert (
        "4x4 -> 2x2" in report.summary() and "10 classes in the source, 3 here" in report.summary()
    )
    assert len(report.loaded) == report.total - 3


def test_the_head_is_kept_only_for_the_same_classes(tmp_path) -> None:
    source = source_checkpoint(tmp_path / "source.ckpt")
    theirs, _ = load_model(source)
    same = VisionTransformer(**TINY)
    assert init_from(same, source, class_names=CIFAR_NAMES).fresh == []
    assert torch.equal(same.head.weight, theirs.head.weight)
    other = VisionTransformer(**TINY)
    report = init_from(other, source, class_names=[str(i) for i in range(10)])
    assert report.fresh == ["head.weight", "head.bias"] and "other classes" in report.why_fresh
    assert not torch.equal(other.head.weight, theirs.head.weight)


def test_a_save_pretrained_folder_is_a_source_too(tmp_path) -> None:
    torch.manual_seed(3)
    theirs = VisionTransformer(**TINY)
    folder = save_pretrained(theirs, tmp_path / "hub", class_names=CIFAR_NAMES)
    model = VisionTransformer(**{**TINY, "drop_path_rate": 0.1})  # regularisation may differ
    assert init_from(model, folder, class_names=CIFAR_NAMES).fresh == []
    theirs_state = theirs.state_dict()
    assert all(torch.equal(v, theirs_state[k]) for k, v in model.state_dict().items())


def test_another_architecture_is_refused_with_the_settings_to_use(tmp_path) -> None:
    source = source_checkpoint(tmp_path / "source.ckpt")
    model = VisionTransformer(**{**TINY, "embed_dim": 64, "depth": 3})
    before = model.state_dict()["blocks.0.attn.qkv.weight"].clone()
    with pytest.raises(ValueError) as err:
        init_from(model, source)
    message = str(err.value)
    assert "embed_dim=32, depth=2" in message and "embed_dim=64, depth=3" in message
    assert "--model.network.embed_dim 32 --model.network.depth 2" in message
    assert torch.equal(model.state_dict()["blocks.0.attn.qkv.weight"], before)  # untouched


def test_a_bare_state_dict_of_another_width_names_the_shapes(tmp_path) -> None:
    path = tmp_path / "bare.pt"
    torch.save(VisionTransformer(**{**TINY, "embed_dim": 64}).state_dict(), path)
    with pytest.raises(ValueError, match=r"do not fit the model: .*\(64,\) vs model \(32,\)"):
        init_from(VisionTransformer(**TINY), path)


def test_vit_train_fine_tunes_and_reports_then_resumes_without_the_source(
    tmp_path, make_image_tree, caplog
) -> None:
    source = source_checkpoint(tmp_path / "source.ckpt")
    data, runs = make_image_tree(tmp_path / "tiny"), tmp_path / "runs"
    # a floor under the learning rate: the resumed, longer fit trains on at min_lr (with a floor
    # of 0 it would be refused, its schedule ended: vit/train/schedule.py)
    floor = "--model.schedule.min_lr=1e-5"
    with caplog.at_level(logging.INFO):
        args = (f"--model.init_from={source}", "--trainer.max_epochs=1", floor)
        train_main(train_args(data, runs, *args))
    assert "init_from" in caplog.text and "newly initialised head.weight, head.bias" in caplog.text
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["hyper_parameters"]["init_from"] == str(source)
    source.unlink()  # a resumed fit takes its weights from the checkpoint, not the source
    caplog.clear()
    with caplog.at_level(logging.INFO):
        train_main(train_args(data, runs, f"--ckpt_path={last}", "--trainer.max_epochs=2", floor))
    assert "not applied, the fit resumes from a checkpoint" in caplog.text


@pytest.mark.parametrize(
    ("init", "error", "expected"),
    [
        ("no_such.ckpt", FileNotFoundError, "'no_such.ckpt' does not exist"),
        ("WIDE", ValueError, "--model.network.embed_dim 64"),
    ],
)
def test_vit_train_checks_the_source_before_reading_data(
    tmp_path, init: str, error: type, expected: str
) -> None:
    if init == "WIDE":
        init = str(source_checkpoint(tmp_path / "wide.ckpt", embed_dim=64))
    absent = tmp_path / "no_data_here"  # reading it would fail with another message
    with pytest.raises(error, match=expected):
        train_main(train_args(absent, tmp_path / "runs", f"--model.init_from={init}"))


RECORD = RESULTS / "2026-12-01-amx-finetune-digits"  # the shipped weights' fine-tune


def test_the_digits_script_writes_a_stratified_image_folder(tmp_path) -> None:
    pytest.importorskip("sklearn", reason="pip install -e '.[finetune]'")
    counts = load_script("finetune_digits").write_digits(tmp_path, test_size=360, seed=0)
    assert counts == {"train": 1437, "test": 360}
    per_class = {d.name: len(list(d.iterdir())) for d in (tmp_path / "test").iterdir()}
    assert sorted(per_class) == [str(i) for i in range(10)]
    assert all(35 <= n <= 37 for n in per_class.values())  # stratified: 360 / 10 each
    image = Image.open(next((tmp_path / "train" / "7").iterdir()))
    assert (image.size, image.mode) == ((8, 8), "L")


def test_the_digits_record_is_the_script_s_page_of_its_figures() -> None:
    record = json.loads((RECORD / "metrics.json").read_text())
    page = load_script("finetune_digits").readme(record)
    assert (RECORD / "README.md").read_text() == page
    arms = record["arms"]
    assert arms["scratch"]["steps"] == arms["finetuned"]["steps"]  # the same budget
    for arm in arms.values():
        scored = json.loads(
            (
                RECORD / ("finetuned" if arm["init_from"] else "scratch") / "metrics_test.json"
            ).read_text()
        )
        assert scored["top1"] == arm["test_top1"] and scored["num_images"] == 360


def test_a_module_loaded_from_its_checkpoint_trains_on_without_init_from_again(
    tmp_path, make_image_tree
) -> None:
    """load_from_checkpoint gives the fine-tuned weights; a later fit starts from them, not
    from init_from's source."""
    source = source_checkpoint(tmp_path / "source.ckpt")
    data = tiny_datamodule(make_image_tree(tmp_path / "tiny"), cache_dir=str(tmp_path / "cache"))
    module = tiny_classifier(network={"num_classes": 3}, init_from=str(source))
    trainer = quiet_trainer(tmp_path / "first", max_steps=2, max_epochs=1)
    trainer.fit(module, data)
    trainer.save_checkpoint(tmp_path / "tuned.ckpt")
    tuned = type(module).load_from_checkpoint(tmp_path / "tuned.ckpt")
    expected = {k: v.detach().clone() for k, v in tuned.model.state_dict().items()}
    snap = Snapshot()
    quiet_trainer(tmp_path / "second", max_steps=1, max_epochs=1, callbacks=[snap]).fit(tuned, data)
    assert all(torch.equal(snap.start[k], v) for k, v in expected.items())
    assert tuned.hparams.init_from is None
