"""What a training step reads back to the host. On a GPU each read of a device tensor's value
(.item(), .tolist(), bool(), float()) makes the host wait for the GPU's queue to drain: the step
the GPU then waits for. So, between logging steps, a fit's steps (the module, Muon + AdamW, the
EMA, Mixup/CutMix, the finite-loss guard, device_data's gathering and augmentation) may read only
values that live on the host by design; metrics are read when logged. On this CPU every tensor is
a host tensor, so the test records where each read happens and holds those places to that list.
"""

from __future__ import annotations

import re
import traceback
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.helpers import tiny_datamodule
from vit.train.callbacks import EMA
from vit.train.callbacks.checkpointing import FiniteLoss
from vit.train.module import ViTClassifier

pytestmark = pytest.mark.usefixtures("cache_in_tmp")

LOG_EVERY = 4
# (file, function) pairs whose reads are of host values on a GPU too
ON_THE_HOST = {
    # torch's optimizers keep AdamW's step counts on the host unless capturable
    ("torch/optim/optimizer.py", "_get_value"),
    ("vit/train/muon.py", "_adamw"),  # MuonAdamW's AdamW part keeps them on the host too
    # Mixup/CutMix draw their lambda and box on the CPU (a CPU generator)
    ("vit/data/augment.py", "mix_batch"),
    # on a GPU the guard reads a host copy of the loss one step later (FiniteLoss's docstring)
    ("vit/train/callbacks/checkpointing.py", "_raise_if_not_finite"),
}
READS = ("item", "tolist", "__bool__", "__float__", "__int__")


def where(stack: list[traceback.FrameSummary]) -> tuple[str, str]:
    """The caller of the read: the first frame outside torch's Tensor class."""
    frame = next(f for f in reversed(stack) if not f.filename.endswith("torch/_tensor.py"))
    path = frame.filename.replace("\\", "/")
    for root in ("site-packages/", str(Path(__file__).resolve().parents[1]) + "/"):
        path = path.split(root)[-1]
    name = frame.name
    if "__mutmut_" in name:  # scripts/mutation_run.sh renames each function it wraps
        name = re.sub(r"__mutmut_\w+$", "", re.sub(r"^x(ǁ\w+ǁ|_)", "", name))
    return path, name


class Steps(L.Callback):
    """Which training step (1-based) is running, 0 outside them."""

    def __init__(self) -> None:
        self.step = 0

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        self.step = trainer.global_step + 1

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.step = 0


def test_training_steps_read_only_host_values_between_logs(
    image_tree: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    steps = Steps()
    reads: Counter[tuple[int, str, str]] = Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: object, _original=original) -> object:  # noqa: ANN001
            if steps.step:
                reads[(steps.step, *where(traceback.extract_stack()[:-1]))] += 1
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, read)
    module = ViTClassifier(
        network={"preset": "vit_nano", "patch_size": 8, "num_classes": 3},
        optimizer={"name": "muon"},
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        mix_prob=0.5,
    )
    data = tiny_datamodule(image_tree, batch_size=4, device_data=True)  # 30 images: 7 steps
    trainer = L.Trainer(
        max_epochs=2,
        log_every_n_steps=LOG_EVERY,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        logger=L.pytorch.loggers.CSVLogger(tmp_path),
        callbacks=[steps, EMA(decay=0.9), FiniteLoss()],
    )
    trainer.fit(module, data)
    assert trainer.global_step >= 3 * LOG_EVERY
    quiet = {(file, fn) for (step, file, fn) in reads if step % LOG_EVERY}
    assert quiet, "no read recorded at all: the recording is broken"
    assert quiet <= ON_THE_HOST, sorted(quiet - ON_THE_HOST)
