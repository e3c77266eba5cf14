"""The `cifar100` source: CIFAR-100's official release (torchvision's layout, cifar-100-python/),
read without torchvision's checksum so that any copy in that format loads, and read safely.

`find_cifar100` takes, in order: the configured `data_dir` (a folder holding cifar-100-python/,
that folder itself, or the release's .tar.gz, extracted once into the cache folder), the release
already in the cache folder, and a torchvision download into that folder. The files are Python
pickles; `load_cifar100` unpickles them with only the few globals a numpy array needs, so a
hostile file is refused before anything in it runs.
"""

from __future__ import annotations

import io
import pickle
import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torchvision

from vit.data.cifar10_source import cache_root
from vit.data.folder_source import Loaded, Split

BATCHES = "cifar-100-python"  # the release's folder
ARCHIVE = "cifar-100-python.tar.gz"
FILES = ("meta", "train", "test")
LabelKind = Literal["fine", "coarse"]
# what unpickling the release's dicts of numpy arrays needs, and nothing more
ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),  # numpy 1's name, the release's
    ("numpy._core.multiarray", "_reconstruct"),  # numpy 2's
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # bytes, at protocol 2
}
FIX = (
    f"pass --data.data_dir PATH (a folder holding {BATCHES}/, or {ARCHIVE}), or "
    "--data.download true to fetch it into the cache folder"
)


def has_cifar100(root: Path) -> bool:
    """Whether root/cifar-100-python holds the release's three files."""
    return all((root / BATCHES / name).is_file() for name in FILES)


def find_cifar100(data_dir: str | None, *, cache_dir: str | None, download: bool) -> Path:
    """The folder that holds cifar-100-python/ (module docstring's order); `download` allows
    the last step."""
    cache = cache_root(cache_dir)
    if data_dir:
        path = Path(data_dir).expanduser()
        if path.name == BATCHES and has_cifar100(path.parent):
            return path.parent
        if has_cifar100(path):
            return path
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
            return extract(path, cache)
        raise ValueError(
            f"data.data_dir {str(path)!r} {'holds' if path.exists() else 'does not exist, so'} "
            f"no CIFAR-100 release: expected a folder holding {BATCHES}/ with "
            f"{', '.join(FILES)}, that folder itself, or {ARCHIVE}."
        )
    if has_cifar100(cache):
        return cache
    tried = ["data.data_dir: not set", f"the release at {cache / BATCHES}: absent"]
    if not download:
        tried.append("a download: not tried (download: false)")
    else:
        try:
            torchvision.datasets.CIFAR100(root=str(cache), train=True, download=True)
            return cache
        except Exception as err:  # no network, a proxy, a full disk: report it, never hide it
            tried.append(
                f"a torchvision download into {cache}: failed ({type(err).__name__}: {err})"
            )
    raise ValueError(
        "found no CIFAR-100; tried, in order: " + "; ".join(tried) + f". To fix: {FIX}."
    )


