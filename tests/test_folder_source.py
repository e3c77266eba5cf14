"""vit.folder_source's cache: a damaged cache file is decoded again from its source, once, said
in one warning; where the source is gone too, the error names both."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import vit.folder_source
from vit.folder_source import load_folder_source, prepare_folder_source


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":  # an interrupted copy
        path.write_bytes(data[: len(data) // 2])
    elif how == "random":  # overwritten by something else
        path.write_bytes(os.urandom(len(data)))
    else:  # a readable file of another layout (another version's, or someone's own)
        blob = torch.load(path, weights_only=True)
        torch.save({"data": blob["images"].float(), "targets": blob["labels"]}, path)


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("how", ["truncated", "random", "other_layout"])
def test_a_damaged_cache_file_is_decoded_again(
    make_image_tree: Callable[..., Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    how: str,
    mmap: bool,
) -> None:
    source = make_image_tree(tmp_path / "tiny", train_per_class=3, test_per_class=2)
    cache = tmp_path / "cache"
    images, labels, classes = load_folder_source(source, split="test", cache_dir=cache)
    path = prepare_folder_source(source, cache_dir=cache) / "test.pt"
    _damage(path, how)
    with caplog.at_level(logging.WARNING, logger="vit.folder_source"):
        again = load_folder_source(source, split="test", cache_dir=cache, mmap=mmap)
    assert torch.equal(again[0], images) and torch.equal(again[1], labels) and again[2] == classes
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"cache file {path} is damaged" in warnings[0]
    assert f"decoding {source} again" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vit.folder_source"):
        load_folder_source(source, split="test", cache_dir=cache, mmap=mmap)
    assert not caplog.records  # the file written afresh reads cleanly


def test_a_damaged_cache_file_whose_source_is_gone_names_both(
    make_image_tree: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_image_tree(tmp_path / "tiny", train_per_class=2, test_per_class=2)
    cache = tmp_path / "cache"
    path = prepare_folder_source(source, cache_dir=cache) / "test.pt"
    _damage(path, "truncated")
    real = vit.folder_source._read_cache_file

    def source_vanishes_first(*args: object, **kwargs: object) -> object:
        """The source goes while the cache is read (a tmp folder cleaned, a mount dropped)."""
        shutil.rmtree(source)
        monkeypatch.setattr(vit.folder_source, "_read_cache_file", real)
        return real(*args, **kwargs)

    monkeypatch.setattr(vit.folder_source, "_read_cache_file", source_vanishes_first)
    with pytest.raises(ValueError) as err:
        load_folder_source(source, split="test", cache_dir=cache)
    message = str(err.value)
    assert f"cache file {path} is damaged" in message
    assert f"its source {source} is gone" in message and "restore the source" in message
