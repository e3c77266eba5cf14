"""Shared fixtures, built on tests/helpers.py (the tiny model, small data made on the fly)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, settings

from tests.helpers import CIFAR_ARCHIVE, TINY, train_args, write_image_tree, write_tar
from vit.model.vision_transformer import VisionTransformer

# scripts/mutation_run.sh: a failing property stops at its first example instead of shrinking it
# (shrinking made single mutants take a minute); the default profile is hypothesis's own
settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile(os.environ.get("VIT_HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under mutmut (any of its phases: it sets MUTANT_UNDER_TEST, empty for its clean run), skip
    the tests that run torch.compile: mutmut's trampolines split the compiled graphs (why the run
    leaves out test_compile.py; a fullgraph compile fails outright), and at up to a minute each
    they would double the run's time for every surviving mutant of the model."""
    if "MUTANT_UNDER_TEST" in os.environ:
        skip = pytest.mark.skip(reason="torch.compile under mutmut's trampolines")
        for item in items:
            if item.get_closest_marker("compiles"):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_bf16_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """A VIT_CPU_BF16 in the user's shell (0: the float32 path on a bf16 CPU, as the docs suggest
    for trying it) is not the suite's: the tests that need either answer set it or mock the CPU."""
    monkeypatch.delenv("VIT_CPU_BF16", raising=False)


@pytest.fixture
def tiny_model() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(**TINY)


# ---- data fixtures: tiny image-folder trees and archives written on the fly ------------------


@pytest.fixture
def make_image_tree() -> Callable[..., Path]:
    """Factory: make_image_tree(root, train_per_class=12, test_per_class=4) -> root."""
    return write_image_tree


@pytest.fixture
def make_tar() -> Callable[..., Path]:
    """Factory: make_tar(root, archive, top="tiny") -> archive."""
    return write_tar


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """3 classes (bird, cat, dog), 12 train and 4 test 32x32 images each, PNG and JPEG."""
    return write_image_tree(tmp_path / "tiny")


@pytest.fixture
def image_tree_tgz(image_tree: Path, tmp_path: Path) -> Path:
    """`image_tree` as a .tar.gz under one top-level folder."""
    return write_tar(image_tree, tmp_path / "tiny.tar.gz")


@pytest.fixture(scope="package")
def cifar10_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding the JPEG copy of CIFAR-10 decoded once for all tests that score the
    shipped weights (a --cache-dir or load_folder_source's cache_dir); skips without the copy."""
    if not CIFAR_ARCHIVE.is_file():
        pytest.skip(f"needs the JPEG copy of CIFAR-10 at {CIFAR_ARCHIVE}")
    from vit.data.folder_source import prepare_folder_source

    cache = tmp_path_factory.mktemp("cifar10_cache")
    prepare_folder_source(CIFAR_ARCHIVE, cache_dir=cache)
    return cache


@pytest.fixture
def cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test using this writes to the user's ~/.cache/vit or reads the user's $VIT_DATA_DIR
    (the data tests take it for all their tests: pytestmark = usefixtures("cache_in_tmp"))."""
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VIT_DATA_DIR", raising=False)


@pytest.fixture
def no_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The search's JPEG-copy step sees only an absent path, never the machine's real copy."""
    import vit.data.cifar10_source

    absent = tmp_path / "shared/data/cifar10-jpeg.tar.gz"
    monkeypatch.setattr(vit.data.cifar10_source, "shared_candidates", lambda: [absent])
    return absent


# ---- a tiny training run, shared by the tests that need a checkpoint -----------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """last.ckpt of a 2-epoch run of a tiny model on a tiny 3-class image tree."""
    from vit.commands.train import train_main

    root = tmp_path_factory.mktemp("tiny_run")
    train_main(train_args(write_image_tree(root / "tiny"), root / "runs"))
    return root / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
