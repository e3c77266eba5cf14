"""Tests for vit.data: folder and tar sources, the cache, the cifar10 source and the DataModule."""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from PIL import Image

import vit.cifar10_source
import vit.folder_source
from tests.conftest import quiet_trainer
from vit.data import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR10DataModule,
    TensorImageDataset,
    collate_batch,
    load_folder_source,
    load_image_folder,
    prepare_folder_source,
    preprocess,
)

REAL_ARCHIVE = Path(__file__).resolve().parents[1].parent / "shared/data/cifar10-jpeg.tar.gz"


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here writes to the user's ~/.cache/vit or reads the user's $VIT_DATA_DIR."""
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VIT_DATA_DIR", raising=False)


def _datamodule(data_dir: Path, **kwargs: object) -> CIFAR10DataModule:
    defaults = dict(data_dir=str(data_dir), val_size=6, batch_size=8)
    return CIFAR10DataModule(**{**defaults, **kwargs})


def _pixels(path: Path) -> torch.Tensor:
    with Image.open(path) as image:
        return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)


# ---- image folders and archives --------------------------------------------------------------


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

    monkeypatch.setattr(vit.folder_source, "decode_image_bytes", no_decoding)
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
    dm = _datamodule(tmp_path / "nowhere.tar.gz")
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


# ---- DataModule ---------------------------------------------------------------------------------


def test_validation_split_is_disjoint_sized_and_seeded(image_tree: Path) -> None:
    dm = _datamodule(image_tree, val_size=6, seed=0)
    dm.setup("fit")
    assert len(dm.train_dataset) == 30 and len(dm.val_dataset) == 6
    train, val = dm.split_indices(36)
    assert set(train.tolist()).isdisjoint(val.tolist())
    assert sorted(train.tolist() + val.tolist()) == list(range(36))
    same, other = _datamodule(image_tree, seed=0), _datamodule(image_tree, seed=1)
    same.setup("fit")
    other.setup("fit")
    assert torch.equal(same.val_dataset.images, dm.val_dataset.images)
    assert not torch.equal(other.val_dataset.images, dm.val_dataset.images)
    assert dm.test_dataset is None  # test images only for test/predict


def test_train_subset_is_a_seeded_nested_subset(image_tree: Path) -> None:
    full = _datamodule(image_tree).split_indices(36)
    small = _datamodule(image_tree, train_subset=10).split_indices(36)
    larger = _datamodule(image_tree, train_subset=20).split_indices(36)
    assert len(small[0]) == 10 and torch.equal(small[1], full[1])
    assert set(small[0].tolist()) <= set(larger[0].tolist()) <= set(full[0].tolist())
    with pytest.raises(ValueError, match="train_subset=31 exceeds the 30 training images"):
        _datamodule(image_tree, train_subset=31).setup("fit")


def test_split_size_errors(image_tree: Path) -> None:
    with pytest.raises(
        ValueError, match="val_size=36 leaves no training images.*choose val_size < 36"
    ):
        _datamodule(image_tree, val_size=36).setup("fit")
    dm = _datamodule(image_tree, train_subset=4, batch_size=8)
    dm.setup("fit")
    with pytest.raises(ValueError, match="only 4 training images for batch_size=8.*drop_last"):
        dm.train_dataloader()


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
        (dict(val_size=-1), "val_size must be an integer >= 0, got -1"),
        (dict(train_subset=0), "train_subset must be an integer >= 1 or None, got 0"),
        (dict(eval_batch_size=2.5), "eval_batch_size must be an integer >= 1 or None, got 2.5"),
        (dict(crop_padding=-4), "crop_padding must be an integer >= 0, got -4"),
        (dict(source="imagenet"), "source must be 'auto', 'folder' or 'cifar10', got 'imagenet'"),
    ],
)
def test_init_rejects_bad_values(tmp_path: Path, kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        _datamodule(tmp_path, **kwargs)


def test_hparams_classes_before_setup_and_loaders(
    image_tree_tgz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dm = _datamodule(image_tree_tgz, batch_size=8)
    assert dm.hparams.batch_size == 8 and dm.eval_batch_size == 16
    assert dm.classes == ["bird", "cat", "dog"] and dm.num_classes == 3  # before setup
    with pytest.raises(RuntimeError, match=r"call setup\('fit'\)"):
        dm.train_dataloader()
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    monkeypatch.setattr(TensorImageDataset, "__getitem__", None)  # batches use __getitems__ only
    train, val, test = dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()
    assert (len(train), len(val), len(test)) == (3, 1, 1)  # 30 // 8 with drop_last, 6, 12
    images, labels = next(iter(train))
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64
    assert next(iter(test))[0].shape == (12, 3, 32, 32)
    assert len(dm.predict_dataloader().dataset) == 12


def test_loader_with_a_worker_process(image_tree: Path) -> None:
    dm = _datamodule(image_tree, num_workers=1)
    dm.setup("fit")
    loader = dm.val_dataloader()
    assert loader.persistent_workers
    (images, labels), *rest = list(loader)  # the whole epoch, so the worker idles at the end
    assert not rest
    assert torch.equal(images, dm.val_dataset.images) and torch.equal(labels, dm.val_dataset.labels)
    loader._iterator._shutdown_workers()  # now, not at some later garbage collection


def test_collate_batch_passes_batches_and_collates_samples() -> None:
    data = TensorImageDataset(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4))
    batch = data.__getitems__([3, 1])
    assert collate_batch(batch) is batch and batch[1].tolist() == [3, 1]
    images, labels = collate_batch([data[0], data[2]])
    assert images.shape == (2, 3, 2, 2) and labels.tolist() == [0, 2]
    assert pickle.loads(pickle.dumps(collate_batch)) is collate_batch
    with pytest.raises(ValueError, match=r"images must be uint8 \(N, C, H, W\), got torch.float32"):
        TensorImageDataset(torch.zeros(4, 3, 2, 2), torch.arange(4))


def test_after_transfer_normalizes_and_augments_only_in_training(image_tree: Path) -> None:
    dm = _datamodule(image_tree)
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    expected = preprocess(images)
    for trainer in (None, SimpleNamespace(training=False)):
        dm.trainer = trainer
        out, out_labels = dm.on_after_batch_transfer((images, labels), 0)
        assert out.dtype == torch.float32 and torch.equal(out, expected)
        assert out_labels is labels
    assert torch.equal(dm.preprocess(images), expected)
    assert abs(expected.mean().item() - ((128 / 255 - 0.47) / 0.25)) < 0.2  # data ~U(1, 255)
    dm.trainer = SimpleNamespace(training=True, global_step=5, global_rank=0)
    out, _ = dm.on_after_batch_transfer((images, labels), 0)
    assert out.dtype == torch.float32 and out.shape == expected.shape
    assert not torch.equal(out, expected)
    # the draws are a function of (seed, step, rank), not of the global RNG: resumable
    torch.manual_seed(123)
    assert torch.equal(dm.on_after_batch_transfer((images, labels), 0)[0], out)
    dm.trainer = SimpleNamespace(training=True, global_step=6, global_rank=0)
    assert not torch.equal(dm.on_after_batch_transfer((images, labels), 0)[0], out)
    # still the normalized image of *some* uint8 batch: undo normalize and find integers
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (CIFAR10_MEAN, CIFAR10_STD))
    raw = (out * std + mean) * 255
    torch.testing.assert_close(raw, raw.round(), rtol=0, atol=1e-3)
    plain = _datamodule(image_tree, crop_padding=0, hflip=False)
    plain.trainer = SimpleNamespace(training=True, global_step=0, global_rank=0)
    assert torch.equal(plain.on_after_batch_transfer((images, labels), 0)[0], expected)


class _Recorder(L.LightningModule):
    """Records what reaches the steps, to check the DataModule's hooks inside a real Trainer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 32 * 32, 3)
        self.seen: dict[str, list[torch.Tensor]] = {"train": [], "val": []}

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        self.seen["train"].append(batch[0])
        return F.cross_entropy(self.layer(batch[0].flatten(1)), batch[1])

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.seen["val"].append(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_gets_normalized_batches_augmented_only_in_training(image_tree: Path) -> None:
    dm, model = _datamodule(image_tree), _Recorder()
    trainer = quiet_trainer(
        None,
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=2,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)
    assert len(model.seen["train"]) == 2 and len(model.seen["val"]) == 1
    assert all(x.dtype == torch.float32 and x.shape == (8, 3, 32, 32) for x in model.seen["train"])
    assert torch.equal(model.seen["val"][0], preprocess(dm.val_dataset.images))  # not augmented
    # training images, un-normalized, are mostly shifted/mirrored: few equal a stored image
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (CIFAR10_MEAN, CIFAR10_STD))
    raw = ((torch.cat(model.seen["train"]) * std + mean) * 255).round().to(torch.uint8)
    stored = dm.train_dataset.images.flatten(1)
    unchanged = sum(bool((stored == image.flatten()).all(1).any()) for image in raw)
    assert unchanged < len(raw) // 2  # expected ~1 in 162 (offset (4, 4) and no flip)
    assert trainer.datamodule.classes == ["bird", "cat", "dog"]


