"""Helpers shared by the tests: a tiny model (patch 8, width 32, depth 2, heads 2), small data made
on the fly, the repository's paths. The pytest fixtures built on them live in conftest.py."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib
import pickle
import signal
import tarfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from vit.model.attention import Attention
from vit.model.vision_transformer import VisionTransformer
from vit.train.callbacks.budget import TimeBudget
from vit.train.muon import NS_COEFFICIENTS

if TYPE_CHECKING:
    from vit.train.datamodule import CIFAR10DataModule
    from vit.train.module import ViTClassifier

REPO = Path(__file__).resolve().parents[1]
CIFAR_ARCHIVE = REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
SHIPPED = "vit-tiny-d4-cifar10-cpu60"  # the weights in vit/io/weights/
RESULTS = REPO / "experiments" / "record" / "results"
SHIPPED_RUN = RESULTS / "2026-12-01-amx-gap-train50k-seed1"  # the run that made them


def recorded_test_metrics() -> dict:
    """The shipped weights' run's stored test metrics (vit-evaluate's metrics_test.json), not
    the weights' word: top1 over CIFAR-10's 10,000 test images, per_class, ..."""
    return json.loads((SHIPPED_RUN / "metrics_test.json").read_text())


# /proc/cpuinfo of an AMD CPU with AVX2 and FMA (two cores), for vit.system.mkl_amd's checks
AMD = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\n\nvendor_id\t: AuthenticAMD\n"

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
) -> ViTClassifier:
    """ViTClassifier of the tiny model (vit_nano's options, TINY's sizes); `network`, `optimizer`
    and `schedule` update those groups, `options` are its other arguments."""
    from vit.train.module import ViTClassifier

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


def sum_tol(dtype: torch.dtype, k: int, scale: float | torch.Tensor = 1.0) -> float:
    """A bound for two computations of the same float sums that differ only in order or kernel
    (another CPU's vector width, fused or explicit, a reference): a sum of k terms is within
    k * eps / 2 of the exact one times `scale`, the terms' magnitudes added up (the textbook worst
    case; typical errors are nearer sqrt(k) * eps / 2), so two are within k * eps * scale."""
    return torch.finfo(dtype).eps * k * float(torch.as_tensor(scale).detach())


def ns_tol(dtype: torch.dtype, m: int, n: int, scale: float = 1.0, *, steps: int = 5) -> float:
    """Newton-Schulz on an m x n matrix (m <= n) against another order of its sums, relative to
    the result's entries (`scale`: their largest; at most 1, the spectral norm): each step sums n
    terms, then 4 m at most (the loop 2 m, the Gram form 4 m), and a step grows an earlier error
    by up to the iteration's slope at zero, a."""
    a = NS_COEFFICIENTS[0]
    return sum_tol(dtype, n + 4 * m, scale) * (a**steps - 1) / (a - 1)


def mixed_model() -> torch.nn.Sequential:
    """The model mixed_groups splits: a qkv-like layer (8 -> 24) and a plain one (24 -> 8)."""
    return torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.Linear(24, 8))


def mixed_groups(model: torch.nn.Sequential) -> list[dict]:
    """For mixed_model(): a qkv-like matrix (a split Muon group), a plain one, and AdamW groups
    at two learning rates (stepped apart)."""
    return [
        {"params": [model[0].weight], "use_muon": True, "split": 3},
        {"params": [model[1].weight], "use_muon": True},
        {"params": [model[0].bias], "weight_decay": 0.0},
        {"params": [model[1].bias], "weight_decay": 0.0, "lr": 3e-3},
    ]


def schedule_lr(opt: torch.optim.Optimizer, step: int) -> None:
    """What a schedule does to each group before step `step`: a new lr, 1 - 0.3 step times the
    group's first (kept in the group as "peak")."""
    for group in opt.param_groups:
        group["lr"] = group.setdefault("peak", group["lr"]) * (1.0 - 0.3 * step)


