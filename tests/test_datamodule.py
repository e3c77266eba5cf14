"""vit.train.datamodule's CIFAR10DataModule: seeded train/val splits and subsets, its loaders,
normalisation and augmentation after the transfer (or in the loader), from_checkpoint, bad values."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import quiet_trainer, sum_tol, tiny_datamodule, write_fake_cifar
from vit.data.datasets import CIFAR10_MEAN, CIFAR10_STD, TensorImageDataset, preprocess
from vit.train.datamodule import CIFAR10DataModule

pytestmark = pytest.mark.usefixtures("cache_in_tmp")  # no test reads or writes the user's cache


def test_validation_split_is_disjoint_sized_and_seeded(image_tree: Path) -> None:
    dm = tiny_datamodule(image_tree, val_size=6, seed=0)
    dm.setup("fit")
    assert len(dm.train_dataset) == 30 and len(dm.val_dataset) == 6
    train, val = dm.split_indices(36)
    assert set(train.tolist()).isdisjoint(val.tolist())
    assert sorted(train.tolist() + val.tolist()) == list(range(36))
    same, other = tiny_datamodule(image_tree, seed=0), tiny_datamodule(image_tree, seed=1)
    same.setup("fit")
    other.setup("fit")
    assert torch.equal(same.val_dataset.images, dm.val_dataset.images)
    assert not torch.equal(other.val_dataset.images, dm.val_dataset.images)
    assert dm.test_dataset is None  # test images only for test/predict


def test_train_subset_is_a_seeded_nested_subset(image_tree: Path) -> None:
    full = tiny_datamodule(image_tree).split_indices(36)
    small = tiny_datamodule(image_tree, train_subset=10).split_indices(36)
    larger = tiny_datamodule(image_tree, train_subset=20).split_indices(36)
    assert len(small[0]) == 10 and torch.equal(small[1], full[1])
    assert set(small[0].tolist()) <= set(larger[0].tolist()) <= set(full[0].tolist())
    with pytest.raises(ValueError, match="train_subset=31 exceeds the 30 training images"):
        tiny_datamodule(image_tree, train_subset=31).setup("fit")


def test_split_size_errors(image_tree: Path) -> None:
    with pytest.raises(
        ValueError, match="val_size=36 leaves no training images.*choose val_size < 36"
    ):
        tiny_datamodule(image_tree, val_size=36).setup("fit")
    dm = tiny_datamodule(image_tree, train_subset=4, batch_size=8)
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
        (
            dict(source="imagenet"),
            "source must be 'auto', 'folder', 'cifar10' or 'cifar100', got 'imagenet'",
        ),
        (dict(trivial_augment=True, rand_augment_ops=2), "choose one"),
        (dict(rand_augment_ops=2, rand_augment_magnitude=40), r"in \[0, 30\], got 40"),
        (dict(random_erasing=1.5), r"random_erasing must be a probability in \[0, 1\], got 1.5"),
    ],
)
def test_init_rejects_bad_values(tmp_path: Path, kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        tiny_datamodule(tmp_path, **kwargs)


def test_hparams_classes_before_setup_and_loaders(
    image_tree_tgz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dm = tiny_datamodule(image_tree_tgz, batch_size=8)
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
    dm = tiny_datamodule(image_tree, num_workers=1)
    dm.setup("fit")
    loader = dm.val_dataloader()
    assert loader.persistent_workers
    (images, labels), *rest = list(loader)  # the whole epoch, so the worker idles at the end
    assert not rest
    assert torch.equal(images, dm.val_dataset.images) and torch.equal(labels, dm.val_dataset.labels)
    loader._iterator._shutdown_workers()  # now, not at some later garbage collection


def test_after_transfer_normalizes_and_augments_only_in_training(image_tree: Path) -> None:
    dm = tiny_datamodule(image_tree)
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    expected = preprocess(images)
    for trainer in (None, SimpleNamespace(training=False)):
        dm.trainer = trainer
        out, out_labels = dm.on_after_batch_transfer((images, labels), 0)
        assert out.dtype == torch.float32 and torch.equal(out, expected)
        assert out_labels is labels
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
    # three roundings each way (the error of x / std undone by * std), of values up to 255
    torch.testing.assert_close(raw, raw.round(), rtol=0, atol=sum_tol(torch.float32, 6, 255))
    plain = tiny_datamodule(image_tree, crop_padding=0, hflip=False)
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
    dm, model = tiny_datamodule(image_tree), _Recorder()
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


def test_from_checkpoint_keeps_old_settings_and_finds_moved_data(
    image_tree_tgz: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_shared: Path
) -> None:
    old = {"source": "folder", "data_dir": str(image_tree_tgz), "download": False, "seed": 3}
    ckpt = {
        "datamodule_hyper_parameters": old
        | {"_class_path": "vit.train.datamodule.CIFAR10DataModule"}
    }
    dm = CIFAR10DataModule.from_checkpoint(ckpt, cache_dir=None)
    assert dm.hparams.source == "folder" and dm.locate().path == image_tree_tgz
    moved = {"datamodule_hyper_parameters": old | {"data_dir": str(tmp_path / "gone.tar.gz")}}
    monkeypatch.setenv("VIT_DATA_DIR", str(image_tree_tgz))
    dm = CIFAR10DataModule.from_checkpoint(moved)
    assert (dm.hparams.source, dm.hparams.seed) == ("auto", 3)
    assert dm.locate().place == "$VIT_DATA_DIR"
    write_fake_cifar(tmp_path / "release")
    dm = CIFAR10DataModule.from_checkpoint(moved, data_dir=str(tmp_path / "release"))
    assert dm.locate().source == "cifar10"  # a given path decides its own kind


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
    dm = tiny_datamodule(image_tree)
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
    from vit.data.datasets import batch_seed

    def batches(num_workers: int = 0, resume: dict | None = None, **kw) -> tuple:
        dm = tiny_datamodule(image_tree, batch_size=8, num_workers=num_workers, **kw)
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


def test_device_data_gathers_the_same_batches_on_the_device(image_tree: Path) -> None:
    """device_data: the loader yields positions and the batch is gathered from the split's copy
    on the training device; the steps see exactly the batches (order, labels, augmentation) of
    the default path, across two epochs."""

    def fit(**kwargs: object) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        labels: list[torch.Tensor] = []

        class Labels(_Recorder):
            def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN202
                labels.append(batch[1])
                return super().training_step(batch, batch_idx)

        dm, model = tiny_datamodule(image_tree, **kwargs), Labels()
        trainer = quiet_trainer(None, accelerator="cpu", max_epochs=2, num_sanity_val_steps=0)
        trainer.fit(model, datamodule=dm)
        return model.seen["train"], labels

    images, labels = fit()
    on_device, device_labels = fit(device_data=True)
    assert len(images) == len(on_device) == 6  # 30 training images, batches of 8, 2 epochs
    assert all(torch.equal(a, b) for a, b in zip(images, on_device, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(labels, device_labels, strict=True))


def test_device_data_loader_yields_positions_only(image_tree: Path) -> None:
    dm = tiny_datamodule(image_tree, device_data=True)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch.dtype == torch.long and batch.shape == (8,)
    assert int(batch.max()) < len(dm.train_dataset)


@pytest.mark.parametrize("option", ["device_data", "compile_augment"])
def test_augmenting_on_the_device_and_in_the_loader_exclude_each_other(
    tmp_path: Path, option: str
) -> None:
    with pytest.raises(ValueError) as error:
        tiny_datamodule(tmp_path, **{option: True}, augment_in_loader=True)
    assert str(error.value) == (
        f"{option} augments the training images on the device; augment_in_loader augments "
        "them on the CPU in the loader: choose one."
    )


def test_compile_augment_reaches_the_training_augmentation(tmp_path: Path) -> None:
    assert tiny_datamodule(tmp_path, compile_augment=True).train_augment.compiled
    assert not tiny_datamodule(tmp_path).train_augment.compiled  # eager unless asked


def test_randaugment_settings_reach_the_training_augmentation(tmp_path: Path) -> None:
    augment = tiny_datamodule(tmp_path, rand_augment_ops=2, rand_augment_magnitude=7).train_augment
    assert (augment.rand_ops, augment.rand_magnitude, augment.trivial) == (2, 7, False)
    assert tiny_datamodule(tmp_path).train_augment.rand_ops == 0  # off unless asked


def test_random_erasing_reaches_the_training_augmentation(tmp_path: Path) -> None:
    assert tiny_datamodule(tmp_path, random_erasing=0.25).train_augment.erase_prob == 0.25
    assert tiny_datamodule(tmp_path).train_augment.erase_prob == 0.0  # off unless asked


def test_the_log_names_cifar10_only_where_the_images_are_known_to_be_it(
    image_tree: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vit.data.cifar10_source import SHARED_COPY, Found

    caplog.set_level("INFO")
    CIFAR10DataModule(data_dir=str(image_tree)).locate()  # a folder the user names: any images
    assert f"images: folder source at {image_tree} (data.data_dir)" in caplog.text
    assert "CIFAR-10" not in caplog.text
    caplog.clear()
    shared = Found("folder", image_tree, SHARED_COPY)  # as the search finds ../shared's copy
    monkeypatch.setattr("vit.train.datamodule.find_source", lambda *args, **kwargs: shared)
    CIFAR10DataModule().locate()
    assert f"CIFAR-10: folder source at {image_tree} ({SHARED_COPY})" in caplog.text