# ---- the cifar10 source ----------------------------------------------------------------------


def _write_fake_cifar(root: Path, *, per_batch: int = 4) -> dict[str, np.ndarray]:
    """cifar-10-batches-py in the real pickle format: rows of 3072 bytes, R then G then B planes."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        entry = {
            "batch_label": name,
            "data": data,
            "labels": labels,
            "filenames": ["x.png"] * per_batch,
        }
        (folder / name).write_bytes(pickle.dumps(entry))
        written[name] = data
    meta = {"label_names": list(CIFAR10_CLASSES), "num_cases_per_batch": per_batch, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    return written


def test_cifar10_source_reads_the_pickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = _write_fake_cifar(tmp_path)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    dm = _datamodule(tmp_path, source="cifar10", val_size=5, batch_size=4)
    assert dm.classes == list(CIFAR10_CLASSES)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    assert (len(dm.train_dataset), len(dm.val_dataset), len(dm.test_dataset)) == (15, 5, 4)
    expected = torch.from_numpy(written["test_batch"]).view(4, 3, 32, 32)
    assert torch.equal(dm.test_dataset.images, expected) and dm.classes == list(CIFAR10_CLASSES)
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8


def test_cifar10_source_missing_without_download(tmp_path: Path) -> None:
    dm = _datamodule(tmp_path / "data", source="cifar10")
    with pytest.raises(
        ValueError,
        match=r"no CIFAR-10 at .*cifar-10-batches-py.*`download: true`.*`source: folder`",
    ):
        dm.prepare_data()


# ---- source: auto, the search for CIFAR-10 ----------------------------------------------------


@pytest.fixture
def no_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The search's JPEG-copy step sees only an absent path, never the machine's real copy."""
    absent = tmp_path / "shared/data/cifar10-jpeg.tar.gz"
    monkeypatch.setattr(vit.cifar10_source, "shared_candidates", lambda: [absent])
    return absent


