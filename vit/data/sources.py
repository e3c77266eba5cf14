"""The one place that dispatches on a data source's kind: where it is (`find_source`), what it
needs once per node before any process reads it (`prepare_source`), a split's images
(`load_split`) and the class names (`source_classes`). `auto`, `folder` and `cifar10` are
CIFAR-10's sources (vit/data/cifar10_source.py, vit/data/folder_source.py); `cifar100` is
CIFAR-100's release (vit/data/cifar100_source.py)."""

from __future__ import annotations

from torchvision.transforms.v2.functional import resize

from vit.data.cifar10_source import Found, load_cifar10, locate
from vit.data.cifar100_source import LabelKind, cifar100_classes, find_cifar100, load_cifar100
from vit.data.datasets import CIFAR10_CLASSES
from vit.data.folder_source import SPLITS, Loaded, Split, load_folder_source, prepare_folder_source


def find_source(
    source: str, data_dir: str | None, *, cache_dir: str | None, download: bool
) -> Found:
    """Where `source` reads from; `download`: whether a search may end in a download."""
    if source == "cifar100":
        root = find_cifar100(data_dir, cache_dir=cache_dir, download=download)
        return Found("cifar100", root, "data.data_dir" if data_dir else "the cache")
    return locate(source, data_dir, cache_dir=cache_dir, download=download)


def prepare_source(found: Found, *, image_size: int, cache_dir: str | None, fetch: bool) -> None:
    """Download (an explicit cifar10 source with `fetch`) or decode and cache (folder) once."""
    if found.source == "cifar10":
        for split in SPLITS:
            load_cifar10(found.path, split=split, download=fetch)
    elif found.source == "folder":
        prepare_folder_source(found.path, image_size=image_size, cache_dir=cache_dir)


def load_split(
    found: Found,
    split: Split,
    *,
    image_size: int,
    cache_dir: str | None,
    labels: LabelKind = "fine",
    fetch: bool = False,
    mmap: bool = False,
) -> Loaded:
    """(uint8 images at image_size, int64 labels, class names) of one split; `labels` picks
    CIFAR-100's fine or coarse classes; `mmap` maps a folder source's cache instead of reading it."""
    if found.source == "folder":
        return load_folder_source(
            found.path, split=split, image_size=image_size, cache_dir=cache_dir, mmap=mmap
        )
    if found.source == "cifar10":
        images, targets, classes = load_cifar10(found.path, split=split, download=fetch)
    else:
        images, targets, classes = load_cifar100(found.path, split=split, labels=labels)
    if images.shape[-1] != image_size:
        images = resize(images, [image_size, image_size], antialias=True)
    return images, targets, classes


def source_classes(
    found: Found, *, image_size: int, cache_dir: str | None, labels: LabelKind = "fine"
) -> list[str]:
    """Class names in label order, read as cheaply as the source allows: CIFAR-10's are known,
    CIFAR-100's are in its meta file, a folder's come with its decoded cache (mapped, not read)."""
    if found.source == "cifar10":
        return list(CIFAR10_CLASSES)
    if found.source == "cifar100":
        return cifar100_classes(found.path, labels=labels)
    return load_split(found, "train", image_size=image_size, cache_dir=cache_dir, mmap=True)[2]
