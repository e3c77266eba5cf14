"""Lightning DDP on 2 CPU processes (gloo): one step equals one process on the same global batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.conftest import CIFAR_ARCHIVE, REPO
from vit.data import CIFAR10DataModule
from vit.lit_module import ViTClassifier

TINY_CLASSIFIER = dict(
    preset="vit_nano", num_classes=3, patch_size=8, embed_dim=32, depth=2, num_heads=2
)


class SaveGrads(L.Callback):
    """Rank 0 saves the (all-reduced, under DDP) gradients just before the optimizer step."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.is_global_zero:
            grads = {n: p.grad.clone() for n, p in pl_module.model.named_parameters()}
            torch.save(grads, self.path)


def _one_step(data: Path, tmp: Path, name: str, *, batch_size: int, **trainer_kwargs):
    dm = CIFAR10DataModule(
        data_dir=str(data),
        cache_dir=str(tmp / "cache"),
        batch_size=batch_size,
        val_size=6,
        crop_padding=0,
        hflip=False,
    )  # no augmentation: same pixels
    torch.manual_seed(0)
    module = ViTClassifier(**TINY_CLASSIFIER, warmup_epochs=0.0, lr=1e-2)
    trainer = L.Trainer(
        max_steps=1,
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[SaveGrads(str(tmp / f"{name}.pt"))],
        **trainer_kwargs,
    )
    trainer.fit(module, dm)
    weights = {k: v.detach().clone() for k, v in module.model.state_dict().items()}
    return weights, torch.load(tmp / f"{name}.pt", weights_only=True)


def test_ddp_step_equals_single_process_on_the_global_batch(image_tree: Path, tmp_path) -> None:
    w1, g1 = _one_step(image_tree, tmp_path, "single", batch_size=16, devices=1)
    w2, g2 = _one_step(image_tree, tmp_path, "ddp", batch_size=8, devices=2, strategy="ddp_spawn")
    torch.manual_seed(0)
    initial = ViTClassifier(**TINY_CLASSIFIER).model.state_dict()
    for name, grad in g1.items():  # DDP's averaged gradient == the global batch's gradient
        assert torch.allclose(g2[name], grad, rtol=1e-4, atol=1e-7), name
    for name, value in w1.items():  # and so the same AdamW update, where the gradient is not ~0
        clear = g1[name].abs() > 1e-6  # (Adam's g / (|g| + eps) amplifies noise near zero)
        assert torch.allclose(w2[name][clear], value[clear], atol=1e-6), name
        assert not torch.equal(value[clear], initial[name][clear]), name  # the step moved them


@pytest.mark.slow
@pytest.mark.skipif(
    not CIFAR_ARCHIVE.is_file(), reason=f"CIFAR-10 archive not found at {CIFAR_ARCHIVE}"
)
def test_quick_config_runs_under_ddp_on_two_cpu_processes(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "vit.cli",
        "-c",
        str(REPO / "experiments/quick.yaml"),
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        "--trainer.max_steps=4",
        "--trainer.limit_val_batches=2",
        "--trainer.enable_progress_bar=false",
        "--data.train_subset=2048",
        f"--data.data_dir={CIFAR_ARCHIVE}",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=4` reached" in proc.stderr
