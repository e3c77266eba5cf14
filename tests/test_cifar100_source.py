"""The cifar100 source: the release's layout read exactly, the search and its error, the archive
extracted once and safely, hostile and damaged files refused."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import pytest
import torch

from tests.helpers import Payload, write_cifar100
from vit.data import cifar100_source
from vit.data.cifar100_source import BATCHES, find_cifar100, load_cifar100


def test_pixels_labels_and_names_read_as_written(tmp_path: Path) -> None:
    root = write_cifar100(tmp_path, num_train=6, num_test=3)
    entry = pickle.loads((root / BATCHES / "train").read_bytes())
    entry["data"][0, 1 * 32 + 2] = 7  # R plane, row 1, column 2
    entry["data"][0, 1024 + 5] = 9  # G plane, row 0, column 5
    (root / BATCHES / "train").write_bytes(pickle.dumps(entry, protocol=2))
    images, labels, names = load_cifar100(root, split="train")
    assert images.shape == (6, 3, 32, 32) and images.dtype == torch.uint8
    assert images[0, 0, 1, 2] == 7 and images[0, 1, 0, 5] == 9
    assert torch.equal(images.flatten(1), torch.from_numpy(entry["data"]))
    assert labels.tolist() == entry["fine_labels"] and len(names) == 100
    coarse = load_cifar100(root, split="test", labels="coarse")
    assert coarse[1].tolist() == [7 // 5, 8 // 5, 9 // 5] and coarse[2][1] == "coarse_01"
    with pytest.raises(ValueError, match="expected 'fine' or 'coarse'"):
        load_cifar100(root, split="test", labels="superclass")


def test_the_search_takes_data_dir_then_the_cache_then_a_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_cifar100(tmp_path / "given", num_train=2, num_test=2)
    cache = tmp_path / "cache"
    assert find_cifar100(str(root), cache_dir=str(cache), download=False) == root
    assert find_cifar100(str(root / BATCHES), cache_dir=str(cache), download=False) == root
    with pytest.raises(ValueError, match="holds no CIFAR-100 release"):
        find_cifar100(str(tmp_path), cache_dir=str(cache), download=False)
    with pytest.raises(ValueError, match=r"tried, in order: .*absent; a download: not tried"):
        find_cifar100(None, cache_dir=str(cache), download=False)

    def offline(**kwargs: object) -> None:
        raise OSError("no network")

    monkeypatch.setattr(cifar100_source.torchvision.datasets, "CIFAR100", offline)
    with pytest.raises(ValueError, match=r"download into .* failed \(OSError: no network\)"):
        find_cifar100(None, cache_dir=str(cache), download=True)

    def fetch(*, root: str, **kwargs: object) -> None:
        write_cifar100(Path(root), num_train=2, num_test=2)

    monkeypatch.setattr(cifar100_source.torchvision.datasets, "CIFAR100", fetch)
    assert find_cifar100(None, cache_dir=str(cache), download=True) == cache
    monkeypatch.setattr(cifar100_source.torchvision.datasets, "CIFAR100", offline)
    assert find_cifar100(None, cache_dir=str(cache), download=True) == cache  # found, not fetched


def test_the_archive_is_extracted_once_into_the_cache(tmp_path: Path) -> None:
    archive = write_cifar100(tmp_path / "data", num_train=4, num_test=2, archive=True)
    cache = tmp_path / "cache"
    root = find_cifar100(str(archive), cache_dir=str(cache), download=False)
    assert root == cache and load_cifar100(root, split="train")[0].shape[0] == 4
    stamp = (cache / BATCHES / "train").stat().st_mtime_ns
    assert find_cifar100(str(archive), cache_dir=str(cache), download=False) == cache
    assert (cache / BATCHES / "train").stat().st_mtime_ns == stamp  # not extracted again
    assert [p.name for p in cache.iterdir()] == [BATCHES]  # no temporary folder left


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_archives_that_are_not_the_release_extract_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    outside = _tar(tmp_path / "a.tar.gz", {"cifar-100-python/meta": b"x", "evil.sh": b"x"})
    with pytest.raises(ValueError, match=r"\['evil.sh'\] outside cifar-100-python/"):
        find_cifar100(str(outside), cache_dir=str(cache), download=False)
    escape = _tar(tmp_path / "b.tar.gz", {"cifar-100-python/../../escaped": b"x"})
    with pytest.raises(ValueError, match="not a readable archive"):
        find_cifar100(str(escape), cache_dir=str(cache), download=False)
    partial = _tar(tmp_path / "c.tar.gz", {"cifar-100-python/meta": b"x"})
    with pytest.raises(ValueError, match="lacks some of"):
        find_cifar100(str(partial), cache_dir=str(cache), download=False)
    assert not (tmp_path / "escaped").exists() and not (cache / BATCHES).exists()
    assert list(cache.iterdir()) == []  # the temporary folders went too


def test_hostile_truncated_and_foreign_files_are_refused(tmp_path: Path) -> None:
    root = write_cifar100(tmp_path, num_train=3, num_test=3)
    marker = tmp_path / "ran"
    (root / BATCHES / "train").write_bytes(pickle.dumps({"data": Payload(marker)}, protocol=2))
    with pytest.raises(
        ValueError, match=r"it asks for \S+getattr\); refused without running anything"
    ):
        load_cifar100(root, split="train")
    assert not marker.exists()
    whole = (root / BATCHES / "test").read_bytes()
    (root / BATCHES / "test").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt.*delete it and download again"):
        load_cifar100(root, split="test")
    (root / BATCHES / "test").write_bytes(pickle.dumps({"data": [1, 2]}, protocol=2))
    with pytest.raises(ValueError, match="not CIFAR-100's layout"):
        load_cifar100(root, split="test")
