"""ViTClassifier: optimizer groups, schedule, logged metrics, config errors."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from tests.conftest import TINY_ARGS, head_products, quiet_trainer, random_loader
from vit.embed import sincos_2d_table
from vit.lit_module import ViTClassifier, WarmupCosine, param_groups


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


def test_linear_decay_falls_in_a_straight_line_to_the_floor() -> None:
    linear = WarmupCosine(total_steps=110, warmup_steps=10, min_ratio=0.1, decay="linear")
    cosine = WarmupCosine(total_steps=110, warmup_steps=10, min_ratio=0.1)
    assert [linear(s) for s in range(10)] == [cosine(s) for s in range(10)]  # same warm-up
    steps = [linear(s) - linear(s + 1) for s in range(10, 110)]
    assert steps == pytest.approx([0.9 / 100] * 100)  # equal steps down, from 1 to the floor
    assert linear(35) == pytest.approx(0.1 + 0.9 * 0.75)  # a quarter of the way: 3/4 of the way up
    assert cosine(35) > linear(35) and cosine(85) < linear(85)  # cosine: higher, then lower
    assert linear(110) == pytest.approx(0.1) and linear(500) == pytest.approx(0.1)


def test_attn_init_reaches_the_model() -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS, attn_init="mimetic")
    qk = head_products(module.model.blocks[0].attn)[0][0]
    assert qk.diagonal().mean() > 0.2  # W_q^T W_k near +identity
    assert module.hparams.attn_init == "mimetic"  # saved: checkpoints rebuild the same model


def test_pos_init_reaches_the_model() -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS, pos_init="sincos2d")
    grid = module.model.patch_embed.grid_size
    assert torch.allclose(
        module.model.pos_embed[0, 1:], sincos_2d_table(grid, module.model.embed_dim)
    )
    assert module.hparams.pos_init == "sincos2d"


def test_lsa_reaches_the_model_and_its_temperatures_are_not_decayed() -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS, lsa=True)
    assert all(block.attn.lsa for block in module.model.blocks)
    temps = {id(block.attn.temperature) for block in module.model.blocks}
    groups = param_groups(module.model, weight_decay=0.05)
    assert temps <= {id(p) for p in groups[1]["params"]} and groups[1]["weight_decay"] == 0.0


def test_spt_reaches_the_model_and_only_its_projection_is_decayed() -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS, spt=True)
    embed = module.model.patch_embed
    assert embed.spt and isinstance(embed.proj, torch.nn.Linear)
    decayed, not_decayed = (
        {id(p) for p in g["params"]} for g in param_groups(module.model, weight_decay=0.05)
    )
    assert id(embed.proj.weight) in decayed
    assert {id(embed.norm.weight), id(embed.norm.bias), id(embed.proj.bias)} <= not_decayed


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
        (dict(mixup_alpha=-0.2), "mixup_alpha=-0.2"),
        (dict(cutmix_alpha=1.0, mix_prob=2.0), "mix_prob=2.0 in \\[0, 1\\]"),
        (dict(lr_decay="step"), "lr_decay='step' is not a schedule shape"),
        (dict(compile_mode="fast"), "compile_mode='fast': expected one of .*reduce-overhead"),
    ],
)
def test_bad_values_fail_clearly(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ViTClassifier(**kwargs)


def test_fit_logs_stage_metrics_and_steps_the_schedule(tmp_path) -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS, lr=1e-3, warmup_epochs=1.0)
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=2,
    )
    trainer.fit(module, random_loader(), random_loader(32))
    logged = trainer.callback_metrics
    for key in ("train/loss", "train/acc", "train/acc5", "val/loss", "val/acc", "val/acc5"):
        assert key in logged, key
    assert 0 <= logged["val/acc"] <= logged["val/acc5"] <= 1
    # 4 steps per epoch, 1 warm-up epoch, cosine over the other: the lr is near zero at the end
    assert trainer.optimizers[0].param_groups[0]["lr"] < 1e-4
    trainer.test(module, random_loader(32))
    assert "test/acc" in trainer.callback_metrics


def test_max_epochs_is_required_for_the_schedule(tmp_path) -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS)
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=-1,
        max_steps=2,
    )
    with pytest.raises(ValueError, match="max_epochs"):
        trainer.fit(module, random_loader())


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    module = ViTClassifier(preset="vit_nano", **TINY_ARGS)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=3,
        callbacks=[ckpt],
        enable_checkpointing=True,
    )
    trainer.fit(module, random_loader())  # 4 steps per epoch, a checkpoint every 2
    good = (tmp_path / "last.ckpt").read_bytes()
    bad = torch.randn(16, 3, 32, 32)
    bad[0, 0, 0, 0] = float("nan")
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=4,
        callbacks=[ckpt],
        enable_checkpointing=True,
    )
    with pytest.raises(FloatingPointError, match=r"loss is nan at step 12 \(epoch 3, batch 0\)"):
        trainer.fit(
            module,
            DataLoader(TensorDataset(bad, torch.zeros(16, dtype=torch.long)), batch_size=16),
            ckpt_path=tmp_path / "last.ckpt",
        )
    assert (tmp_path / "last.ckpt").read_bytes() == good


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([[0.1, 16], [0.5, 32]], "must start at 0, rise, and stay below 1"),
        ([[0, 16], [0, 32]], "must start at 0, rise"),
        ([[0, 16], [1.0, 32]], "stay below 1"),
        ([[0, 12], [0.5, 32]], "side 12 is not a positive multiple of patch_size=8"),
        ([[0]], "must be a list of \\[fraction, side\\]"),
    ],
)
def test_bad_resolution_schedules_fail_clearly(schedule: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ViTClassifier(preset="vit_nano", **TINY_ARGS, res_schedule=schedule)


def test_resolution_curriculum_trains_on_smaller_images_then_full_size(tmp_path) -> None:
    module = ViTClassifier(
        preset="vit_nano",
        **TINY_ARGS,
        res_schedule=[[0, 16], [0.3, 24], [0.6, 32]],
        fused_adamw=True,
    )
    assert [module.train_resolution(p) for p in (0, 0.29, 0.3, 0.59, 0.6, 1.0)] == [
        16,
        16,
        24,
        24,
        32,
        32,
    ]
    seen: list[tuple[bool, int]] = []
    module.model.patch_embed.register_forward_pre_hook(
        lambda m, args: seen.append((m.training, args[0].shape[-1]))
    )
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=3,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, random_loader(32), random_loader(16))
    train_sides = [side for training, side in seen if training]
    # 6 steps: progress 0, 1/6 -> 16; 2/6, 3/6 -> 24; 4/6, 5/6 -> 32
    assert train_sides == [16, 16, 24, 24, 32, 32]
    assert {side for training, side in seen if not training} == {32}  # validation: full size
    assert trainer.optimizers[0].defaults["fused"] is True


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(patch_drop_schedule=[[0.2, 0.5]]), "must start at 0, rise, and stay below 1"),
        (dict(patch_drop_schedule=[[0, 1.0]]), "rate 1.0 must be in \\[0, 1\\)"),
        (dict(patch_drop_schedule=[[0, "half"]]), "must be a list of \\[fraction, rate\\]"),
        (dict(patch_drop_schedule=[[0, 0.5]], patch_drop_rate=0.5), "use one"),
        (dict(patch_drop_rate=-0.1), "patch_drop_rate=-0.1 must be in"),
    ],
)
def test_bad_patch_drop_settings_fail_clearly(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ViTClassifier(preset="vit_nano", **TINY_ARGS, **kwargs)


def test_patch_drop_schedule_cuts_training_tokens_by_stage_and_never_evaluation(tmp_path) -> None:
    assert ViTClassifier(**TINY_ARGS, patch_drop_rate=0.25).model.patch_drop_rate == 0.25
    module = ViTClassifier(
        preset="vit_nano", **TINY_ARGS, patch_drop_schedule=[[0, 0.0], [0.3, 0.5], [0.6, 0.75]]
    )
    seen: list[tuple[bool, int]] = []
    module.model.blocks[0].register_forward_pre_hook(
        lambda m, args: seen.append((m.training, args[0].shape[1]))
    )
    trainer = quiet_trainer(tmp_path, max_epochs=3, num_sanity_val_steps=0)
    trainer.fit(module, random_loader(32), random_loader(16))
    # 16 patches + CLS; 6 steps: progress 0, 1/6 -> all; 2/6, 3/6 -> 8 kept; 4/6, 5/6 -> 4 kept
    assert [n for training, n in seen if training] == [17, 17, 9, 9, 5, 5]
    assert {n for training, n in seen if not training} == {17}  # validation: every token


def test_test_flip_scores_the_mean_of_image_and_mirror(tmp_path) -> None:
    torch.manual_seed(0)
    plain = ViTClassifier(preset="vit_nano", **TINY_ARGS)
    flipped = ViTClassifier(preset="vit_nano", **TINY_ARGS, test_flip=True)
    flipped.load_state_dict(plain.state_dict())
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    expected = F.cross_entropy((plain(x) + plain(x.flip(-1))) / 2, y)
    trainer = quiet_trainer(tmp_path)
    loss = trainer.test(flipped, DataLoader(TensorDataset(x, y), batch_size=8), verbose=False)
    assert loss[0]["test/loss"] == pytest.approx(expected.item(), rel=1e-5)
    unflipped = F.cross_entropy(plain(x), y).item()
    assert loss[0]["test/loss"] != pytest.approx(unflipped, rel=1e-5)


def test_accuracy_is_the_fraction_of_images_right_on_an_unbalanced_split(tmp_path) -> None:
    """val/acc and test/acc are top-1 over images (vit-evaluate's and timm's number), not the mean
    of the per-class accuracies (torchmetrics' default), which differ on an unbalanced split."""
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS)
    with torch.no_grad():  # the model answers class 0 for every image
        module.model.head.weight.zero_()
        module.model.head.bias.copy_(torch.arange(10, 0, -1, dtype=torch.float))
    x = torch.randn(32, 3, 32, 32)
    y = torch.tensor([0] * 24 + [1] * 8)  # 24 of class 0 right, 8 of class 1 wrong
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    trainer = quiet_trainer(tmp_path)
    val = trainer.validate(module, loader, verbose=False)[0]
    test = trainer.test(module, loader, verbose=False)[0]
    assert val["val/acc"] == pytest.approx(0.75)  # per-class mean: (1 + 0) / 2 = 0.5
    assert test["test/acc"] == pytest.approx(0.75)


