"""A run SIGKILLed mid-epoch resumes with --ckpt_path last and ends exactly like an uninterrupted one."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, tiny_classifier, train_args
from vit.checkpoint import load_checkpoint
from vit.cli import train_main

EVERY_STEP = (
    '[{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
    '"init_args": {"every_n_train_steps": 1, "save_last": true, "save_top_k": 0}}'
)


def _args(data: Path, runs: Path, *extra: str) -> list[str]:
    args = [a for a in train_args(data, runs) if not a.startswith("--trainer.callbacks")]
    return [
        *args,
        "--trainer.max_epochs=3",
        "--trainer.deterministic=true",
        "--seed_everything=7",
        "--model.network.drop_rate=0.1",
        "--model.network.drop_path_rate=0.1",
        *extra,
    ]


def _final_val_acc(run: Path) -> list[str]:
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    return [r["val/acc"] for r in rows if r.get("val/acc")]


def test_sigkill_mid_epoch_then_resume_matches_uninterrupted(make_image_tree, tmp_path) -> None:
    data = make_image_tree(tmp_path / "data", train_per_class=30)  # 84 train images: 10 steps/epoch
    train_main(_args(data, tmp_path / "a", f"--trainer.callbacks={EVERY_STEP}]"))

    killer = (
        EVERY_STEP + ', {"class_path": "tests.conftest.KillAtStep", "init_args": {"step": 14}}]'
    )
    code = f"from vit.cli import train_main; train_main({json.dumps(_args(data, tmp_path / 'b'))} + [{json.dumps('--trainer.callbacks=' + killer)}])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]  # killed, not finished
    last = tmp_path / "b" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    killed_at = load_checkpoint(last)["global_step"]
    assert killed_at == 13 and killed_at % 10 != 0  # mid-epoch (epoch 1, batch 4)

    train_main(
        _args(data, tmp_path / "b", f"--trainer.callbacks={EVERY_STEP}]", "--ckpt_path=last")
    )
    a = load_checkpoint(tmp_path / "a" / "tiny" / "version_0" / "checkpoints" / "last.ckpt")
    b = load_checkpoint(last)  # the resumed run kept writing into its own folder
    assert a["global_step"] == b["global_step"] == 30
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    run_a, run_b = tmp_path / "a" / "tiny" / "version_0", tmp_path / "b" / "tiny" / "version_0"
    assert _final_val_acc(run_a)[-1] == _final_val_acc(run_b)[-1]


def test_disk_full_during_a_save_leaves_the_previous_last_checkpoint(image_tree, tmp_path) -> None:
    """A save that dies half-way (ENOSPC) raises, and last.ckpt still holds the previous save."""
    import errno

    import lightning as L
    from fsspec.implementations.local import LocalFileOpener
    from lightning.pytorch.callbacks import ModelCheckpoint

    from vit.data import CIFAR10DataModule

    dm = CIFAR10DataModule(
        data_dir=str(image_tree), cache_dir=str(tmp_path / "cache"), batch_size=8, val_size=6
    )
    module = tiny_classifier(network={"num_classes": 3})
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
    trainer = L.Trainer(max_epochs=1, logger=False, callbacks=[ckpt], enable_progress_bar=False)
    trainer.fit(module, dm)
    last = tmp_path / "ckpt" / "last.ckpt"
    good = last.read_bytes()

    real_write = LocalFileOpener.write

    def write_half_then_fail(self, data, *args, **kwargs):
        real_write(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    LocalFileOpener.write = write_half_then_fail
    try:
        trainer = L.Trainer(max_epochs=2, logger=False, callbacks=[ckpt], enable_progress_bar=False)
        with pytest.raises(OSError, match="No space left on device"):
            trainer.fit(module, dm, ckpt_path=last)
    finally:
        LocalFileOpener.write = real_write
    assert last.read_bytes() == good  # not half-written: the write went to a temporary file
    assert load_checkpoint(last)["global_step"] == 3


def test_last_checkpoint_is_written_by_step_and_at_every_epoch_end(tmp_path) -> None:
    """every_n_train_steps=3 with 4 steps an epoch: last.ckpt still ends at the final step (8)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from vit.callbacks import LastCheckpoint

    steps_seen = []

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            path = tmp_path / "ckpt" / "last.ckpt"
            if path.exists():
                steps_seen.append(load_checkpoint(path)["global_step"])

    data = DataLoader(
        TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 3, (64,))), batch_size=16
    )
    module = tiny_classifier(network={"num_classes": 3})
    trainer = L.Trainer(
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        callbacks=[Watch(), LastCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=3)],
    )
    trainer.fit(module, data)
    assert 3 in steps_seen and 6 in steps_seen  # by step, mid-epoch
    assert load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["global_step"] == 8  # and at the end