class _FakeCIFAR10:
    """torchvision's CIFAR10 standing in for the network: writes the release, or fails."""

    calls: list[tuple[str, bool]] = []
    error: Exception | None = None

    def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
        type(self).calls.append((root, download))
        if self.error is not None:
            raise self.error
        _write_fake_cifar(Path(root))


@pytest.fixture
def fake_download(monkeypatch: pytest.MonkeyPatch) -> type[_FakeCIFAR10]:
    monkeypatch.setattr(_FakeCIFAR10, "calls", [])
    monkeypatch.setattr(_FakeCIFAR10, "error", None)
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", _FakeCIFAR10)
    return _FakeCIFAR10


def test_auto_reads_the_configured_path_first(
    image_tree_tgz: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_shared: Path
) -> None:
    _write_fake_cifar(tmp_path / "release")
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "release"))  # the config path wins
    dm = _datamodule(image_tree_tgz)
    assert dm.locate() == vit.cifar10_source.Found("folder", image_tree_tgz, "data.data_dir")
    assert dm.classes == ["bird", "cat", "dog"]
    for given in ("release", "release/cifar-10-batches-py"):  # the root or the folder itself
        found = _datamodule(tmp_path / given).locate()
        assert (found.source, found.path) == ("cifar10", tmp_path / "release")


def test_auto_reads_the_environment_variable(
    image_tree_tgz: Path, monkeypatch: pytest.MonkeyPatch, no_shared: Path
) -> None:
    monkeypatch.setenv("VIT_DATA_DIR", str(image_tree_tgz))
    dm = CIFAR10DataModule(val_size=6, batch_size=8)
    assert dm.locate() == vit.cifar10_source.Found("folder", image_tree_tgz, "$VIT_DATA_DIR")
    dm.setup("fit")
    assert len(dm.train_dataset) == 30 and dm.classes == ["bird", "cat", "dog"]


