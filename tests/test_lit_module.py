"""ViTClassifier: optimizer groups, schedule, logged metrics, config errors."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import TINY
from vit.lit_module import ViTClassifier, WarmupCosine, param_groups

TINY_ARGS = {k: v for k, v in TINY.items() if k != "img_size"}


def test_weight_decay_spares_biases_norms_cls_and_positions() -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS)
    decay, no_decay = param_groups(module.model, weight_decay=0.05)
    names = {id(p): n for n, p in module.model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    spared = {names[id(p)] for p in no_decay["params"]}
    assert {"cls_token", "pos_embed", "blocks.0.norm1.weight", "head.bias"} <= spared
    assert {"blocks.0.attn.qkv.weight", "patch_embed.proj.weight", "head.weight"} <= decayed
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert len(decayed) + len(spared) == len(list(module.model.parameters()))


def test_warmup_then_cosine_reaches_the_floor_at_the_end() -> None:
    f = WarmupCosine(total_steps=100, warmup_steps=10, min_ratio=0.1)
    values = [f(s) for s in range(101)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(values[:10], values[1:10], strict=False))  # rising
    assert all(a >= b for a, b in zip(values[10:], values[11:], strict=False))  # falling
    assert values[100] == pytest.approx(0.1)


def test_sizes_come_from_the_preset_unless_overridden() -> None:
    module = ViTClassifier(preset="vit_tiny", depth=2)
    assert module.model.embed_dim == 192 and len(module.model.blocks) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(lr=-1e-3), "lr=-0.001 must be positive"),
        (dict(label_smoothing=1.5), "label_smoothing=1.5"),
        (dict(preset="vit_giant"), "unknown preset 'vit_giant'"),
        (dict(patch_size=64), "larger than img_size"),
        (dict(drop_rate=1.2), "drop_rate=1.2"),
    ],
)
def test_bad_values_fail_clearly(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ViTClassifier(**kwargs)


def _loader(n: int = 64) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(
            torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        ),
        batch_size=16,
    )


def test_fit_logs_stage_metrics_and_steps_the_schedule(tmp_path) -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS, lr=1e-3, warmup_epochs=1.0)
    trainer = L.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, _loader(), _loader(32))
    logged = trainer.callback_metrics
    for key in ("train/loss", "train/acc", "train/acc5", "val/loss", "val/acc", "val/acc5"):
        assert key in logged, key
    assert 0 <= logged["val/acc"] <= logged["val/acc5"] <= 1
    # 4 steps per epoch, 1 warm-up epoch, cosine over the other: the lr is near zero at the end
    assert trainer.optimizers[0].param_groups[0]["lr"] < 1e-4
    trainer.test(module, _loader(32))
    assert "test/acc" in trainer.callback_metrics


def test_max_epochs_is_required_for_the_schedule(tmp_path) -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS)
    trainer = L.Trainer(
        max_epochs=-1,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(ValueError, match="max_epochs"):
        trainer.fit(module, _loader())


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    module = ViTClassifier(preset="vit_nano", **TINY_ARGS)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)
    trainer = L.Trainer(
        max_epochs=3,
        logger=False,
        callbacks=[ckpt],
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, _loader())  # 4 steps per epoch, a checkpoint every 2
    good = (tmp_path / "last.ckpt").read_bytes()
    bad = torch.randn(16, 3, 32, 32)
    bad[0, 0, 0, 0] = float("nan")
    trainer = L.Trainer(
        max_epochs=4,
        logger=False,
        callbacks=[ckpt],
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(FloatingPointError, match=r"loss is nan at step 12 \(epoch 3, batch 0\)"):
        trainer.fit(
            module,
            DataLoader(TensorDataset(bad, torch.zeros(16, dtype=torch.long)), batch_size=16),
            ckpt_path=tmp_path / "last.ckpt",
        )
    assert (tmp_path / "last.ckpt").read_bytes() == good
