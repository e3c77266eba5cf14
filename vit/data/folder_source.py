"""The `folder` source: an image-folder tree, or a .tar/.tar.gz of one, decoded once to cached tensors.

The tree is `train/<class>/<image>` and `test/<class>/<image>`, either a folder or a
.tar/.tar.gz/.tgz of one (optionally under one top-level folder). Archives are decoded straight
from their members in memory, never unpacked to disk. Both splits are decoded once into
`<cache_dir>/<name>-<size>px-<key>/{train,test}.pt` (dicts of images, labels, classes), where the
key hashes the resolved path, the image size and the source's size and mtime (every file's, for a
folder), so a changed source is decoded afresh. A cache file damaged behind our back (truncated,
overwritten, or of another layout) is decoded afresh too. Torch, torchvision and PIL only.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torchvision.transforms.v2.functional import resize, to_dtype

from vit.system.paths import default_cache_dir

try:  # deprecated in torchvision 0.29 (for TorchCodec) but faster than PIL on these JPEGs
    from torchvision.io import ImageReadMode, decode_image
except ImportError:  # pragma: no cover - a torchvision without it: PIL decodes everything
    decode_image = None

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})
SPLITS = ("train", "test")
_LAYOUT = "<root>/<class>/<image>"
_SOURCE_HELP = (
    "expected a folder holding train/<class>/<image> and test/<class>/<image>, or a "
    ".tar/.tar.gz/.tgz of one; point `data_dir` at it, or use `source: cifar10` with a "
    "`data_dir` holding cifar-10-batches-py"
)
_CACHE_VERSION = 1

Split = Literal["train", "test"]
Tree = dict[str, list[tuple[str, "bytes | Path"]]]  # class -> [(name for errors, bytes or file)]
Loaded = tuple[Tensor, Tensor, list[str]]  # images (N, 3, H, W) uint8, labels (N,) int64, classes


def decode_image_bytes(data: bytes, *, name: str) -> Tensor:
    """Encoded bytes -> (3, H, W) uint8 RGB, gray/RGBA/palette converted. torchvision's decoder
    (2.4 s vs PIL's 7.2 s for the 60k CIFAR JPEGs, same pixels) goes first; PIL reads the rest."""
    try:
        if decode_image is None:
            raise RuntimeError("torchvision.io cannot decode images")
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        image = decode_image(buffer, mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError):
        try:
            with Image.open(io.BytesIO(data)) as pil:
                array = np.array(pil.convert("RGB"), dtype=np.uint8)  # (H, W, 3)
        except (UnidentifiedImageError, OSError, ValueError) as err:
            reason = re.sub(r" ?<[^<>]* at 0x[0-9a-f]+>", "", str(err))  # PIL names the buffer
            raise ValueError(
                f"cannot decode image file {name} ({reason}); delete or replace it."
            ) from err
        image = torch.from_numpy(array).permute(2, 0, 1).contiguous()
    return image if image.dtype == torch.uint8 else to_dtype(image, torch.uint8, scale=True)


def _is_image(name: str) -> bool:
    return not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS


def _folder_tree(root: Path) -> Tree:
    if not root.is_dir():
        raise ValueError(f"image folder {root} does not exist; expected the layout {_LAYOUT}.")
    return {
        d.name: [(str(f), f) for f in d.iterdir() if _is_image(f.name) and f.is_file()]
        for d in root.iterdir()
        if d.is_dir() and not d.name.startswith(".")
    }


def _check_tree(tree: Tree, *, where: str) -> None:
    empty = sorted(c for c in tree if not tree[c])
    if not tree or empty:
        found = f"class folders without images: {empty}" if empty else "no class subfolders"
        exts = " ".join(sorted(IMAGE_EXTENSIONS))
        raise ValueError(f"{where}: {found}; expected the layout {_LAYOUT} with {exts} images.")


def decode_square(data: bytes, *, name: str, side: int) -> tuple[Tensor, tuple[int, int]]:
    """Encoded bytes -> (3, side, side) uint8 RGB, squashed to the square (antialiased, no crop)
    as every training image is, and the (height, width) it had."""
    image = decode_image_bytes(data, name=name)
    size = (int(image.shape[-2]), int(image.shape[-1]))
    if size != (side, side):
        image = resize(image, [side, side], antialias=True)
    return image, size


def _decode_tree(tree: Tree, *, where: str, image_size: int) -> Loaded:
    """Decode a class -> files tree; labels follow sorted class names, rows sorted file names."""
    _check_tree(tree, where=where)
    classes = sorted(tree)
    images, labels, resized = [], [], 0
    for label, name in enumerate(classes):
        for item_name, item in sorted(tree[name], key=lambda it: it[0]):
            data = item if isinstance(item, bytes) else item.read_bytes()
            image, size = decode_square(data, name=item_name, side=image_size)
            resized += size != (image_size, image_size)
            images.append(image)
            labels.append(label)
    if resized:
        size = f"{image_size}x{image_size}"
        logger.warning("%s: resized %d of %d images to %s", where, resized, len(labels), size)
    return torch.stack(images), torch.tensor(labels, dtype=torch.int64), classes


def load_image_folder(root: str | Path, *, image_size: int = 32) -> Loaded:
    """`root/<class>/<image>` -> uint8 (N, 3, size, size), int64 labels (N,), sorted classes."""
    root = Path(root)
    return _decode_tree(_folder_tree(root), where=str(root), image_size=image_size)


def _tar_trees(archive: Path) -> dict[str, Tree]:
    """Read image members `[top/]{train,test}/<class>/<file>` of a tar into memory, per split."""
    trees: dict[str, Tree] = {split: {} for split in SPLITS}
    tops: set[tuple[str, ...]] = set()
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                parts = tuple(p for p in PurePosixPath(member.name).parts if p not in (".", "/"))
                if not member.isfile() or not 3 <= len(parts) <= 4 or parts[-3] not in SPLITS:
                    continue
                if not _is_image(parts[-1]) or any(p.startswith(".") for p in parts):
                    continue
                tops.add(parts[:-3])
                data = tar.extractfile(member).read()  # bytes only; nothing is written to disk
                trees[parts[-3]].setdefault(parts[-2], []).append(
                    (f"{archive}::{member.name}", data)
                )
    except (tarfile.TarError, EOFError, OSError) as err:
        raise ValueError(f"cannot read archive {archive} ({err}); {_SOURCE_HELP}.") from err
    if len(tops) > 1:
        raise ValueError(
            f"archive {archive} holds train/ and test/ under several top folders "
            f"{sorted(tops)}; keep one tree per archive."
        )
    return trees


def _source_trees(source: Path) -> dict[str, Tree]:
    if source.is_dir():
        trees = {
            split: _folder_tree(source / split) if (source / split).is_dir() else {}
            for split in SPLITS
        }
    elif source.name.lower().endswith((".tar", ".tar.gz", ".tgz")):
        trees = _tar_trees(source)
    else:
        raise ValueError(
            f"data source {source} is neither a folder nor a .tar/.tar.gz/.tgz; {_SOURCE_HELP}."
        )
    missing = [split for split in SPLITS if not trees[split]]
    if missing:
        raise ValueError(
            f"data source {source} has no {' or '.join(missing)} class folders; {_SOURCE_HELP}."
        )
    for split in SPLITS:  # fail before decoding anything
        _check_tree(trees[split], where=f"{source} ({split})")
    train, test = set(trees["train"]), set(trees["test"])
    if train != test:
        raise ValueError(
            f"train/ and test/ of {source} have different classes: only in train "
            f"{sorted(train - test)}, only in test {sorted(test - train)}; "
            "give both splits the same class folders."
        )
    return trees


def _resolve_source(data_dir: str | Path) -> Path:
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise ValueError(
            f"data source {str(data_dir)!r} (resolved to {path.resolve()}) does not exist; "
            f"{_SOURCE_HELP}."
        )
    return path.resolve()


def _stat_lines(folder: str, rel: str) -> Iterator[str]:
    """`path|size|mtime_ns` for everything under folder (os.scandir: one stat per entry, unlike rglob)."""
    with os.scandir(folder) as entries:
        for entry in entries:
            stat = entry.stat()
            yield f"{rel}/{entry.name}|{stat.st_size}|{stat.st_mtime_ns}"
            if entry.is_dir():
                yield from _stat_lines(entry.path, f"{rel}/{entry.name}")


def _cache_entry(source: Path, *, image_size: int, cache_dir: Path) -> Path:
    """Cache folder keyed by path, image size and the stat of the archive (or of every file)."""
    if source.is_dir():
        lines = sorted(_stat_lines(str(source), source.name))
    else:
        stat = source.stat()
        lines = [f"{source.name}|{stat.st_size}|{stat.st_mtime_ns}"]
    key = hashlib.sha256(f"v{_CACHE_VERSION}|{source}|{image_size}\n".encode())
    key.update("\n".join(lines).encode())
    stem = source.name.split(".")[0] or "data"
    return cache_dir / f"{stem}-{image_size}px-{key.hexdigest()[:16]}"


def _atomic_save(obj: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)  # readers see the old file or the whole new one, never half of it
    finally:
        tmp.unlink(missing_ok=True)


def prepare_folder_source(
    data_dir: str | Path, *, image_size: int = 32, cache_dir: str | Path | None = None
) -> Path:
    """Decode both splits of a folder/tar source into the cache unless there; return the entry."""
    source = _resolve_source(data_dir)
    entry = _cache_entry(
        source, image_size=image_size, cache_dir=Path(cache_dir or default_cache_dir())
    )
    if all((entry / f"{split}.pt").is_file() for split in SPLITS):
        return entry
    start = time.perf_counter()
    trees = _source_trees(source)
    entry.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:  # train.pt then test.pt: a cache without test.pt is incomplete
        images, labels, classes = _decode_tree(
            trees.pop(split), where=f"{source} ({split})", image_size=image_size
        )
        _atomic_save(
            {"images": images, "labels": labels, "classes": classes}, entry / f"{split}.pt"
        )
    logger.info("decoded %s in %.1fs into cache %s", source, time.perf_counter() - start, entry)
    return entry


def load_folder_source(
    data_dir: str | Path,
    *,
    split: Split,
    image_size: int = 32,
    cache_dir: str | Path | None = None,
    mmap: bool = False,
) -> Loaded:
    """One split of a folder/tar source as (images, labels, classes), decoding it on first use,
    and again where the cache file is damaged (one warning says so)."""
    source = _resolve_source(data_dir)
    path = prepare_folder_source(source, image_size=image_size, cache_dir=cache_dir) / f"{split}.pt"
    try:
        return _read_cache_file(path, image_size=image_size, mmap=mmap)
    except _DamagedCache as damage:
        logger.warning("cache file %s is damaged (%s); decoding %s again", path, damage, source)
        path.unlink(missing_ok=True)  # prepare_folder_source decodes an incomplete entry afresh
        try:
            entry = prepare_folder_source(source, image_size=image_size, cache_dir=cache_dir)
            return _read_cache_file(entry / f"{split}.pt", image_size=image_size, mmap=mmap)
        except (ValueError, OSError, _DamagedCache) as err:
            gone = "is gone" if not source.exists() else "cannot be decoded"
            raise ValueError(
                f"cache file {path} is damaged ({damage}) and its source {source} {gone} "
                f"({err}); restore the source at {source}, or point data_dir at a copy of it."
            ) from None


class _DamagedCache(Exception):
    """A cache file that cannot be read, or holds something other than what we write."""


def _read_cache_file(path: Path, *, image_size: int, mmap: bool) -> Loaded:
    """A split's cache file, checked to be what prepare_folder_source writes: a dict of uint8
    images (N, 3, size, size), int64 labels (N,) into a list of class names."""
    try:
        blob = torch.load(path, weights_only=True, mmap=mmap)
    except Exception as err:  # torch raises many types on damaged files (Runtime, Unpickling, EOF)
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise _DamagedCache(f"{type(err).__name__}: {message}"[:200]) from None
    if not isinstance(blob, dict) or set(blob) != {"images", "labels", "classes"}:
        keys = sorted(blob) if isinstance(blob, dict) else type(blob).__name__
        raise _DamagedCache(f"not this version's layout: {keys}")
    images, labels, classes = blob["images"], blob["labels"], blob["classes"]
    size = (3, image_size, image_size)
    if not (
        isinstance(images, Tensor)
        and images.dtype == torch.uint8
        and images.dim() == 4
        and tuple(images.shape[1:]) == size
        and isinstance(labels, Tensor)
        and labels.dtype == torch.int64
        and labels.shape == images.shape[:1]
        and isinstance(classes, list)
        and classes
        and all(isinstance(c, str) for c in classes)
        and (labels.numel() == 0 or 0 <= labels.min() <= labels.max() < len(classes))
    ):
        raise _DamagedCache(f"not the images, labels and classes of {image_size}px images")
    return images, labels, list(classes)