def extract(archive: Path, cache: Path) -> Path:
    """The release's archive unpacked into the cache folder once (where a download also goes):
    into a temporary folder whose cifar-100-python/ is renamed into place when complete, so an
    interrupted extraction is never taken for a release."""
    if has_cifar100(cache):
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".extracting-"))
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            # normpath first, so that cifar-100-python/../x counts as outside
            odd = [m.name for m in members if posixpath.normpath(m.name).split("/")[0] != BATCHES]
            if odd:
                raise ValueError(
                    f"{str(archive)!r} holds {odd[:3]} outside {BATCHES}/: not CIFAR-100's "
                    f"release; nothing was extracted. Pass the release's {ARCHIVE}."
                )
            tar.extractall(tmp, members=members, filter="data")  # refuses links leading out
        if not has_cifar100(tmp):
            raise ValueError(f"{str(archive)!r} lacks some of {BATCHES}/{{{', '.join(FILES)}}}.")
        if not has_cifar100(cache):  # another process (a DDP rank) may have finished first
            shutil.rmtree(cache / BATCHES, ignore_errors=True)  # an incomplete copy, if any
            (tmp / BATCHES).rename(cache / BATCHES)
    except (tarfile.TarError, EOFError, OSError) as err:
        if has_cifar100(cache):  # lost the race to rename: the other copy is complete
            return cache
        raise ValueError(
            f"could not extract {str(archive)!r} into {cache} ({type(err).__name__}: {err}); "
            f"expected the release's complete {ARCHIVE} and a cache folder you can write to "
            "(--data.cache_dir)."
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cache


class _Refused(pickle.UnpicklingError):
    """A global the release's pickles never name: code that unpickling would run."""


class _ReleaseUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise _Refused(f"it asks for {module}.{name}")
        return super().find_class(module, name)


def _read(path: Path) -> dict[str, Any]:
    """One of the release's pickles as a dict with str keys, refusing any code in it."""
    try:
        data = _ReleaseUnpickler(io.BytesIO(path.read_bytes()), encoding="latin1").load()
    except _Refused as err:
        raise ValueError(
            f"{str(path)!r} is not CIFAR-100's release ({err}); refused without running "
            "anything from it. Delete it and download again."
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, LookupError) as err:
        raise ValueError(
            f"{str(path)!r} is truncated or corrupt ({type(err).__name__}); delete it and "
            "download again."
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} holds a {type(data).__name__}, not the release's dict.")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in data.items()}


def cifar100_classes(root: Path, *, labels: LabelKind = "fine") -> list[str]:
    """The `labels` kind's class names in order, from the release's meta file alone."""
    if labels not in ("fine", "coarse"):
        raise ValueError(f"labels={labels!r}: expected 'fine' or 'coarse'.")
    path = Path(root) / BATCHES / "meta"
    names = _read(path).get(f"{labels}_label_names")
    if not isinstance(names, list):
        raise ValueError(
            f"{str(path)!r} is not CIFAR-100's layout: expected a list '{labels}_label_names'. "
            "Delete it and download again."
        )
    return [n.decode("latin1") if isinstance(n, bytes) else str(n) for n in names]


def load_cifar100(root: Path, *, split: Split, labels: LabelKind = "fine") -> Loaded:
    """CIFAR-100's `split` under root/cifar-100-python: uint8 images (N, 3, 32, 32), int64 labels
    (N,) of the `labels` kind (100 fine classes or 20 coarse superclasses), their names in order."""
    if split not in ("train", "test") or labels not in ("fine", "coarse"):
        raise ValueError(
            f"split={split!r}, labels={labels!r}: expected 'train' or 'test', 'fine' or 'coarse'."
        )
    path = Path(root) / BATCHES / split
    names = cifar100_classes(root, labels=labels)
    entry = _read(path)
    data, targets = entry.get("data"), entry.get(f"{labels}_labels")
    good = (
        isinstance(data, np.ndarray)
        and data.dtype == np.uint8
        and data.shape[1:] == (3072,)
        and isinstance(targets, list | np.ndarray)
        and len(targets) == len(data)
        and all(isinstance(t, int | np.integer) for t in targets)
    )
    if not good:
        raise ValueError(
            f"{str(path)!r} is not CIFAR-100's layout: expected 'data' uint8 (N, 3072) and N "
            f"integer '{labels}_labels'. Delete it and download again."
        )
    label_tensor = torch.tensor(np.asarray(targets, dtype=np.int64))
    if len(label_tensor) and not 0 <= label_tensor.min() <= label_tensor.max() < len(names):
        raise ValueError(
            f"{str(path)!r} has labels outside 0..{len(names) - 1} (meta's {len(names)} names): "
            "not CIFAR-100's release. Delete it and download again."
        )
    # rows of 3072 bytes: the R plane (32 x 32, row-major), then G, then B
    return torch.from_numpy(data.copy()).view(-1, 3, 32, 32).contiguous(), label_tensor, names