def test_auto_finds_the_shared_copy_beside_the_repository_or_the_current_folder(
    image_tree_tgz: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, elsewhere = tmp_path / "clone", tmp_path / "work" / "here"
    (repo / "vit").mkdir(parents=True)
    elsewhere.mkdir(parents=True)
    monkeypatch.setattr(vit.cifar10_source, "__file__", str(repo / "vit/cifar10_source.py"))
    monkeypatch.chdir(elsewhere)
    beside_repo = tmp_path / "shared/data/cifar10-jpeg.tar.gz"
    beside_cwd = tmp_path / "work/shared/data/cifar10-jpeg.tar.gz"
    assert vit.cifar10_source.shared_candidates() == [beside_repo.resolve(), beside_cwd.resolve()]
    beside_cwd.parent.mkdir(parents=True)
    shutil.copy(image_tree_tgz, beside_cwd)
    assert CIFAR10DataModule().locate().path == beside_cwd.resolve()
    beside_repo.parent.mkdir(parents=True)
    shutil.copy(image_tree_tgz, beside_repo)
    found = CIFAR10DataModule().locate()  # the repository's copy comes first
    assert found == vit.cifar10_source.Found(
        "folder", beside_repo.resolve(), "the shared JPEG copy"
    )
    assert CIFAR10DataModule(source="folder").locate().path == beside_repo.resolve()  # as before


def test_auto_finds_torchvision_release_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_shared: Path
) -> None:
    written = _write_fake_cifar(tmp_path / "cache")  # VIT_CACHE_DIR (the autouse fixture)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    dm = CIFAR10DataModule(val_size=5, batch_size=4)
    found = dm.locate(download=False)
    assert found == vit.cifar10_source.Found(
        "cifar10", tmp_path / "cache", "torchvision's release in the cache"
    )
    dm.setup("test")
    expected = torch.from_numpy(written["test_batch"]).view(4, 3, 32, 32)
    assert torch.equal(dm.test_dataset.images, expected)
    (tmp_path / "cache/cifar-10-batches-py/test_batch").unlink()  # an incomplete release
    assert not vit.cifar10_source.has_batches(tmp_path / "cache")
    assert CIFAR10DataModule(source="cifar10").locate().path == tmp_path / "cache"


def test_auto_downloads_into_the_cache_as_a_last_resort(
    tmp_path: Path, no_shared: Path, fake_download: type
) -> None:
    dm = CIFAR10DataModule()
    assert dm.classes == list(CIFAR10_CLASSES) and fake_download.calls == []  # never from classes
    found = dm.locate()
    assert found == vit.cifar10_source.Found(
        "cifar10", tmp_path / "cache", "a torchvision download"
    )
    assert fake_download.calls == [(str(tmp_path / "cache"), True)]


def test_auto_finding_nothing_names_each_place_and_the_fix(
    tmp_path: Path, no_shared: Path, fake_download: type
) -> None:
    fake_download.error = OSError("network is unreachable")
    with pytest.raises(ValueError) as err:
        CIFAR10DataModule().prepare_data()
    message = str(err.value)
    cache = tmp_path / "cache"
    for part in (
        "found no CIFAR-10; tried, in order: data.data_dir: not set; $VIT_DATA_DIR: not set; ",
        f"the JPEG copy at {no_shared}: absent; ",
        f"torchvision's release at {cache / 'cifar-10-batches-py'}: absent; ",
        f"a torchvision download into {cache}: failed (OSError: network is unreachable). ",
        "To fix: pass `--data.data_dir PATH`",
        "or set VIT_DATA_DIR=PATH.",
    ):
        assert part in message
    assert fake_download.calls == [(str(cache), True)]
    with pytest.raises(ValueError, match=r"a download: not tried \(download: false\)"):
        CIFAR10DataModule(download=False).locate()
    assert len(fake_download.calls) == 1  # download: false never touches the network


def test_from_checkpoint_keeps_old_settings_and_finds_moved_data(
    image_tree_tgz: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_shared: Path
) -> None:
    old = {"source": "folder", "data_dir": str(image_tree_tgz), "download": False, "seed": 3}
    ckpt = {"datamodule_hyper_parameters": old | {"_class_path": "vit.data.CIFAR10DataModule"}}
    dm = CIFAR10DataModule.from_checkpoint(ckpt, cache_dir=None)
    assert dm.hparams.source == "folder" and dm.locate().path == image_tree_tgz
    moved = {"datamodule_hyper_parameters": old | {"data_dir": str(tmp_path / "gone.tar.gz")}}
    monkeypatch.setenv("VIT_DATA_DIR", str(image_tree_tgz))
    dm = CIFAR10DataModule.from_checkpoint(moved)
    assert (dm.hparams.source, dm.hparams.seed) == ("auto", 3)
    assert dm.locate().place == "$VIT_DATA_DIR"
    _write_fake_cifar(tmp_path / "release")
    dm = CIFAR10DataModule.from_checkpoint(moved, data_dir=str(tmp_path / "release"))
    assert dm.locate().source == "cifar10"  # a given path decides its own kind


