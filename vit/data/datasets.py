"""In-memory image datasets: uint8 tensors, batched reads, the training split's seeded
augmentation in the loader, and normalisation for evaluation."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.data import Dataset, default_collate

from vit.data.augment import TrainAugment, normalize

log = logging.getLogger(__name__)


CIFAR10_CLASSES = tuple("airplane automobile bird cat deer dog frog horse ship truck".split())


CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)


CIFAR10_STD = (0.2470, 0.2435, 0.2616)


class Normalization(NamedTuple):
    """The per-channel mean and std (of pixels scaled to [0, 1]) a model's inputs are normalized
    with: a property of the trained weights, recorded with them (checkpoint, .safetensors,
    save_pretrained folder) and read back by every command that feeds the model images."""

    mean: tuple[float, ...]
    std: tuple[float, ...]


CIFAR10_NORMALIZATION = Normalization(CIFAR10_MEAN, CIFAR10_STD)


def channel_statistics(images: Tensor) -> Normalization:
    """Mean and std per channel of uint8 images (N, C, H, W), over every pixel of every image,
    scaled to [0, 1]. The sums are exact integers (int64), so the result does not depend on the
    order of a floating-point reduction; rounded to 6 decimals for a readable hparams.yaml."""
    if images.dim() != 4 or images.dtype != torch.uint8 or images.numel() == 0:
        raise ValueError(
            f"channel_statistics expects uint8 images (N, C, H, W), got {images.dtype} "
            f"{tuple(images.shape)}."
        )
    count = images.numel() // images.shape[1]
    means, stds = [], []
    for c in range(images.shape[1]):
        plane = images[:, c].to(torch.int64)
        total, squares = plane.sum().item(), (plane * plane).sum().item()
        mean = total / count
        var = max(squares / count - mean * mean, 0.0)  # from exact sums: no cancellation to fear
        means.append(round(mean / 255, 6))
        stds.append(round(math.sqrt(var) / 255, 6))
    return Normalization(tuple(means), tuple(stds))


def recorded_normalization(ckpt: Mapping[str, Any]) -> Normalization:
    """The normalization a checkpoint (or load_model's dict) records in its hyper_parameters'
    `mean` and `std`; CIFAR-10's where it records none (every model trained before they were
    recorded was trained with CIFAR-10's)."""
    hparams = ckpt.get("hyper_parameters") or {}
    mean, std = hparams.get("mean"), hparams.get("std")
    if mean is None and std is None:
        return CIFAR10_NORMALIZATION
    return checked_normalization(mean, std, where="the checkpoint's hyper_parameters")


def checked_normalization(mean: Any, std: Any, *, where: str) -> Normalization:
    """`mean` and `std` as a Normalization: three finite numbers each, every std above 0."""

    def numbers(values: Any) -> tuple[float, ...] | None:
        try:
            out = tuple(float(v) for v in values)
        except (TypeError, ValueError):
            return None
        return out if len(out) == 3 and all(math.isfinite(v) for v in out) else None

    m, s = numbers(mean), numbers(std)
    if m is None or s is None or min(s) <= 0:
        raise ValueError(
            f"{where}: mean={mean!r}, std={std!r}; expected three finite numbers each (one per "
            f"RGB channel, of pixels in [0, 1]), every std above 0, e.g. mean={list(CIFAR10_MEAN)} "
            f"std={list(CIFAR10_STD)}."
        )
    return Normalization(m, s)


def split_train_val(
    num_images: int, *, val_size: int, seed: int, train_subset: int | None = None
) -> tuple[Tensor, Tensor]:
    """(train, val) sorted indices into a training split of `num_images`: one seeded permutation,
    validation taken first; `train_subset` keeps the first of the rest, so subsets are nested."""
    if val_size >= num_images:
        raise ValueError(
            f"val_size={val_size} leaves no training images: the training split has "
            f"{num_images}; choose val_size < {num_images}."
        )
    perm = torch.randperm(num_images, generator=torch.Generator().manual_seed(seed))
    val, train = perm[:val_size], perm[val_size:]
    if train_subset is not None:
        if train_subset > len(train):
            raise ValueError(
                f"train_subset={train_subset} exceeds the {len(train)} training images "
                f"left after val_size={val_size}; lower it or set it to None."
            )
        train = train[:train_subset]
    return train.sort().values, val.sort().values


def preprocess(images: Tensor, normalization: Normalization = CIFAR10_NORMALIZATION) -> Tensor:
    """uint8 (B, 3, H, W) -> float32 normalized with a model's mean and std (CIFAR-10's unless
    given; no augmentation)."""
    return normalize(images, normalization.mean, normalization.std)


class TensorImageDataset(Dataset):
    """uint8 images (N, 3, H, W) and int64 labels (N,) in memory; a batch is one indexing op."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        if images.dim() != 4 or images.dtype != torch.uint8:
            raise ValueError(
                f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}."
            )
        if labels.shape != (images.shape[0],):
            raise ValueError(
                f"labels must be shaped ({images.shape[0]},) like the images, "
                f"got {tuple(labels.shape)}."
            )
        self.images = images
        self.labels = labels.long()

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        """A whole batch at once; torch's DataLoader fetcher calls this instead of __getitem__."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.images[idx], self.labels[idx]  # (B, 3, H, W), (B,)


class IndexDataset(Dataset):
    """Positions 0..N-1 only: the training loader of a split that stays on the training device
    (CIFAR10DataModule's device_data), where the batch's images are then gathered. A batch is a
    (B,) int64 tensor: a few bytes to copy instead of B images."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Tensor:
        return torch.tensor(index, dtype=torch.long)

    def __getitems__(self, indices: list[int]) -> Tensor:
        return torch.as_tensor(indices, dtype=torch.long)  # (B,)


def batch_seed(indices: list[int], seed: int) -> int:
    """A 63-bit seed from a batch's indices and the data seed: the same batch draws alike in any
    process or after a resume; the next epoch's batches (a new permutation) draw afresh."""
    digest = hashlib.blake2b(
        torch.as_tensor(indices, dtype=torch.long).numpy().tobytes(),
        digest_size=8,
        key=int(seed).to_bytes(8, "little"),
    ).digest()
    return int.from_bytes(digest, "little") >> 1


class AugmentedDataset(Dataset):
    """Training batches augmented on the CPU as they are gathered: in the DataLoader's worker
    processes when num_workers > 0, so that on a GPU the augmentation runs beside the step
    instead of in it. Draws are seeded per batch by `batch_seed`."""

    def __init__(self, base: TensorImageDataset, augment: TrainAugment, *, seed: int) -> None:
        self.base, self.augment, self.seed = base, augment, seed

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        images, labels = self.__getitems__([index])
        return images[0], labels[0]

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        images, labels = self.base.__getitems__(indices)
        generator = torch.Generator().manual_seed(batch_seed(indices, self.seed))
        return self.augment(images, generator=generator), labels


def collate_batch(batch: Any) -> Any:
    """Pass an (images, labels) or an index batch from `__getitems__` through; default-collate
    anything else."""
    if isinstance(batch, Tensor) and batch.dim() == 1 and batch.dtype == torch.long:
        return batch  # IndexDataset's
    if isinstance(batch, tuple) and len(batch) == 2 and all(isinstance(t, Tensor) for t in batch):
        if batch[0].dim() == 4 and batch[1].dim() == 1:
            return batch
    return default_collate(batch)
