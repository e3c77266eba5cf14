"""The cifar100 source: the release's layout read exactly, the search and its error, the archive
extracted once and safely, hostile and damaged files refused."""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import Payload, write_cifar100
from vit.data import cifar100_source
from vit.data.cifar100_source import BATCHES, find_cifar100, has_cifar100, load_cifar100


def _py2(obj: object) -> bytes:
    """obj in the opcodes Python 2's cPickle wrote the release with (protocol 2): str as BINSTRING
    (bytes, read back through latin1), arrays through numpy 1's numpy.core.multiarray."""
    if isinstance(obj, str):
        return b"T" + struct.pack("<i", len(obj)) + obj.encode("latin1")
    if isinstance(obj, int):
        return b"J" + struct.pack("<i", obj)
    if isinstance(obj, list):
        return b"](" + b"".join(map(_py2, obj)) + b"e"
    if isinstance(obj, tuple):
        return b"(" + b"".join(map(_py2, obj)) + b"t"
    if isinstance(obj, dict):
        return b"}(" + b"".join(_py2(k) + _py2(v) for k, v in obj.items()) + b"u"
    # _reconstruct(ndarray, (0,), "b") given the state (1, shape, dtype("u1"), False, bytes)
    empty = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + _py2((0,)) + _py2("b")
    u1 = b"cnumpy\ndtype\n" + _py2("u1") + _py2(0) + _py2(1) + b"\x87R"
    u1 += b"(" + _py2(3) + _py2("|") + b"NNN" + _py2(-1) + _py2(-1) + _py2(0) + b"tb"
    state = _py2(1) + _py2(obj.shape) + u1 + b"\x89" + _py2(obj.tobytes().decode("latin1"))
    return empty + b"\x87R(" + state + b"tb"


def test_the_release_as_python_2_wrote_it_loads(tmp_path: Path) -> None:
    folder = tmp_path / BATCHES
    folder.mkdir()
    data = np.random.default_rng(0).integers(0, 256, (3, 3072), dtype=np.uint8)
    data[0, 32 + 2], data[2, 2048 + 31 * 32 + 31] = 201, 77  # R (1, 2) of image 0, B (31, 31) of 2
    meta = {"fine_label_names": [f"f{i}" for i in range(100)], "coarse_label_names": ["c"] * 20}
    split = {
        "data": data,
        "fine_labels": [0, 99, 5],
        "coarse_labels": [0, 19, 1],
        "batch_label": "x",
    }
    for name, obj in (("meta", meta), ("train", split), ("test", split)):
        (folder / name).write_bytes(b"\x80\x02" + _py2(obj) + b".")
    images, labels, names = load_cifar100(tmp_path, split="train")
    assert images[0, 0, 1, 2] == 201 and images[2, 2, 31, 31] == 77 and images.is_contiguous()
    assert torch.equal(images.reshape(3, -1), torch.from_numpy(data))
    assert labels.tolist() == [0, 99, 5] and labels.dtype == torch.int64 and names[99] == "f99"
    # keys that come back as bytes (pickled by Python 3 at protocol 2, through _codecs.encode)
    bytes_keys = {k.encode(): v for k, v in split.items()}
    (folder / "test").write_bytes(pickle.dumps(bytes_keys, protocol=2))
    assert load_cifar100(tmp_path, split="test", labels="coarse")[1].tolist() == [0, 19, 1]


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
    with pytest.raises(ValueError, match="expected 'train' or 'test', 'fine' or 'coarse'"):
        load_cifar100(root, split="test", labels="superclass")
    with pytest.raises(ValueError, match="split='meta'.*expected 'train' or 'test'"):
        load_cifar100(root, split="meta")


def test_the_search_takes_data_dir_then_the_cache_then_a_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_cifar100(tmp_path / "given", num_train=2, num_test=2)
    cache = tmp_path / "cache"
    assert find_cifar100(str(root), cache_dir=str(cache), download=False) == root
    assert find_cifar100(str(root / BATCHES), cache_dir=str(cache), download=False) == root
    with pytest.raises(ValueError, match="holds no CIFAR-100 release: expected a folder"):
        find_cifar100(str(tmp_path), cache_dir=str(cache), download=False)
    with pytest.raises(ValueError, match="does not exist, so no CIFAR-100 release"):
        find_cifar100(str(tmp_path / "nowhere.tar.gz"), cache_dir=str(cache), download=False)
    tried = (
        rf"tried, in order: data.data_dir: not set; the release at {cache / BATCHES}: absent; "
        r"a download: not tried \(download: false\)\. To fix: pass --data.data_dir PATH .*"
        r"--data.download true"
    )
    with pytest.raises(ValueError, match=tried):
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