# ---- the real archive ------------------------------------------------------------------------


@pytest.mark.slow
def test_real_cifar10_archive(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not REAL_ARCHIVE.is_file():
        pytest.skip(f"real CIFAR-10 archive not found at {REAL_ARCHIVE}")
    cache = tmp_path_factory.mktemp("real-cache")
    train, train_labels, classes = load_folder_source(REAL_ARCHIVE, split="train", cache_dir=cache)
    test, test_labels, test_classes = load_folder_source(
        REAL_ARCHIVE, split="test", cache_dir=cache
    )
    assert classes == test_classes == list(CIFAR10_CLASSES)
    assert train.shape == (50_000, 3, 32, 32) and test.shape == (10_000, 3, 32, 32)
    assert train_labels.bincount().tolist() == [5000] * 10
    assert test_labels.bincount().tolist() == [1000] * 10
    mean = train.float().mean(dim=(0, 2, 3)) / 255
    torch.testing.assert_close(mean, torch.tensor(CIFAR10_MEAN), rtol=0, atol=2e-3)


def test_split_seed_fixes_the_validation_split_while_seed_changes_the_rest() -> None:
    a = CIFAR10DataModule(seed=0, val_size=100).split_indices(1000)
    b = CIFAR10DataModule(seed=1, split_seed=0, val_size=100).split_indices(1000)
    c = CIFAR10DataModule(seed=1, val_size=100).split_indices(1000)
    assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0])
    assert not torch.equal(a[1], c[1])
    with pytest.raises(ValueError, match="split_seed must be an integer >= 0"):
        CIFAR10DataModule(split_seed=-1)


def test_loaders_pin_batches_only_for_a_gpu(image_tree: Path) -> None:
    """Pinned batches reach a GPU without making the host wait; on a CPU pinning is waste."""
    dm = _datamodule(image_tree)
    dm.setup("fit")
    pinned = {}
    for device in (None, "cpu", "cuda"):
        dm.trainer = device and SimpleNamespace(
            strategy=SimpleNamespace(root_device=torch.device(device)), training=False
        )
        pinned[device] = (dm.train_dataloader().pin_memory, dm.val_dataloader().pin_memory)
    assert pinned == {None: (False, False), "cpu": (False, False), "cuda": (True, True)}


def test_augment_in_loader_draws_per_batch_from_its_indices(image_tree: Path) -> None:
    """Batches augmented where the loader gathers them: the same in any number of worker
    processes and after a mid-epoch resume, augmented once (not again after the transfer)."""
    from vit.data import batch_seed

    def batches(num_workers: int = 0, resume: dict | None = None, **kw) -> tuple:
        dm = _datamodule(image_tree, batch_size=8, num_workers=num_workers, **kw)
        dm.setup("fit")
        if resume is not None:
            dm.load_state_dict({"train_loader": resume})
        return dm, list(dm.train_dataloader())

    dm, moved = batches(augment_in_loader=True)
    _, raw = batches()  # the same order, not augmented in the loader
    assert len(moved) == len(raw) == 3
    for (a, la), (r, lr) in zip(moved, raw, strict=True):
        assert a.dtype == torch.uint8 and a.shape == r.shape and torch.equal(la, lr)
    assert any(not torch.equal(a, r) for (a, _), (r, _) in zip(moved, raw, strict=True))
    again = batches(augment_in_loader=True)[1]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(moved, again, strict=True))
    workers = batches(num_workers=2, augment_in_loader=True)[1]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(moved, workers, strict=True))
    resumed = batches(resume={"epoch": 0, "consumed": 1}, augment_in_loader=True)[1]
    assert len(resumed) == 2
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(moved[1:], resumed, strict=True))
    # after the transfer only normalisation: the loader's augmentation is not done twice
    dm.trainer = SimpleNamespace(training=True, global_step=5, global_rank=0)
    images, labels = moved[0]
    assert torch.equal(dm.on_after_batch_transfer((images, labels), 0)[0], preprocess(images))
    assert batch_seed([1, 2, 3], 0) == batch_seed([1, 2, 3], 0)
    assert len({batch_seed([1, 2, 3], 0), batch_seed([3, 2, 1], 0), batch_seed([1, 2, 3], 1)}) == 3