def test_checkpoints_with_per_class_accuracy_counts_still_load() -> None:
    """Checkpoints from before the micro average hold per-class counts (shape (10,)): they load,
    summed into the micro counts a fresh metric would have made from the same batches."""
    old = MulticlassAccuracy(num_classes=10, top_k=1)  # the macro default those were saved with
    new = ViTClassifier(preset="vit_nano", **TINY_ARGS)
    logits, labels = torch.randn(40, 10), torch.randint(0, 10, (40,))
    old.update(logits, labels)
    new.metrics["val_acc1"].update(logits, labels)
    expected = {k: v.clone() for k, v in new.state_dict().items() if k.startswith("metrics.")}
    state = new.state_dict()
    for name in ("tp", "fp", "tn", "fn"):
        state[f"metrics.val_acc1.{name}"] = getattr(old, name).clone()
    checkpoint = {"state_dict": state, "current_model_state": dict(state)}
    new.on_load_checkpoint(checkpoint)
    for key in ("state_dict", "current_model_state"):
        new.load_state_dict(checkpoint[key])  # strict: a shape left at (10,) would raise
        for name, value in expected.items():
            assert torch.equal(new.state_dict()[name], value), name


def test_mixup_and_cutmix_train_on_soft_targets(tmp_path, monkeypatch) -> None:
    import vit.lit_module as lm

    calls: list[tuple[float, float]] = []
    real = lm.mix_batch

    def spy(images, labels, **kw):
        out, targets = real(images, labels, **kw)
        calls.append((targets.max().item(), targets.sum(1).mean().item()))
        return out, targets

    monkeypatch.setattr(lm, "mix_batch", spy)
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS, mixup_alpha=0.8, cutmix_alpha=1.0)
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=1,
    )
    trainer.fit(module, random_loader(64), random_loader(16))
    assert len(calls) == 4  # every training step, no validation step
    assert any(peak < 1.0 for peak, _ in calls)  # some targets are really mixed
    assert all(total == pytest.approx(1.0) for _, total in calls)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert 0 <= trainer.callback_metrics["train/acc"] <= 1