def forward_sums(model: VisionTransformer) -> int:
    """The lengths of the sums a value passes through in model's forward, added up (k for
    sum_tol where two forwards differ in every sum's order): the patch projection (and SPT's
    LayerNorm), per block two LayerNorms, qkv, scores, softmax, context, proj, fc1 and fc2, then
    the final norm and the head."""
    c, n = model.embed_dim, model.patch_embed.num_patches + model.num_prefix_tokens
    fan_in = model.patch_embed.proj.weight[0].numel() * (2 if model.patch_embed.spt else 1)
    attn, hidden = model.blocks[0].attn, model.blocks[0].mlp.fc1.out_features
    block = 2 * c + c + attn.head_dim + 2 * n + c + c + hidden
    return fan_in + len(model.blocks) * block + 2 * c


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


class FakeClock:
    """Advances `tick` seconds each time it is read: a deterministic stand-in for wall time
    (tick 0: it moves only when a test moves `now`)."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


# a schedule a TimeBudget can run: no epoch warm-up, a tenth of the budget instead
BUDGET_SCHEDULE = {"warmup_epochs": 0.0, "warmup_fraction": 0.1}


def budget(minutes: float = 1.0, tick: float = 1.0) -> TimeBudget:
    """A TimeBudget on a FakeClock: each read of the clock is `tick` seconds later."""
    callback = TimeBudget(minutes=minutes)
    callback.clock = FakeClock(tick)
    return callback


class GraphCount(L.Callback):
    """The graphs dynamo has compiled so far, read when training starts and when it ends: a fit
    that compiles everything before its first step reads the same twice."""

    def __init__(self) -> None:
        self.graphs: list[int] = []

    def _read(self, *_: object) -> None:
        from torch._dynamo.utils import counters

        self.graphs.append(counters["stats"]["unique_graphs"])

    on_train_start = on_train_end = _read


def compile_with_eager_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile (and so nn.Module.compile) with dynamo's eager backend, any mode dropped: the
    graphs and guards inductor would get, no code generated and no C++ compiler asked for.
    Dynamo's counts start from zero."""
    from torch._dynamo.utils import counters

    real = torch.compile

    def compile_eagerly(model=None, **kwargs):  # noqa: ANN001, ANN202
        kwargs = {k: v for k, v in kwargs.items() if k not in ("mode", "backend")}
        if model is None:  # used as a decorator factory
            return functools.partial(compile_eagerly, **kwargs)
        return real(model, backend="eager", **kwargs)

    monkeypatch.setattr(torch, "compile", compile_eagerly)
    monkeypatch.setattr("vit.train.module.check_cpp_compiler", lambda: None)
    torch._dynamo.reset()
    counters.clear()


# ---- data: tiny image-folder trees, archives and CIFAR-10 releases written on the fly ----------

TINY_DATA_CLASSES = ("bird", "cat", "dog")


def write_image_tree(root: Path, *, train_per_class: int = 12, test_per_class: int = 4) -> Path:
    """root/{train,test}/<class>/NNNN.{png,jpg}: seeded random 32x32 RGB, every third a JPEG."""
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


def write_tar(root: Path, archive: Path, *, top: str | None = "tiny") -> Path:
    """Tar root/train and root/test into `archive` (gzip by suffix), under folder `top` if given."""
    mode = "w:gz" if archive.name.endswith((".gz", ".tgz")) else "w"
    with tarfile.open(archive, mode) as tar:
        for split in ("train", "test"):
            tar.add(root / split, arcname=f"{top}/{split}" if top else split)
    return archive


