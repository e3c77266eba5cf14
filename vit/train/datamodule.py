"""CIFAR data: the in-memory dataset and the DataModule over the `folder`, `cifar10` and
`cifar100` sources.

By default (`source: auto`) the DataModule finds CIFAR-10 itself (vit/data/cifar10_source.py);
`source: cifar100` reads CIFAR-100's release (vit/data/cifar100_source.py). Images
live in memory as uint8 tensors (decoded once: vit/data/folder_source.py). Batches leave the
DataLoader as uint8 and are augmented and normalized on the training device in
`on_after_batch_transfer`; with `augment_in_loader` the training batches are augmented on the CPU
where the loader gathers them (its worker processes, with num_workers > 0) instead.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader

from vit.data.augment import TrainAugment
from vit.data.cifar10_source import SHARED_COPY, Found
from vit.data.cifar100_source import LabelKind
from vit.data.datasets import (
    CIFAR10_CLASSES,
    CIFAR10_NORMALIZATION,
    AugmentedDataset,
    IndexDataset,
    Normalization,
    TensorImageDataset,
    channel_statistics,
    collate_batch,
    preprocess,
    split_train_val,
)
from vit.data.folder_source import Loaded, Split
from vit.data.loader import ResumableDataLoader
from vit.data.settings import SourceKind, check_data_settings
from vit.data.sources import find_source, load_split, prepare_source, source_classes

log = logging.getLogger(__name__)


def validation_seed(data: Any) -> Any:
    """The seed that draws the validation split, from a datamodule's options (its hparams, or a
    config's or checkpoint's `data`): split_seed, else seed."""
    split_seed = data.get("split_seed")
    return data.get("seed") if split_seed is None else split_seed


class CIFAR10DataModule(L.LightningDataModule):
    """CIFAR-10 loaders of uint8 batches, augmented and normalized after the device transfer.

    With `augment_in_loader` each batch's draws come from its own indices and the seed
    (`batch_seed`) rather than from the step, so a resumed run still augments alike.

    Args:
        source: auto finds CIFAR-10 (order: vit/data/cifar10_source.py); folder or cifar10 read
            data_dir; cifar100 reads CIFAR-100's release (data_dir or the cache folder).
        data_dir: an image folder or .tar.gz of one, or a folder holding cifar-10-batches-py
            (cifar-100-python, or its .tar.gz, for cifar100).
        cache_dir: where decoded tensors and downloads go (default $VIT_CACHE_DIR or ~/.cache/vit).
        download: may torchvision fetch the data? null: as auto's (and cifar100's) last resort
            only; false: never.
        cifar100_labels: CIFAR-100's 100 fine classes or its 20 coarse superclasses.
        image_size: side the images are resized to; 32 keeps CIFAR-10's own pixels.
        batch_size: training images per step and device; the recipes tune the learning rate with it.
        eval_batch_size: images per validation or test batch (default: twice batch_size).
        val_size: training-split images held out for validation; the test split stays untouched.
            0: a fit on all of them without validation (vit-train's --test_after_fit then
            scores last.ckpt), as a final fit once the choices are made.
        train_subset: train on this many of the remaining images (nested across sizes); null: all.
        seed: seeds the batch order, the augmentation and (unless split_seed) the validation split.
        split_seed: fixes the validation split apart from seed, to compare seeds on one split.
        num_workers: loader processes; 0 suits in-memory data, more feed a GPU (augment_in_loader).
        crop_padding: pixels padded before the random crop back to image_size; 0: no crop.
        hflip: flip half the training images left to right.
        trivial_augment: TrivialAugment per image, as in experiments/cifar10_full.yaml.
        rand_augment_ops: RandAugment's ops per image instead (0: off; 2 as timm's rand-m9-n2).
        rand_augment_magnitude: RandAugment's one magnitude bin, 0-30.
        random_erasing: the share of training images given one box of random pixels, after the
            other augmentation (vit/data/erasing.py; 0: off; 0.25 is DeiT's and timm's --reprob).
        augment_in_loader: augment on the CPU as the loader gathers batches, not on the device.
        device_data: keep the training split on the training device as uint8 and gather each
            batch there: the loader yields positions only (for a GPU; not with augment_in_loader).
        drop_last: drop each epoch's last partial batch, so every step sees batch_size images.
        compile_augment: run the training augmentation on the device as one compiled graph,
            its draws made on the host (for a GPU; not with augment_in_loader).
    """

    def __init__(
        self,
        *,
        source: SourceKind = "auto",
        data_dir: str | None = None,
        cache_dir: str | None = None,
        download: bool | None = None,
        cifar100_labels: LabelKind = "fine",
        image_size: int = 32,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        val_size: int = 5000,
        train_subset: int | None = None,
        seed: int = 0,
        split_seed: int | None = None,
        num_workers: int = 0,
        crop_padding: int = 4,
        hflip: bool = True,
        trivial_augment: bool = False,
        rand_augment_ops: int = 0,
        rand_augment_magnitude: int = 9,
        random_erasing: float = 0.0,
        augment_in_loader: bool = False,
        device_data: bool = False,
        drop_last: bool = True,
        compile_augment: bool = False,
    ) -> None:
        super().__init__()
        check_data_settings(locals())
        self.save_hyperparameters()
        self.eval_batch_size = eval_batch_size or 2 * batch_size
        self.train_augment = TrainAugment(
            padding=crop_padding,
            hflip=hflip,
            trivial=trivial_augment,
            rand_ops=rand_augment_ops,
            rand_magnitude=rand_augment_magnitude,
            erase_prob=random_erasing,
            compiled=compile_augment,
        )
        self.train_dataset: TensorImageDataset | None = None
        self.val_dataset: TensorImageDataset | None = None
        self.test_dataset: TensorImageDataset | None = None
        self._classes: list[str] | None = None
        self._found: Found | None = None
        self._train_loader: ResumableDataLoader | None = None
        self._resume_state: dict[str, int] | None = None
        self._device_split: tuple[Tensor, Tensor] | None = None  # device_data's copy
        self._data_normalization: Normalization | None = None  # the training split's statistics
        self._model_normalization: Normalization | None = None  # what the model says, if it does

    @classmethod
    def from_checkpoint(cls, ckpt: dict[str, Any], **overrides: Any) -> CIFAR10DataModule:
        """The data module a vit-train checkpoint was trained with; overrides that are not None
        replace its settings. A data_dir given without a source is classified as `auto` does
        (a CIFAR-100 model's stays CIFAR-100's); a folder source saved at a path that is absent
        here (another machine) becomes the search."""
        accepted = inspect.signature(cls.__init__).parameters
        saved = ckpt.get("datamodule_hyper_parameters") or {}
        args = {k: v for k, v in saved.items() if k in accepted}  # drops LightningCLI's own keys
        given = {k: v for k, v in overrides.items() if v is not None}
        if "data_dir" in given and "source" not in given:  # CIFAR-100 stays CIFAR-100
            given["source"] = "cifar100" if args.get("source") == "cifar100" else "auto"
        elif not {"data_dir", "source"} & set(given) and args.get("source") == "folder":
            saved_dir = Path(args.get("data_dir") or "").expanduser()
            if args.get("data_dir") and not saved_dir.exists():
                log.warning("CIFAR-10 is not at %s as when trained; searching for it", saved_dir)
                given |= {"source": "auto", "data_dir": None, "download": None}
        return cls(**{**args, **given})

    def locate(self, *, download: bool | None = None) -> Found:
        """Where the data is read from (vit/data/cifar10_source.py's `locate`), found once and logged;
        `download` overrides the configured permission for a search not yet run."""
        if self._found is None:
            hp = self.hparams
            allowed = hp.download is not False if download is None else download
            found = find_source(hp.source, hp.data_dir, cache_dir=hp.cache_dir, download=allowed)
            # a folder the user names may hold any images: CIFAR-10 only when known to be
            name = {"cifar100": "CIFAR-100", "cifar10": "CIFAR-10"}.get(found.source) or (
                "CIFAR-10" if found.place == SHARED_COPY else "images"
            )
            rank_zero_info(f"{name}: {found.source} source at {found.path} ({found.place})")
            self._found = found
        return self._found

    @property
    def classes(self) -> list[str]:
        """Class names in label order; known before setup (a folder source is decoded if needed)."""
        if self._classes is None:
            try:  # never a download here: that is prepare_data's, on one process per node
                found = self.locate(download=False)
            except ValueError:  # nothing yet: the search can only end in CIFAR-10's release
                if self.hparams.source == "cifar100":
                    raise
                return list(CIFAR10_CLASSES)
            hp = self.hparams
            self._classes = source_classes(
                found, image_size=hp.image_size, cache_dir=hp.cache_dir, labels=hp.cifar100_labels
            )
        return self._classes

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def _load(self, split: Split, *, mmap: bool = False) -> Loaded:
        hp = self.hparams
        return load_split(
            self.locate(),
            split,
            image_size=hp.image_size,
            cache_dir=hp.cache_dir,
            labels=hp.cifar100_labels,
            fetch=self._fetch,
            mmap=mmap,
        )

    @property
    def _fetch(self) -> bool:
        """Whether an explicit cifar10 source downloads what is missing (auto's search did)."""
        return self.hparams.source == "cifar10" and bool(self.hparams.download)

    def prepare_data(self) -> None:
        """Find (auto), download (cifar10) or decode and cache (folder) once per node."""
        hp = self.hparams
        prepare_source(
            self.locate(), image_size=hp.image_size, cache_dir=hp.cache_dir, fetch=self._fetch
        )

    def split_indices(self, num_images: int) -> tuple[Tensor, Tensor]:
        """(train, val) indices into the training split: a seeded permutation, val taken first."""
        hp = self.hparams
        return split_train_val(
            num_images,
            val_size=hp.val_size,
            seed=validation_seed(hp),
            train_subset=hp.train_subset,
        )

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit", "validate") and self.train_dataset is None:
            images, labels, self._classes = self._load("train")
            if self.locate().source == "cifar100":
                self._data_normalization = channel_statistics(images)
            train, val = self.split_indices(len(labels))
            self.train_dataset = TensorImageDataset(images[train], labels[train])
            self.val_dataset = TensorImageDataset(images[val], labels[val])
        if stage in (None, "test", "predict") and self.test_dataset is None:
            images, labels, self._classes = self._load("test")
            self.test_dataset = TensorImageDataset(images, labels)

    def _loader(
        self, dataset: TensorImageDataset | None, *, stage: str, train: bool = False
    ) -> DataLoader:
        if dataset is None:
            raise RuntimeError(
                f"no {stage} data yet: call setup({stage!r}) before asking for its dataloader."
            )
        workers = self.hparams.num_workers
        # pinned batches go to a GPU without making the host wait for the GPU's queue
        pin = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        common = dict(
            num_workers=workers,
            collate_fn=collate_batch,
            persistent_workers=workers > 0,
            pin_memory=pin,
        )
        if train:  # order = f(seed, epoch); resumes mid-epoch from a checkpoint
            if self.hparams.augment_in_loader:
                dataset = AugmentedDataset(dataset, self.train_augment, seed=self.hparams.seed)
            elif self.hparams.device_data:  # the same order; the images are gathered on device
                dataset = IndexDataset(len(dataset))
            self._train_loader = ResumableDataLoader(
                dataset,
                batch_size=self.hparams.batch_size,
                seed=self.hparams.seed,
                drop_last=self.hparams.drop_last,
                **common,
            )
            if self._resume_state is not None:
                self._train_loader.load_state_dict(self._resume_state)
                self._resume_state = None
            return self._train_loader
        # a generator of its own: starting an evaluation never draws from the global RNG, so a
        # resumed run (which runs a sanity check first) keeps the dropout draws of the original
        generator = torch.Generator().manual_seed(self.hparams.seed)
        return DataLoader(
            dataset, batch_size=self.eval_batch_size, shuffle=False, generator=generator, **common
        )

    def _on_device(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """The training split's images and labels on `device`, copied there once."""
        if self._device_split is None or self._device_split[0].device != device:
            data = self.train_dataset
            assert data is not None, "setup('fit') comes before the training batches"
            self._device_split = (data.images.to(device), data.labels.to(device))
        return self._device_split

    @property
    def normalization(self) -> Normalization:
        """The mean and std the batches are normalized with: the model's where it records one
        (use_normalization), else the data's: CIFAR-100's computed from its whole training
        split (validation images included, as CIFAR-10's constants were), CIFAR-10's otherwise."""
        if self._model_normalization is not None:
            return self._model_normalization
        if self.locate().source != "cifar100":
            return CIFAR10_NORMALIZATION
        if self._data_normalization is None:  # evaluating only: the training split is not loaded
            self._data_normalization = channel_statistics(self._load("train")[0])
        return self._data_normalization

    def use_normalization(self, normalization: Normalization) -> None:
        """Normalize with the model's mean and std (a fine-tune's source, a resumed fit's)."""
        self._model_normalization = Normalization(*normalization)

    def state_dict(self) -> dict[str, Any]:
        """Saved in checkpoints: where the training loader is within its epoch."""
        return {"train_loader": self._train_loader.state_dict()} if self._train_loader else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restored before training starts; the next train loader resumes from it. (Lightning
        builds the train loader before it restores loop state, so its own loader restore misses.)"""
        self._resume_state = state.get("train_loader")

    def train_dataloader(self) -> DataLoader:
        hp, data = self.hparams, self.train_dataset
        if data is not None and hp.drop_last and len(data) < hp.batch_size:
            raise ValueError(
                f"only {len(data)} training images for batch_size={hp.batch_size} with "
                "drop_last=True: every epoch would be empty; lower batch_size or set "
                "drop_last: false."
            )
        return self._loader(self.train_dataset, stage="fit", train=True)

    def val_dataloader(self) -> DataLoader:
        if self.hparams.val_size == 0 and self.trainer and self.trainer.state.fn == "validate":
            # a fit with val_size 0 skips validation; trainer.validate would score nothing, quietly
            raise ValueError(
                "trainer.validate with data.val_size 0: no images are held out, so there is no "
                "validation split to score. Give val_size > 0 (the screens hold out 5000), or "
                "score the test split with trainer.test."
            )
        return self._loader(self.val_dataset, stage="validate")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, stage="test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, stage="predict")

    def on_after_batch_transfer(
        self, batch: tuple[Tensor, Tensor], dataloader_idx: int
    ) -> tuple[Tensor, Tensor]:
        """uint8 batch on device -> (augmented only while training) normalized float32 images.
        With device_data, a training batch arrives as positions and is gathered here."""
        trainer = self.trainer
        if isinstance(batch, Tensor):  # IndexDataset's positions: the split lives on the device
            images, labels = self._on_device(batch.device)
            batch = images[batch], labels[batch]
        images, labels = batch
        if trainer is not None and trainer.training:
            if not self.hparams.augment_in_loader:
                # the draws are a function of (seed, step, rank): a resumed run augments alike
                seed = (
                    self.hparams.seed * 1_000_003 + trainer.global_step
                ) * 1024 + trainer.global_rank
                images = self.train_augment(images, generator=torch.Generator().manual_seed(seed))
            if self._train_loader is not None:
                self._train_loader.count_consumed()  # this batch is trained on: saved on resume
        return preprocess(images, self.normalization), labels
