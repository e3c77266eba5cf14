"""vit.data.folder_source: image folders and tar archives of them, read into uint8 tensors, and
the decoded cache (reused, invalidated when the source changes, written atomically). A damaged cache
file is decoded again from its source, once, said in one warning; where the source is gone too, the
error names both."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit.data.folder_source
from tests.helpers import CIFAR_ARCHIVE, tiny_datamodule
from vit.data.datasets import CIFAR10_CLASSES, CIFAR10_MEAN
from vit.data.folder_source import load_folder_source, load_image_folder, prepare_folder_source

pytestmark = pytest.mark.usefixtures("cache_in_tmp")  # no test reads or writes the user's cache


def _pixels(path: Path) -> torch.Tensor:
    with Image.open(path) as image:
        return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)


# ---- image folders and archives ------------------------------------------------------------------


def test_load_image_folder_shapes_labels_and_pixels(image_tree: Path) -> None:
    images, labels, classes = load_image_folder(image_tree / "train")
    assert classes == ["bird", "cat", "dog"]
    assert images.shape == (36, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64 and labels.tolist() == [0] * 12 + [1] * 12 + [2] * 12
    assert torch.equal(images[12], _pixels(image_tree / "train/cat/0000.png"))  # PNG: exact
    assert torch.equal(images[14], _pixels(image_tree / "train/cat/0002.jpg"))  # same decoder


def test_classes_sorted_not_in_disk_order(image_tree: Path) -> None:
    (image_tree / "train/aardvark").mkdir()
    shutil.copy(image_tree / "train/dog/0000.png", image_tree / "train/aardvark/x.png")
    _, labels, classes = load_image_folder(image_tree / "train")
    assert classes == ["aardvark", "bird", "cat", "dog"]
    assert labels[0] == 0 and labels.bincount().tolist() == [1, 12, 12, 12]


def test_folder_flat_tar_and_nested_tar_give_identical_tensors(
    image_tree: Path, image_tree_tgz: Path, make_tar: Callable[..., Path], tmp_path: Path
) -> None:
    flat = make_tar(image_tree, tmp_path / "flat.tar", top=None)
    for split, n in (("train", 36), ("test", 12)):
        ref = load_folder_source(image_tree, split=split)
        assert ref[0].shape[0] == n
        for archive in (image_tree_tgz, flat):
            got = load_folder_source(archive, split=split)
            assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
            assert got[2] == ref[2]


def test_cache_is_reused_without_decoding(
    image_tree_tgz: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "my-cache"
    entry = prepare_folder_source(image_tree_tgz, cache_dir=cache)
    assert entry.parent == cache and sorted(p.name for p in entry.iterdir()) == [
        "test.pt",
        "train.pt",
    ]
    first = load_folder_source(image_tree_tgz, split="train", cache_dir=cache)

    def no_decoding(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("decoded again although the cache is valid")

    monkeypatch.setattr(vit.data.folder_source, "decode_image_bytes", no_decoding)
    again = load_folder_source(image_tree_tgz, split="train", cache_dir=cache)
    assert torch.equal(first[0], again[0]) and first[2] == again[2]


def test_cache_is_invalidated_when_the_archive_or_folder_changes(
    image_tree: Path, image_tree_tgz: Path, make_tar: Callable[..., Path]
) -> None:
    for source in (image_tree_tgz, image_tree):
        old_entry = prepare_folder_source(source)
        shutil.copy(image_tree / "train/cat/0000.png", image_tree / "train/cat/0999.png")
        if source == image_tree_tgz:
            make_tar(image_tree, image_tree_tgz)
            os.utime(image_tree_tgz, ns=(1, 1))  # a different mtime even within one clock tick
        assert prepare_folder_source(source) != old_entry
        assert load_folder_source(source, split="train")[0].shape[0] == 37
        (image_tree / "train/cat/0999.png").unlink()


def test_cache_write_is_atomic(image_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_save = torch.save
    calls = []

    def crash_on_test_split(obj: object, path: Path) -> None:
        calls.append(path)
        if len(calls) == 2:
            Path(path).write_bytes(b"half a file")
            raise KeyboardInterrupt("simulated crash while writing test.pt")
        real_save(obj, path)

    monkeypatch.setattr(torch, "save", crash_on_test_split)
    with pytest.raises(KeyboardInterrupt):
        prepare_folder_source(image_tree)
    entry = Path(calls[0]).parent
    assert sorted(p.name for p in entry.iterdir()) == ["train.pt"]  # no tmp, no half test.pt
    monkeypatch.setattr(torch, "save", real_save)
    assert load_folder_source(image_tree, split="test")[0].shape[0] == 12


def test_gray_rgba_and_palette_images_become_rgb(image_tree: Path) -> None:
    cat = image_tree / "train/cat"
    for name, mode in (("0000.png", "L"), ("0001.png", "RGBA"), ("0003.png", "P")):
        with Image.open(cat / name) as image:
            image.convert(mode).save(cat / name)
        with Image.open(cat / name) as image:
            assert image.mode == mode
    images, _, _ = load_image_folder(image_tree / "train")
    for row, name in ((12, "0000.png"), (13, "0001.png"), (15, "0003.png")):
        assert torch.equal(images[row], _pixels(cat / name))
    assert torch.equal(images[12][0], images[12][1])  # gray: equal channels


def test_other_sizes_are_resized_with_one_warning(
    image_tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Image.new("RGB", (48, 40), (200, 10, 10)).save(image_tree / "train/dog/0100.png")
    Image.new("RGB", (16, 16), (10, 200, 10)).save(image_tree / "train/dog/0101.bmp")
    with caplog.at_level("WARNING", logger="vit.data"):
        images, _, _ = load_image_folder(image_tree / "train", image_size=32)
    assert images.shape == (38, 3, 32, 32)
    assert torch.equal(
        images[-1], torch.tensor([10, 200, 10], dtype=torch.uint8)[:, None, None].expand(3, 32, 32)
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "resized 2 of 38 images to 32x32" in warnings[0]


def test_corrupt_image_error_names_the_file(image_tree: Path, image_tree_tgz: Path) -> None:
    (image_tree / "train/cat/0005.png").write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match=r"cannot decode image file .*train/cat/0005\.png"):
        load_image_folder(image_tree / "train")


def test_non_image_and_hidden_files_are_ignored(image_tree: Path) -> None:
    (image_tree / "train/cat/notes.txt").write_text("not an image")
    (image_tree / "train/cat/.0000.png").write_bytes(b"macOS resource fork")
    (image_tree / "train/README.md").write_text("a file beside the class folders")
    (image_tree / "train/.ipynb_checkpoints").mkdir()
    shutil.copy(image_tree / "train/cat/0000.png", image_tree / "train/cat/UPPER.PNG")
    images, labels, classes = load_image_folder(image_tree / "train")
    assert classes == ["bird", "cat", "dog"] and labels.bincount().tolist() == [12, 13, 12]


def test_empty_folders_give_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        ValueError, match=r"empty: no class subfolders; expected the layout <root>/<class>/<image>"
    ):
        load_image_folder(tmp_path / "empty")
    (tmp_path / "empty/cat").mkdir()
    (tmp_path / "empty/cat/a.txt").write_text("x")
    with pytest.raises(ValueError, match=r"class folders without images: \['cat'\]"):
        load_image_folder(tmp_path / "empty")
    for split in ("train", "test"):
        (tmp_path / "source" / split).mkdir(parents=True)
    with pytest.raises(
        ValueError, match=r"has no train or test class folders; expected a folder holding train/"
    ):
        prepare_folder_source(tmp_path / "source")


def test_missing_source_error_names_path_and_options(tmp_path: Path) -> None:
    dm = tiny_datamodule(tmp_path / "nowhere.tar.gz")
    pattern = (
        r"nowhere\.tar\.gz.*does not exist.*train/<class>/<image>.*\.tar\.gz.*"
        r"`data_dir`.*`source: cifar10`"
    )
    with pytest.raises(ValueError, match=pattern):
        dm.prepare_data()
    (tmp_path / "data.zip").write_bytes(b"PK")
    with pytest.raises(ValueError, match=r"data\.zip is neither a folder nor a \.tar"):
        prepare_folder_source(tmp_path / "data.zip")
    (tmp_path / "broken.tar.gz").write_bytes(b"this is no gzip stream")
    with pytest.raises(ValueError, match=r"cannot read archive .*broken\.tar\.gz"):
        prepare_folder_source(tmp_path / "broken.tar.gz")


def test_train_and_test_with_different_classes(
    image_tree: Path, make_tar: Callable[..., Path], tmp_path: Path
) -> None:
    shutil.move(image_tree / "test/dog", image_tree / "test/fish")
    pattern = r"different classes: only in train \['dog'\], only in test \['fish'\]"
    with pytest.raises(ValueError, match=pattern):
        prepare_folder_source(image_tree)
    with pytest.raises(ValueError, match=pattern):
        prepare_folder_source(make_tar(image_tree, tmp_path / "mismatch.tgz"))


# ---- a damaged cache file ------------------------------------------------------------------------


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":  # an interrupted copy
        path.write_bytes(data[: len(data) // 2])
    elif how == "random":  # overwritten by something else
        path.write_bytes(os.urandom(len(data)))
    else:  # a readable file of another layout (another version's, or someone's own)
        blob = torch.load(path, weights_only=True)
        torch.save({"data": blob["images"].float(), "targets": blob["labels"]}, path)


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("how", ["truncated", "random", "other_layout"])
def test_a_damaged_cache_file_is_decoded_again(
    make_image_tree: Callable[..., Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    how: str,
    mmap: bool,
) -> None:
    source = make_image_tree(tmp_path / "tiny", train_per_class=3, test_per_class=2)
    cache = tmp_path / "cache"
    images, labels, classes = load_folder_source(source, split="test", cache_dir=cache)
    path = prepare_folder_source(source, cache_dir=cache) / "test.pt"
    _damage(path, how)
    with caplog.at_level(logging.WARNING, logger="vit.data.folder_source"):
        again = load_folder_source(source, split="test", cache_dir=cache, mmap=mmap)
    assert torch.equal(again[0], images) and torch.equal(again[1], labels) and again[2] == classes
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"cache file {path} is damaged" in warnings[0]
    assert f"decoding {source} again" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vit.data.folder_source"):
        load_folder_source(source, split="test", cache_dir=cache, mmap=mmap)
    assert not caplog.records  # the file written afresh reads cleanly


def test_a_damaged_cache_file_whose_source_is_gone_names_both(
    make_image_tree: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_image_tree(tmp_path / "tiny", train_per_class=2, test_per_class=2)
    cache = tmp_path / "cache"
    path = prepare_folder_source(source, cache_dir=cache) / "test.pt"
    _damage(path, "truncated")
    real = vit.data.folder_source._read_cache_file

    def source_vanishes_first(*args: object, **kwargs: object) -> object:
        """The source goes while the cache is read (a tmp folder cleaned, a mount dropped)."""
        shutil.rmtree(source)
        monkeypatch.setattr(vit.data.folder_source, "_read_cache_file", real)
        return real(*args, **kwargs)

    monkeypatch.setattr(vit.data.folder_source, "_read_cache_file", source_vanishes_first)
    with pytest.raises(ValueError) as err:
        load_folder_source(source, split="test", cache_dir=cache)
    message = str(err.value)
    assert f"cache file {path} is damaged" in message
    assert f"its source {source} is gone" in message and "restore the source" in message


# ---- the real archive ----------------------------------------------------------------------------


@pytest.mark.slow
def test_real_cifar10_archive(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not CIFAR_ARCHIVE.is_file():
        pytest.skip(f"real CIFAR-10 archive not found at {CIFAR_ARCHIVE}")
    cache = tmp_path_factory.mktemp("real-cache")
    train, train_labels, classes = load_folder_source(CIFAR_ARCHIVE, split="train", cache_dir=cache)
    test, test_labels, test_classes = load_folder_source(
        CIFAR_ARCHIVE, split="test", cache_dir=cache
    )
    assert classes == test_classes == list(CIFAR10_CLASSES)
    assert train.shape == (50_000, 3, 32, 32) and test.shape == (10_000, 3, 32, 32)
    assert train_labels.bincount().tolist() == [5000] * 10
    assert test_labels.bincount().tolist() == [1000] * 10
    mean = train.float().mean(dim=(0, 2, 3)) / 255
    torch.testing.assert_close(mean, torch.tensor(CIFAR10_MEAN), rtol=0, atol=2e-3)
