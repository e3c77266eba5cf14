"""vit.data.cifar10_source: torchvision's CIFAR-10 release, and the `auto` source's search (the
configured path, $VIT_DATA_DIR, the shared JPEG copy, torchvision's release in the cache, a
download), whose error, when nothing is found, names each place tried and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torchvision

import vit.data.cifar10_source
from tests.helpers import tiny_datamodule, write_fake_cifar
from vit.data.datasets import CIFAR10_CLASSES
from vit.train.datamodule import CIFAR10DataModule

pytestmark = pytest.mark.usefixtures(
    "cache_in_tmp"
)  # the cache is tmp_path/cache, no $VIT_DATA_DIR


def test_cifar10_source_reads_the_pickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = write_fake_cifar(tmp_path)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    dm = tiny_datamodule(tmp_path, source="cifar10", val_size=5, batch_size=4)
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
    dm = tiny_datamodule(tmp_path / "data", source="cifar10")
    with pytest.raises(
        ValueError,
        match=r"no CIFAR-10 at .*cifar-10-batches-py.*`download: true`.*`source: folder`",
    ):
        dm.prepare_data()


# ---- source: auto, the search for CIFAR-10 -------------------------------------------------------


class _FakeCIFAR10:
    """torchvision's CIFAR10 standing in for the network: writes the release, or fails."""

    calls: list[tuple[str, bool]] = []
    error: Exception | None = None

    def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
        type(self).calls.append((root, download))
        if self.error is not None:
            raise self.error
        write_fake_cifar(Path(root))


@pytest.fixture
def fake_download(monkeypatch: pytest.MonkeyPatch) -> type[_FakeCIFAR10]:
    monkeypatch.setattr(_FakeCIFAR10, "calls", [])
    monkeypatch.setattr(_FakeCIFAR10, "error", None)
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", _FakeCIFAR10)
    return _FakeCIFAR10


def test_auto_reads_the_configured_path_first(
    image_tree_tgz: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_shared: Path
) -> None:
    write_fake_cifar(tmp_path / "release")
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "release"))  # the config path wins
    dm = tiny_datamodule(image_tree_tgz)
    assert dm.locate() == vit.data.cifar10_source.Found("folder", image_tree_tgz, "data.data_dir")
    assert dm.classes == ["bird", "cat", "dog"]
    for given in ("release", "release/cifar-10-batches-py"):  # the root or the folder itself
        found = tiny_datamodule(tmp_path / given).locate()
        assert (found.source, found.path) == ("cifar10", tmp_path / "release")


def test_auto_reads_the_environment_variable(
    image_tree_tgz: Path, monkeypatch: pytest.MonkeyPatch, no_shared: Path
) -> None:
    monkeypatch.setenv("VIT_DATA_DIR", str(image_tree_tgz))
    dm = CIFAR10DataModule(val_size=6, batch_size=8)
    assert dm.locate() == vit.data.cifar10_source.Found("folder", image_tree_tgz, "$VIT_DATA_DIR")
    dm.setup("fit")
    assert len(dm.train_dataset) == 30 and dm.classes == ["bird", "cat", "dog"]


def test_auto_finds_the_shared_copy_beside_the_repository_or_the_current_folder(
    image_tree_tgz: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, elsewhere = tmp_path / "clone", tmp_path / "work" / "here"
    (repo / "vit").mkdir(parents=True)
    elsewhere.mkdir(parents=True)
    monkeypatch.setattr(
        vit.data.cifar10_source, "__file__", str(repo / "vit/data/cifar10_source.py")
    )
    monkeypatch.chdir(elsewhere)
    beside_repo = tmp_path / "shared/data/cifar10-jpeg.tar.gz"
    beside_cwd = tmp_path / "work/shared/data/cifar10-jpeg.tar.gz"
    assert vit.data.cifar10_source.shared_candidates() == [
        beside_repo.resolve(),
        beside_cwd.resolve(),
    ]
    beside_cwd.parent.mkdir(parents=True)
    shutil.copy(image_tree_tgz, beside_cwd)
    assert CIFAR10DataModule().locate().path == beside_cwd.resolve()
    beside_repo.parent.mkdir(parents=True)
    shutil.copy(image_tree_tgz, beside_repo)
    found = CIFAR10DataModule().locate()  # the repository's copy comes first
    assert found == vit.data.cifar10_source.Found(
        "folder", beside_repo.resolve(), "the shared JPEG copy"
    )
    assert CIFAR10DataModule(source="folder").locate().path == beside_repo.resolve()  # as before


def test_auto_finds_torchvision_release_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_shared: Path
) -> None:
    written = write_fake_cifar(tmp_path / "cache")  # VIT_CACHE_DIR (the autouse fixture)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    dm = CIFAR10DataModule(val_size=5, batch_size=4)
    found = dm.locate(download=False)
    assert found == vit.data.cifar10_source.Found(
        "cifar10", tmp_path / "cache", "torchvision's release in the cache"
    )
    dm.setup("test")
    expected = torch.from_numpy(written["test_batch"]).view(4, 3, 32, 32)
    assert torch.equal(dm.test_dataset.images, expected)
    (tmp_path / "cache/cifar-10-batches-py/test_batch").unlink()  # an incomplete release
    assert not vit.data.cifar10_source.has_batches(tmp_path / "cache")
    assert CIFAR10DataModule(source="cifar10").locate().path == tmp_path / "cache"


def test_auto_downloads_into_the_cache_as_a_last_resort(
    tmp_path: Path, no_shared: Path, fake_download: type
) -> None:
    dm = CIFAR10DataModule()
    assert dm.classes == list(CIFAR10_CLASSES) and fake_download.calls == []  # never from classes
    found = dm.locate()
    assert found == vit.data.cifar10_source.Found(
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