def write_fake_cifar(root: Path, *, per_batch: int = 4) -> dict[str, np.ndarray]:
    """cifar-10-batches-py in the real pickle format: rows of 3072 bytes, R then G then B planes."""
    from vit.data.datasets import CIFAR10_CLASSES

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        entry = {
            "batch_label": name,
            "data": data,
            "labels": labels,
            "filenames": ["x.png"] * per_batch,
        }
        (folder / name).write_bytes(pickle.dumps(entry))
        written[name] = data
    meta = {"label_names": list(CIFAR10_CLASSES), "num_cases_per_batch": per_batch, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    return written


def tiny_datamodule(data_dir: Path, **kwargs: object) -> CIFAR10DataModule:
    """CIFAR10DataModule of data_dir with 6 validation images in batches of 8; `kwargs` override."""
    from vit.train.datamodule import CIFAR10DataModule

    defaults = dict(data_dir=str(data_dir), val_size=6, batch_size=8)
    return CIFAR10DataModule(**{**defaults, **kwargs})


# ---- a tiny training run, and checkpoints shaped as vit-train writes them ----------------------

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


class TermAtStep(L.Callback):
    """SIGTERM this process during optimizer step `step` (after its forward, before its backward),
    as a preempted machine or a scheduler's time limit would. `again_in_save`: once more from
    inside the next checkpoint write, half-way through its bytes. `signum`: another signal
    (SIGINT: Ctrl-C)."""

    def __init__(
        self, step: int, again_in_save: bool = False, signum: int = signal.SIGTERM
    ) -> None:
        self.step, self.again_in_save, self.signum = step, again_in_save, signum

    def on_before_backward(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step + 1 != self.step:
            return
        if self.again_in_save:
            from fsspec.implementations.local import LocalFileOpener

            real_write = LocalFileOpener.write

            def write_and_signal(opener: LocalFileOpener, data: bytes) -> int:
                LocalFileOpener.write = real_write  # once
                half = len(data) // 2
                written = real_write(opener, data[:half])
                os.kill(os.getpid(), self.signum)
                return written + real_write(opener, data[half:])

            LocalFileOpener.write = write_and_signal
        os.kill(os.getpid(), self.signum)


def write_safetensors(
    model: VisionTransformer, path: Path, *, class_names: list[str], **extra
) -> Path:
    """`model` saved as export_safetensors saves a checkpoint's (weights, config, class names),
    with `extra` metadata such as shipped weights carry (recipe, test_top1, ...)."""
    from safetensors.torch import save_file

    from vit.io.safetensors_file import SAFETENSORS_FORMAT
    from vit.io.timm_interop import config_of

    metadata = {
        "format": SAFETENSORS_FORMAT,
        "config": json.dumps(config_of(model)),
        "class_names": json.dumps(class_names),
        **extra,
    }
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata=metadata)
    return path


def write_cifar100(
    root: Path, *, num_train: int = 40, num_test: int = 20, seed: int = 0, archive: bool = False
) -> Path:
    """CIFAR-100's release layout (cifar-100-python/{meta,train,test}, pickles of protocol 2 as
    the official files) with seeded random images; fine labels cycle 0..99, coarse = fine // 5.
    Returns root (the folder holding cifar-100-python/) or, with `archive`, the path of a
    cifar-100-python.tar.gz of it."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    meta = {
        "fine_label_names": [f"fine_{i:02d}" for i in range(100)],
        "coarse_label_names": [f"coarse_{i:02d}" for i in range(20)],
    }
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    for split, n in (("train", num_train), ("test", num_test)):
        data = torch.randint(0, 256, (n, 3072), dtype=torch.uint8, generator=gen).numpy()
        fine = [(i + 7 * (split == "test")) % 100 for i in range(n)]
        entry = {
            "filenames": [f"{split}_{i}.png" for i in range(n)],
            "batch_label": f"{split} batch",
            "fine_labels": fine,
            "coarse_labels": [f // 5 for f in fine],
            "data": data,
        }
        (folder / split).write_bytes(pickle.dumps(entry, protocol=2))
    if not archive:
        return root
    out = root / "cifar-100-python.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(folder, arcname="cifar-100-python")
    return out