class FakeClock:
    """Advances `tick` seconds each time it is read: a deterministic stand-in for wall time."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_time_budget_anneals_to_zero_and_stops_when_the_time_is_up(tmp_path) -> None:
    module = ViTClassifier(
        preset="vit_nano",
        **TINY_ARGS,
        time_budget_min=1.0,
        warmup_fraction=0.1,
        res_schedule=[[0, 16], [0.5, 32]],
    )
    module._clock = FakeClock(tick=1.0)  # each read is a second later: ~2 s per step
    lrs, sides = [], []
    module.model.patch_embed.register_forward_pre_hook(
        lambda m, args: sides.append(args[0].shape[-1]) if m.training else None
    )

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    trainer = quiet_trainer(
        tmp_path,
        max_epochs=1000,  # an upper bound: the budget ends training
        num_sanity_val_steps=0,
        val_check_interval="01:00:00:00",  # only the last validation, the one the stop triggers
        callbacks=[Record()],
    )
    trainer.fit(module, random_loader(32), random_loader(16))
    assert trainer.current_epoch < 999 and 20 <= trainer.global_step <= 40  # 60 s at ~2 s a step
    assert module.progress() == 1.0
    assert module._off_clock_s == 0.0  # eager: every second is on the schedule's clock
    assert max(lrs) == pytest.approx(1e-3, rel=0.05) and lrs[-1] < 5e-5  # warmed up, annealed
    assert trainer.optimizers[0].param_groups[0]["lr"] < 1e-6  # at zero when the time is up
    assert "val/acc" in trainer.callback_metrics  # the stop ran a final validation
    assert sides[0] == 16 and sides[-1] == 32


def test_time_budget_with_linear_decay_steps_the_lr_down_evenly(tmp_path) -> None:
    module = ViTClassifier(
        preset="vit_nano", **TINY_ARGS, time_budget_min=1.0, warmup_fraction=0.1, lr_decay="linear"
    )
    module._clock = FakeClock(tick=1.0)  # the same time per step: the same fall per step
    lrs = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    trainer = quiet_trainer(
        tmp_path,
        max_epochs=1000,
        num_sanity_val_steps=0,
        val_check_interval="01:00:00:00",
        callbacks=[Record()],
    )
    trainer.fit(module, random_loader(32), random_loader(16))
    peak = lrs.index(max(lrs))
    falls = [a - b for a, b in zip(lrs[peak:-1], lrs[peak + 1 :], strict=True)]
    assert len(falls) >= 15 and max(lrs) == pytest.approx(1e-3, rel=0.1)
    assert max(falls) - min(falls) < 0.1 * max(falls)  # a straight line (a cosine's vary 0-2x)
    assert lrs[-1] < 1.5 * max(falls)  # the last step ran at most one fall above zero


def test_time_budget_compiles_do_not_spend_the_warmup(tmp_path, monkeypatch) -> None:
    """With torch_compile, the first training step and the first validation of a fit (where it
    compiles: here 20 s and 10 s of a 60 s budget, faked) count toward the budget but not toward
    the schedule: the warm-up still ramps over the training steps around them."""
    args = dict(TINY_ARGS, time_budget_min=1.0, warmup_fraction=0.3, torch_compile=True)
    module = ViTClassifier(preset="vit_nano", **args)
    monkeypatch.setattr(module.model, "compile", lambda **kwargs: None)  # the compile's time: faked
    monkeypatch.setattr("vit.lit_module.check_cpp_compiler", lambda: None)
    clock = module._clock = FakeClock(tick=0.5)
    lrs, compiled = [], set()

    def compile_once(m, args) -> None:
        if m.training not in compiled:  # the first training forward, the first eval forward
            compiled.add(m.training)
            clock.now += 20.0 if m.training else 10.0

    module.model.register_forward_pre_hook(compile_once)

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    trainer = quiet_trainer(tmp_path, max_epochs=1000, num_sanity_val_steps=0, callbacks=[Record()])
    trainer.fit(module, random_loader(64), random_loader(16))  # 4 steps, then validation
    # the warm-up (30% of the ~30 s left, ~1 s a step) spans the first validation, rising
    assert lrs[1] < 0.2e-3 and all(a < b for a, b in zip(lrs[1:8], lrs[2:9], strict=True))
    assert 30.0 <= module._off_clock_s < 33.0
    assert max(lrs) == pytest.approx(1e-3, rel=0.05) and module.progress() == 1.0
    assert 60.0 <= module.elapsed_s() < 64.0  # the stop: the whole budget, compiles included
    assert trainer.optimizers[0].param_groups[0]["lr"] < 1e-5  # and the lr ~zero there (1% of peak)
    saved: dict = {}
    module.on_save_checkpoint(saved)
    resumed = ViTClassifier(preset="vit_nano", **args)
    resumed.on_load_checkpoint(saved)
    assert resumed._off_clock_s == module._off_clock_s  # a resume keeps them off the clock


def test_time_budget_refuses_validation_every_other_epoch(tmp_path) -> None:
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS, time_budget_min=1.0, warmup_fraction=0)
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=5,
        check_val_every_n_epoch=2,
    )
    with pytest.raises(ValueError, match="check_val_every_n_epoch=2 with model.time_budget_min"):
        trainer.fit(module, random_loader(32), random_loader(16))


def test_time_budget_needs_a_warmup_fraction_and_positive_minutes() -> None:
    with pytest.raises(ValueError, match="set model.warmup_fraction"):
        ViTClassifier(preset="vit_nano", **TINY_ARGS, time_budget_min=60.0, warmup_epochs=2.0)
    with pytest.raises(ValueError, match="time_budget_min=0"):
        ViTClassifier(preset="vit_nano", **TINY_ARGS, time_budget_min=0, warmup_fraction=0.05)


def flat(module: ViTClassifier) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_fused_adamw_makes_the_same_updates_as_the_default(tmp_path) -> None:
    """fused_adamw is a speed setting only: three steps land on the same weights (fp32)."""
    weights = []
    for fused in (None, True):
        torch.manual_seed(0)
        module = ViTClassifier(preset="vit_nano", **TINY_ARGS, fused_adamw=fused, warmup_epochs=0)
        start = flat(module).clone()
        quiet_trainer(tmp_path, max_steps=3, max_epochs=1).fit(module, random_loader(48))
        weights.append(flat(module))
        assert (weights[-1] - start).abs().max() > 1e-4  # the three steps moved the weights
    # each step moves a weight by up to lr = 1e-3; the two kernels round differently, and Adam
    # magnifies that where a gradient is near zero: agreement to 1% of one step
    torch.testing.assert_close(weights[1], weights[0], atol=1e-5, rtol=0)


def test_gradient_clipping_works_with_fused_adamw_in_bf16(tmp_path) -> None:
    """Lightning refuses to clip for a fused optimizer (a float16 loss-scaler guard); bf16-mixed
    has no scaler, so ViTClassifier clips itself: the fused run lands where Lightning's own
    clipping with the default AdamW lands, and not where the unclipped run does."""
    weights = {}
    for fused, clip in ((True, 0.01), (None, 0.01), (True, None)):
        torch.manual_seed(0)
        module = ViTClassifier(preset="vit_nano", **TINY_ARGS, fused_adamw=fused, warmup_epochs=0)
        trainer = quiet_trainer(
            tmp_path, max_steps=3, max_epochs=1, precision="bf16-mixed", gradient_clip_val=clip
        )
        trainer.fit(module, random_loader(48))
        weights[fused, clip] = flat(module)
    torch.testing.assert_close(weights[True, 0.01], weights[None, 0.01], atol=1e-5, rtol=0)
    assert (weights[True, 0.01] - weights[True, None]).abs().max() > 1e-4


def test_torch_compile_trains_like_eager_and_saves_eager_names(tmp_path) -> None:
    """torch_compile is a speed setting only: three compiled steps land on the eager steps'
    weights (fp32), and the checkpoint holds the eager model's names, so loading it for
    evaluation neither compiles nor needs a prefix stripped."""
    weights, modules = [], []
    for compiled in (False, True):
        torch.manual_seed(0)
        module = ViTClassifier(
            preset="vit_nano", **TINY_ARGS, torch_compile=compiled, warmup_epochs=0
        )
        start = flat(module).clone()
        trainer = quiet_trainer(tmp_path, max_steps=3, max_epochs=1)
        trainer.fit(module, random_loader(48))
        assert (module.model._compiled_call_impl is not None) is compiled
        weights.append(flat(module))
        modules.append(module)
        assert (weights[-1] - start).abs().max() > 1e-4  # the three steps moved the weights
    # inductor fuses and reorders float sums: agreement to 1% of one step, as for fused AdamW
    torch.testing.assert_close(weights[1], weights[0], atol=1e-5, rtol=0)
    path = tmp_path / "compiled.ckpt"
    trainer.save_checkpoint(path)
    names = torch.load(path, weights_only=True)["state_dict"].keys()
    assert set(names) == set(modules[0].state_dict())  # no "_orig_mod." anywhere
    reloaded = ViTClassifier.load_from_checkpoint(path).eval()
    assert reloaded.model._compiled_call_impl is None
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x), modules[1].eval()(x), atol=1e-4, rtol=1e-4)


def test_compile_mode_reaches_torch_compile(monkeypatch) -> None:
    import vit.lit_module

    monkeypatch.setattr(vit.lit_module, "check_cpp_compiler", lambda: None)
    seen = []
    for mode in ("default", "reduce-overhead"):
        module = ViTClassifier(
            preset="vit_nano", **TINY_ARGS, torch_compile=True, compile_mode=mode
        )
        monkeypatch.setattr(module.model, "compile", lambda **kw: seen.append(kw))
        module.on_fit_start()
    assert seen == [
        dict(dynamic=False, mode="default"),
        dict(dynamic=False, mode="reduce-overhead"),
    ]


def test_torch_compile_without_a_cpp_compiler_fails_at_fit_start(monkeypatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-x9")
    module = ViTClassifier(preset="vit_nano", **TINY_ARGS, torch_compile=True)
    with pytest.raises(RuntimeError, match="needs a C[+][+] compiler.*no-such-compiler-x9.*false"):
        module.on_fit_start()
    assert module.model._compiled_call_impl is None  # nothing was compiled
