"""The `cifar10` source (torchvision's official release) and the search behind `source: auto`.

`find_cifar10` looks where CIFAR-10 can be, in this order, and takes the first it finds: the
configured `data_dir`, $VIT_DATA_DIR, the JPEG copy at ../shared/data/cifar10-jpeg.tar.gz (beside
the repository, then beside the current directory), torchvision's release already in the cache
folder, and a torchvision download into that folder. Finding none, it raises one ValueError that
lists each place it tried and the flag that fixes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torchvision

from vit.data.folder_source import Loaded, Split
from vit.system.paths import default_cache_dir

ENV_VAR = "VIT_DATA_DIR"
SHARED_COPY = "the shared JPEG copy"  # the place of the search that found it, as logged
BATCHES = "cifar-10-batches-py"  # torchvision's folder for the official release
BATCH_FILES = ("batches.meta", *(f"data_batch_{i}" for i in range(1, 6)), "test_batch")
SHARED_JPEG = Path("..", "shared", "data", "cifar10-jpeg.tar.gz")
FIX = (
    f"pass `--data.data_dir PATH` (a CIFAR-10 image folder or .tar.gz of one, or a folder "
    f"holding {BATCHES}), or set {ENV_VAR}=PATH"
)


@dataclass(frozen=True)
class Found:
    """Where CIFAR-10 is: the source kind, its path (a torchvision root for `cifar10`), and
    the place of the search that gave it, for the log."""

    source: Literal["folder", "cifar10", "cifar100"]
    path: Path
    place: str


def has_batches(root: Path) -> bool:
    """Whether root holds torchvision's release: the five training pickles, the test one, the meta."""
    return all((root / BATCHES / name).is_file() for name in BATCH_FILES)


def classify(path: Path, place: str) -> Found:
    """A path the user named: torchvision's release where it holds (or is) cifar-10-batches-py,
    else a folder source (an image tree or an archive of one; a missing one is reported there)."""
    path = path.expanduser()
    if any(p.name.startswith("cifar-100-python") for p in (path, *path.glob("cifar-100-*"))):
        raise ValueError(
            f"{str(path)!r} holds CIFAR-100's release, not CIFAR-10's: pass --data.source "
            f"cifar100 and --model.network.num_classes 100 (20 with --data.cifar100_labels coarse)."
        )
    if path.name == BATCHES and has_batches(path.parent):
        return Found("cifar10", path.parent, place)
    if has_batches(path):
        return Found("cifar10", path, place)
    return Found("folder", path, place)


def shared_candidates() -> list[Path]:
    """../shared/data/cifar10-jpeg.tar.gz beside the repository (the folder above vit/, for an
    editable install or a checkout) and beside the current directory, each once."""
    repo = Path(__file__).resolve().parents[2]
    return list(
        dict.fromkeys([(repo / SHARED_JPEG).resolve(), (Path.cwd() / SHARED_JPEG).resolve()])
    )


def cache_root(cache_dir: str | None) -> Path:
    """Where torchvision's release is looked for and downloaded: cache_dir, else $VIT_CACHE_DIR or
    ~/.cache/vit (the folder source's decoded tensors live there too)."""
    return Path(cache_dir).expanduser() if cache_dir else default_cache_dir()


def find_cifar10(data_dir: str | None, *, cache_dir: str | None, download: bool) -> Found:
    """The first place that holds CIFAR-10 (module docstring); `download` allows the last step."""
    if data_dir:
        return classify(Path(data_dir), "data.data_dir")
    if os.environ.get(ENV_VAR):
        return classify(Path(os.environ[ENV_VAR]), f"${ENV_VAR}")
    tried = ["data.data_dir: not set", f"${ENV_VAR}: not set"]
    for path in shared_candidates():
        if path.exists():
            return Found("folder", path, SHARED_COPY)
        tried.append(f"the JPEG copy at {path}: absent")
    root = cache_root(cache_dir)
    if has_batches(root):
        return Found("cifar10", root, "torchvision's release in the cache")
    tried.append(f"torchvision's release at {root / BATCHES}: absent")
    if not download:
        tried.append("a download: not tried (download: false)")
    else:
        try:  # one archive holds both splits
            torchvision.datasets.CIFAR10(root=str(root), train=True, download=True)
            return Found("cifar10", root, "a torchvision download")
        except Exception as err:  # no network, a proxy, a full disk: report it, never hide it
            tried.append(
                f"a torchvision download into {root}: failed ({type(err).__name__}: {err})"
            )
    raise ValueError(
        "found no CIFAR-10; tried, in order: " + "; ".join(tried) + f". To fix: {FIX}."
    )


def locate(source: str, data_dir: str | None, *, cache_dir: str | None, download: bool) -> Found:
    """Where a source reads from: the search for `auto`, else data_dir; without one, `cifar10`
    takes the cache folder and `folder` the shared JPEG copy (the default before `auto`)."""
    if source == "auto":
        return find_cifar10(data_dir, cache_dir=cache_dir, download=download)
    if data_dir:
        return Found(source, Path(data_dir).expanduser(), "data.data_dir")
    if source == "cifar10":
        return Found("cifar10", cache_root(cache_dir), "the cache folder")
    paths = shared_candidates()
    return Found("folder", next((p for p in paths if p.exists()), paths[-1]), "the default")


def load_cifar10(data_dir: str | Path, *, split: Split, download: bool = False) -> Loaded:
    """torchvision's CIFAR-10 (official pickles in data_dir/cifar-10-batches-py) as tensors."""
    root = Path(data_dir).expanduser()
    if not download and not (root / BATCHES).is_dir():
        raise ValueError(
            f"no CIFAR-10 at {root / BATCHES}; set `download: true` to fetch it "
            "there, or use `source: folder` with the JPEG archive."
        )
    try:
        dataset = torchvision.datasets.CIFAR10(
            root=str(root), train=split == "train", download=download
        )
    except RuntimeError as err:  # torchvision's "Dataset not found or corrupted"
        raise ValueError(
            f"CIFAR-10 under {root} is incomplete or corrupted ({err}); "
            "delete it and set `download: true`."
        ) from err
    # (N, 32, 32, 3) -> (N, 3, 32, 32)
    images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous()
    return images, torch.tensor(dataset.targets, dtype=torch.int64), list(dataset.classes)