def test_the_archive_is_extracted_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = write_cifar100(tmp_path / "data", num_train=4, num_test=2, archive=True)
    cache = tmp_path / "cache"
    root = find_cifar100(str(archive), cache_dir=str(cache), download=False)
    assert root == cache and load_cifar100(root, split="train")[0].shape[0] == 4
    stamp = (cache / BATCHES / "train").stat().st_mtime_ns
    monkeypatch.setattr(tarfile, "open", None)  # the archive is not opened again
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
    with pytest.raises(ValueError, match=r"\['cifar-100-python/../../escaped'\] outside"):
        find_cifar100(str(escape), cache_dir=str(cache), download=False)
    with tarfile.open(tmp_path / "d.tar.gz", "w:gz") as tar:  # a link leading out of the folder
        link = tarfile.TarInfo("cifar-100-python/train")
        link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path / "a.tar.gz")
        tar.addfile(link)
    with pytest.raises(ValueError, match="could not extract .*AbsoluteLinkError"):
        find_cifar100(str(tmp_path / "d.tar.gz"), cache_dir=str(cache), download=False)
    partial = _tar(tmp_path / "c.tar.gz", {"cifar-100-python/meta": b"x"})
    with pytest.raises(ValueError, match="lacks some of"):
        find_cifar100(str(partial), cache_dir=str(cache), download=False)
    assert not (tmp_path / "escaped").exists() and not (cache / BATCHES).exists()
    assert list(cache.iterdir()) == []  # the temporary folders went too


def test_an_extraction_another_process_finished_first_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = write_cifar100(tmp_path / "data", num_train=4, num_test=2, archive=True)
    cache, real = tmp_path / "cache", tarfile.TarFile.extractall

    def then_another_rank_finishes(tar: tarfile.TarFile, *args: object, **kwargs: object) -> None:
        real(tar, *args, **kwargs)
        write_cifar100(cache, num_train=3, num_test=2)  # a DDP rank's copy, renamed in first

    monkeypatch.setattr(tarfile.TarFile, "extractall", then_another_rank_finishes)
    assert find_cifar100(str(archive), cache_dir=str(cache), download=False) == cache
    assert load_cifar100(cache, split="train")[0].shape[0] == 3  # its copy, left as it was
    assert [p.name for p in cache.iterdir()] == [BATCHES] and has_cifar100(cache)


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_a_hostile_pickle_is_refused_before_it_runs(tmp_path: Path, protocol: int) -> None:
    root = write_cifar100(tmp_path, num_train=3, num_test=3)
    marker = tmp_path / "ran"
    hostile = {"data": Payload(marker), "fine_labels": [0]}
    (root / BATCHES / "train").write_bytes(pickle.dumps(hostile, protocol=protocol))
    with pytest.raises(
        ValueError, match=r"not CIFAR-100's release \(it asks for \S+(getattr|touch)"
    ):
        load_cifar100(root, split="train")
    assert not marker.exists()
    pickle.loads((root / BATCHES / "train").read_bytes())  # the payload works: it was refused
    assert marker.exists()


def test_truncated_and_foreign_files_are_refused(tmp_path: Path) -> None:
    root = write_cifar100(tmp_path, num_train=3, num_test=3)
    whole = (root / BATCHES / "test").read_bytes()
    (root / BATCHES / "test").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt.*delete it and download again"):
        load_cifar100(root, split="test")
    for entry in (
        {"data": [1, 2]},
        {"data": np.zeros((2, 3072), np.uint8), "fine_labels": ["a", "b"]},
        {"data": np.zeros((2, 3072), np.uint8), "fine_labels": [0]},
        {"data": np.zeros((2, 3071), np.uint8), "fine_labels": [0, 1]},
    ):
        (root / BATCHES / "test").write_bytes(pickle.dumps(entry, protocol=2))
        with pytest.raises(ValueError, match="not CIFAR-100's layout: expected 'data' uint8"):
            load_cifar100(root, split="test")
    outside = {"data": np.zeros((2, 3072), np.uint8), "coarse_labels": [3, 20]}
    (root / BATCHES / "test").write_bytes(pickle.dumps(outside, protocol=2))
    with pytest.raises(ValueError, match=r"has labels outside 0..19 \(meta's 20 names\)"):
        load_cifar100(root, split="test", labels="coarse")


def test_class_names_come_from_meta_alone(tmp_path: Path) -> None:
    from vit.train.datamodule import CIFAR10DataModule

    root = write_cifar100(tmp_path, num_train=3, num_test=3)
    expected = load_cifar100(root, split="test", labels="coarse")[2]
    for split in ("train", "test"):  # unreadable: the names must not read them
        (root / BATCHES / split).write_bytes(b"\x80\x02")
    dm = CIFAR10DataModule(source="cifar100", data_dir=str(root), cifar100_labels="coarse")
    assert dm.classes == expected and dm.num_classes == 20
    meta = pickle.loads((root / BATCHES / "meta").read_bytes())
    meta["fine_label_names"] = "not a list"
    (root / BATCHES / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    with pytest.raises(ValueError, match="expected a list 'fine_label_names'. Delete it"):
        _ = CIFAR10DataModule(source="cifar100", data_dir=str(root)).classes
