"""Shared fixtures: a tiny model (patch 8, width 32, depth 2, heads 2) and small data made on the fly."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from vit.attention import Attention
from vit.model import VisionTransformer

REPO = Path(__file__).resolve().parents[1]
CIFAR_ARCHIVE = REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"

TINY = dict(
    img_size=32, patch_size=8, num_classes=10, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0
)
TINY_ARGS = {k: v for k, v in TINY.items() if k != "img_size"}  # the same model, ViTClassifier's


def tiny_classifier(
    *,
    network: dict | None = None,
    optimizer: dict | None = None,
    schedule: dict | None = None,
    **options,
):
    """ViTClassifier of the tiny model (vit_nano's options, TINY's sizes); `network`, `optimizer`
    and `schedule` update those groups, `options` are its other arguments."""
    from vit.lit_module import ViTClassifier

    return ViTClassifier(
        network={"preset": "vit_nano", **TINY_ARGS, **(network or {})},
        optimizer=optimizer or {},
        schedule=schedule or {},
        **options,
    )


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py imported as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_loader(n: int = 64, *, seed: int = 0) -> DataLoader:
    """n seeded random 32x32 images and labels of 10 classes, in batches of 16."""
    g = torch.Generator().manual_seed(seed)
    images, labels = torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
    return DataLoader(TensorDataset(images, labels), batch_size=16)


@torch.no_grad()
def head_products(attn: Attention) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per head W_q^T W_k (dim, dim), and W_v^T W_proj^T over all heads (dim, dim)."""
    dim, hd, w = attn.proj.in_features, attn.head_dim, attn.qkv.weight
    qk = [
        w[h * hd : (h + 1) * hd].T @ w[dim + h * hd : dim + (h + 1) * hd]
        for h in range(attn.num_heads)
    ]
    return qk, w[2 * dim :].T @ attn.proj.weight.T


def quiet_trainer(root: Path | None, **kwargs) -> L.Trainer:
    """A Trainer with no logger, checkpoints, progress bar or summary unless asked; files under root."""
    quiet = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    return L.Trainer(**{**quiet, **kwargs})


@pytest.fixture
def tiny_model() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(**TINY)


# ---- data fixtures: tiny image-folder trees and archives written on the fly ------------------

TINY_DATA_CLASSES = ("bird", "cat", "dog")


def _write_image_tree(root: Path, *, train_per_class: int = 12, test_per_class: int = 4) -> Path:
    """root/{train,test}/<class>/NNNN.{png,jpg}: seeded random 32x32 RGB, every third a JPEG."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for name in TINY_DATA_CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(1, 256, size=(32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:04d}{'.jpg' if i % 3 == 2 else '.png'}")
    return root


def _write_tar(root: Path, archive: Path, *, top: str | None = "tiny") -> Path:
    """Tar root/train and root/test into `archive` (gzip by suffix), under folder `top` if given."""
    import tarfile

    mode = "w:gz" if archive.name.endswith((".gz", ".tgz")) else "w"
    with tarfile.open(archive, mode) as tar:
        for split in ("train", "test"):
            tar.add(root / split, arcname=f"{top}/{split}" if top else split)
    return archive


@pytest.fixture
def make_image_tree() -> Callable[..., Path]:
    """Factory: make_image_tree(root, train_per_class=12, test_per_class=4) -> root."""
    return _write_image_tree


@pytest.fixture
def make_tar() -> Callable[..., Path]:
    """Factory: make_tar(root, archive, top="tiny") -> archive."""
    return _write_tar


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """3 classes (bird, cat, dog), 12 train and 4 test 32x32 images each, PNG and JPEG."""
    return _write_image_tree(tmp_path / "tiny")


@pytest.fixture
def image_tree_tgz(image_tree: Path, tmp_path: Path) -> Path:
    """`image_tree` as a .tar.gz under one top-level folder."""
    return _write_tar(image_tree, tmp_path / "tiny.tar.gz")


# ---- a tiny training run, shared by the tests that need a checkpoint -----------------------

TINY_MODEL_ARGS = [
    "--model.network.preset=vit_nano",
    "--model.network.patch_size=8",
    "--model.network.embed_dim=32",
    "--model.network.depth=2",
    "--model.network.num_heads=2",
    "--model.schedule.warmup_epochs=0.5",
]


def train_args(data_dir: Path, runs: Path, *extra: str) -> list[str]:
    """vit-train arguments for a tiny model on a tiny image tree, logging to runs/tiny."""
    logger = (
        '[{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": '
        f'{{"save_dir": "{runs}", "name": "tiny"}}}}, '
        '{"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": '
        f'{{"save_dir": "{runs}", "name": "tiny"}}}}]'
    )
    checkpoint = (
        '[{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": '
        '{"monitor": "val/acc", "mode": "max", "save_last": true}}]'
    )
    return [
        "fit",
        *TINY_MODEL_ARGS,
        "--model.network.num_classes=3",
        f"--data.data_dir={data_dir}",
        f"--data.cache_dir={runs / 'cache'}",
        "--data.batch_size=8",
        "--data.val_size=6",
        "--trainer.max_epochs=2",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger={logger}",
        f"--trainer.callbacks={checkpoint}",
        *extra,
    ]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """last.ckpt of a 2-epoch run of a tiny model on a tiny 3-class image tree."""
    from vit.cli import train_main

    root = tmp_path_factory.mktemp("tiny_run")
    train_main(train_args(_write_image_tree(root / "tiny"), root / "runs"))
    return root / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"


class Payload:
    """Unpickling this creates `marker` (pathlib.Path.touch): stands in for a malicious
    checkpoint's code, with no harm done if it ever runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (self.marker,))


def vit_train_checkpoint(
    path: Path, *, payload: Payload | None = None, zip_format: bool = True
) -> Path:
    """A checkpoint shaped as vit-train writes one, of the tiny 3-class classifier (state_dict,
    hyper_parameters, the data's, loop and callback states); `payload` among the callbacks'."""
    module = tiny_classifier(network={"num_classes": 3}, class_names=list(TINY_DATA_CLASSES))
    ckpt = {
        "epoch": 1,
        "global_step": 12,
        "pytorch-lightning_version": L.__version__,
        "state_dict": module.state_dict(),
        "hyper_parameters": dict(module.hparams),
        "datamodule_hyper_parameters": {"source": "folder", "data_dir": str(path.parent)},
        "callbacks": {"LastCheckpoint": {"every_n_train_steps": 100}},
        "optimizer_states": [],
        "lr_schedulers": [],
    }
    if payload is not None:
        ckpt["callbacks"]["EMA"] = payload
    torch.save(ckpt, path, _use_new_zipfile_serialization=zip_format)
    return path


class KillAtStep(L.Callback):
    """SIGKILL this process once training reaches `step`, as a crash or the OOM killer would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def write_safetensors(
    model: VisionTransformer, path: Path, *, class_names: list[str], **extra
) -> Path:
    """`model` saved as export_safetensors saves a checkpoint's (weights, config, class names),
    with `extra` metadata such as shipped weights carry (recipe, test_top1, ...)."""
    import json

    from safetensors.torch import save_file

    from vit.checkpoint import SAFETENSORS_FORMAT, config_of

    metadata = {
        "format": SAFETENSORS_FORMAT,
        "config": json.dumps(config_of(model)),
        "class_names": json.dumps(class_names),
        **extra,
    }
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata=metadata)
    return path
