"""ViTClassifier: the network it builds, the loss and metrics it logs, its config errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from tests.helpers import head_products, quiet_trainer, random_loader, tiny_classifier
from vit.model.embed import sincos_2d_table
from vit.train.module import ViTClassifier
from vit.train.optim import param_groups


def test_weight_decay_spares_biases_norms_cls_and_positions() -> None:
    module = tiny_classifier()
    decay, no_decay = param_groups(module.model, weight_decay=0.05)
    names = {id(p): n for n, p in module.model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    spared = {names[id(p)] for p in no_decay["params"]}
    assert {"cls_token", "pos_embed", "blocks.0.norm1.weight", "head.bias"} <= spared
    assert {"blocks.0.attn.qkv.weight", "patch_embed.proj.weight", "head.weight"} <= decayed
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert len(decayed) + len(spared) == len(list(module.model.parameters()))


def test_attn_init_reaches_the_model() -> None:
    module = tiny_classifier(network={"attn_init": "mimetic"})
    qk = head_products(module.model.blocks[0].attn)[0][0]
    assert qk.diagonal().mean() > 0.2  # W_q^T W_k near +identity
    assert (
        module.hparams.network["attn_init"] == "mimetic"
    )  # saved: checkpoints rebuild the same model


def test_pos_init_reaches_the_model() -> None:
    module = tiny_classifier(network={"pos_init": "sincos2d"})
    grid = module.model.patch_embed.grid_size
    assert torch.allclose(
        module.model.pos_embed[0, 1:], sincos_2d_table(grid, module.model.embed_dim)
    )
    assert module.hparams.network["pos_init"] == "sincos2d"


def test_lsa_reaches_the_model_and_its_temperatures_are_not_decayed() -> None:
    module = tiny_classifier(network={"lsa": True})
    assert all(block.attn.lsa for block in module.model.blocks)
    temps = {id(block.attn.temperature) for block in module.model.blocks}
    groups = param_groups(module.model, weight_decay=0.05)
    assert temps <= {id(p) for p in groups[1]["params"]} and groups[1]["weight_decay"] == 0.0


def test_spt_reaches_the_model_and_only_its_projection_is_decayed() -> None:
    module = tiny_classifier(network={"spt": True})
    embed = module.model.patch_embed
    assert embed.spt and isinstance(embed.proj, torch.nn.Linear)
    decayed, not_decayed = (
        {id(p) for p in g["params"]} for g in param_groups(module.model, weight_decay=0.05)
    )
    assert id(embed.proj.weight) in decayed
    assert {id(embed.norm.weight), id(embed.norm.bias), id(embed.proj.bias)} <= not_decayed


def test_sizes_come_from_the_preset_unless_overridden() -> None:
    module = ViTClassifier(network={"preset": "vit_tiny", "depth": 2})
    assert module.model.embed_dim == 192 and len(module.model.blocks) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(optimizer={"lr": -1e-3}), "lr=-0.001 must be positive"),
        (dict(label_smoothing=1.5), "label_smoothing=1.5"),
        (dict(network={"preset": "vit_giant"}), "unknown preset 'vit_giant'"),
        (dict(network={"patch_size": 64}), "larger than img_size"),
        (dict(network={"drop_rate": 1.2}), "drop_rate=1.2"),
        (dict(network={"depth4": 4}), "unexpected keyword argument 'depth4'"),
        (dict(mixup_alpha=-0.2), "mixup_alpha=-0.2"),
        (dict(cutmix_alpha=1.0, mix_prob=2.0), "mix_prob=2.0 in \\[0, 1\\]"),
        (dict(schedule={"decay": "step"}), "decay='step' is not a schedule shape"),
        (dict(schedule={"min_lr": 0.1}), "min_lr=0.1 must be between 0 and lr=0.001"),
        (dict(compile_mode="fast"), "compile_mode='fast': expected one of .*reduce-overhead"),
    ],
)
def test_bad_values_fail_clearly(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        ViTClassifier(**kwargs)


def test_fit_logs_stage_metrics_and_steps_the_schedule(tmp_path) -> None:
    module = tiny_classifier(optimizer={"lr": 1e-3}, schedule={"warmup_epochs": 1.0})
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
    module = tiny_classifier()
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=-1,
        max_steps=2,
    )
    with pytest.raises(ValueError, match="max_epochs"):
        trainer.fit(module, random_loader())


def test_test_flip_scores_the_mean_of_image_and_mirror(tmp_path) -> None:
    torch.manual_seed(0)
    plain = tiny_classifier()
    flipped = tiny_classifier(test_flip=True)
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
    module = tiny_classifier()
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
    new = tiny_classifier()
    logits, labels = torch.randn(40, 10), torch.randint(0, 10, (40,))
    old.update(logits, labels)
    new.metrics["val_acc1"].update(logits, labels)
    expected = {k: v.clone() for k, v in new.state_dict().items() if k.startswith("metrics.")}
    state = new.state_dict()
    for name in ("tp", "fp", "tn", "fn"):
        state[f"metrics.val_acc1.{name}"] = getattr(old, name).clone()
    checkpoint = {"state_dict": state, "current_model_state": dict(state)}
    new.on_load_checkpoint(checkpoint)  # no trainer: not a resume
    for key in ("state_dict", "current_model_state"):
        new.load_state_dict(checkpoint[key])  # strict: a shape left at (10,) would raise
        for name, value in expected.items():
            assert torch.equal(new.state_dict()[name], value), name


def test_mixup_and_cutmix_train_on_soft_targets(tmp_path, monkeypatch) -> None:
    import vit.train.module as lm

    calls: list[tuple[float, float]] = []
    real = lm.mix_batch

    def spy(images, labels, **kw):
        out, targets = real(images, labels, **kw)
        calls.append((targets.max().item(), targets.sum(1).mean().item()))
        return out, targets

    monkeypatch.setattr(lm, "mix_batch", spy)
    module = tiny_classifier(mixup_alpha=0.8, cutmix_alpha=1.0)
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


def flat(module: ViTClassifier) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


# Two runs whose kernels only round differently (fused, compiled, another CPU's vector width) are
# compared in norm, relative to the distance the weights travelled: AdamW divides each gradient by
# its own size, so a rounding difference in a near-zero gradient can move that one weight by up to
# a whole step (lr), and no per-element bound is both safe on every CPU and tight. Summed over all
# weights such differences stay near float32 rounding (~sqrt(batch x tokens) x eps of each step);
# 1e-3 of the distance leaves an order of magnitude to spare, while a real change (decay, clipping,
# an op missed) moves the weights by a share of order one (the contrasts below check > 100x).
RELATIVE_TO_TRAVEL = 1e-3


def apart(a: torch.Tensor, b: torch.Tensor, start: torch.Tensor) -> float:
    """||a - b|| as a share of the distance b travelled from start."""
    return float((a - b).norm() / (b - start).norm())


def test_fused_adamw_makes_the_same_updates_as_the_default(tmp_path) -> None:
    """AdamW's fused kernel is a speed setting only: three steps land on the same weights (fp32),
    weight decay included. The decay is made large (5.0: 0.5% of each matrix per step at lr
    1e-3), so a kernel that dropped it would land over 100x the tolerance away."""
    weights = {}
    for fused, decay in ((None, 5.0), (True, 5.0), (True, 0.0)):
        torch.manual_seed(0)
        module = tiny_classifier(
            optimizer={"fused": fused, "weight_decay": decay}, schedule={"warmup_epochs": 0}
        )
        start = flat(module).clone()
        quiet_trainer(tmp_path, max_steps=3, max_epochs=1).fit(module, random_loader(48))
        weights[fused, decay] = flat(module)
        assert (weights[fused, decay] - start).abs().max() > 1e-4  # the three steps moved them
    assert apart(weights[True, 5.0], weights[None, 5.0], start) < RELATIVE_TO_TRAVEL
    assert apart(weights[True, 0.0], weights[True, 5.0], start) > 100 * RELATIVE_TO_TRAVEL  # decay


def test_gradient_clipping_works_with_fused_adamw_in_bf16(tmp_path) -> None:
    """Lightning refuses to clip for a fused optimizer (a float16 loss-scaler guard); bf16-mixed
    has no scaler, so ViTClassifier clips itself: the fused run lands where Lightning's own
    clipping with the default AdamW lands, and not where the unclipped run does."""
    weights = {}
    for fused, clip in ((True, 0.01), (None, 0.01), (True, None)):
        torch.manual_seed(0)
        module = tiny_classifier(optimizer={"fused": fused}, schedule={"warmup_epochs": 0})
        trainer = quiet_trainer(
            tmp_path, max_steps=3, max_epochs=1, precision="bf16-mixed", gradient_clip_val=clip
        )
        start = flat(module).clone()
        trainer.fit(module, random_loader(48))
        weights[fused, clip] = flat(module)
    assert apart(weights[True, 0.01], weights[None, 0.01], start) < RELATIVE_TO_TRAVEL
    assert apart(weights[True, None], weights[True, 0.01], start) > 100 * RELATIVE_TO_TRAVEL


@pytest.mark.compiles
def test_torch_compile_trains_like_eager_and_saves_eager_names(tmp_path) -> None:
    """torch_compile is a speed setting only: three compiled steps land on the eager steps'
    weights (fp32), and the checkpoint holds the eager model's names, so loading it for
    evaluation neither compiles nor needs a prefix stripped."""
    weights, modules = [], []
    for compiled in (False, True):
        torch.manual_seed(0)
        module = tiny_classifier(torch_compile=compiled, schedule={"warmup_epochs": 0})
        start = flat(module).clone()
        trainer = quiet_trainer(tmp_path, max_steps=3, max_epochs=1)
        trainer.fit(module, random_loader(48))
        assert (module.model._compiled_call_impl is not None) is compiled
        weights.append(flat(module))
        modules.append(module)
        assert (weights[-1] - start).abs().max() > 1e-4  # the three steps moved the weights
    # inductor fuses and reorders float sums: they round differently, as fused AdamW's do
    assert apart(weights[1], weights[0], start) < RELATIVE_TO_TRAVEL
    path = tmp_path / "compiled.ckpt"
    trainer.save_checkpoint(path)
    names = torch.load(path, weights_only=True)["state_dict"].keys()
    assert set(names) == set(modules[0].state_dict())  # no "_orig_mod." anywhere
    reloaded = ViTClassifier.load_from_checkpoint(path).eval()
    assert reloaded.model._compiled_call_impl is None
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        eager, compiled = reloaded(x), modules[1].eval()(x)
    # one forward, reordered sums: float32 eps x the longest sum (the MLP's hidden width) per
    # block, at the logits' scale
    net = reloaded.model
    longest = net.blocks[0].mlp.fc1.out_features
    bound = torch.finfo(torch.float32).eps * longest * len(net.blocks) * max(1.0, eager.abs().max())
    torch.testing.assert_close(compiled, eager, atol=bound, rtol=0)


def test_compile_mode_reaches_torch_compile(monkeypatch) -> None:
    import vit.train.module

    monkeypatch.setattr(vit.train.module, "check_cpp_compiler", lambda: None)
    seen = []
    for mode in ("default", "reduce-overhead"):
        module = tiny_classifier(torch_compile=True, compile_mode=mode)
        monkeypatch.setattr(module.model, "compile", lambda **kw: seen.append(kw))
        module.on_fit_start()
    assert seen == [
        dict(dynamic=False, mode="default"),
        dict(dynamic=False, mode="reduce-overhead"),
    ]


def test_torch_compile_without_a_cpp_compiler_fails_at_fit_start(monkeypatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-x9")
    module = tiny_classifier(torch_compile=True)
    with pytest.raises(RuntimeError, match="needs a C[+][+] compiler.*no-such-compiler-x9.*false"):
        module.on_fit_start()
    assert module.model._compiled_call_impl is None  # nothing was compiled


def test_gradients_are_dropped_when_each_step_ends_unless_accumulating(tmp_path) -> None:
    """Under CUDA graphs the gradients are graph outputs: they go when the step ends, not after
    the next forward. With gradient accumulation they must stay until the optimizer steps."""
    import lightning as L

    class Seen(L.Callback):  # callbacks' batch-start hooks run before the module's
        def __init__(self) -> None:
            self.held: list[bool] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.held.append(any(p.grad is not None for p in pl_module.parameters()))

    # accumulating, Lightning zeroes them itself, before the backward after an optimizer step
    for accumulate, expected in ((1, [False] * 4), (2, [False, True, True, True])):
        seen = Seen()
        trainer = quiet_trainer(
            tmp_path / str(accumulate),
            max_epochs=1,
            limit_train_batches=4,
            accumulate_grad_batches=accumulate,
            callbacks=[seen],
        )
        trainer.fit(tiny_classifier(), random_loader(n=64))  # 4 batches of 16
        assert seen.held == expected, accumulate
