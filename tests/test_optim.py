"""Muon with AdamW in one optimizer (vit/train/muon.py) and the optimizer factory (vit/train/optim.py)."""

from __future__ import annotations

import re
from collections import Counter
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch import nn

from tests.helpers import (
    mixed_groups,
    mixed_model,
    ns_tol,
    quiet_trainer,
    random_loader,
    schedule_lr,
    sum_tol,
    tiny_classifier,
)
from vit.train import muon as muon_module
from vit.train.module import ViTClassifier
from vit.train.muon import MuonAdamW, iteration_dtype, orthogonalize, orthogonalize_stacks
from vit.train.optim import (
    MuonConfig,
    OptimizerConfig,
    build_optimizer,
    check_resume_layout,
    muon_param_groups,
)

F32 = torch.float32
A = muon_module.NS_COEFFICIENTS[0]
GROWTH = (A**5 - 1) / (A - 1)  # 1 + a + ... + a^4: an early step's error grown by the later ones


@pytest.mark.parametrize("shape", [(8, 24), (24, 8), (16, 16)])
def test_orthogonalize_sets_every_singular_value_near_one(shape: tuple[int, int]) -> None:
    """A gradient whose singular values spread over 100x comes out with all of them in the
    quintic iteration's band around one, and close to U V^T itself."""
    gen = torch.Generator().manual_seed(0)
    k = min(shape)
    u = torch.linalg.qr(torch.randn(shape[0], k, generator=gen))[0]
    v = torch.linalg.qr(torch.randn(shape[1], k, generator=gen))[0]
    g = u @ torch.diag(torch.logspace(0, -2, k)) @ v.T
    s = torch.linalg.svdvals(orthogonalize(g))
    assert s.min() > 0.6 and s.max() < 1.2, s  # the band, not exactly one
    cos = torch.nn.functional.cosine_similarity(orthogonalize(g).flatten(), (u @ v.T).flatten(), 0)
    assert cos > 0.95
    with pytest.raises(ValueError, match="expects a matrix or a stack"):
        orthogonalize(torch.randn(5))


@pytest.mark.parametrize("shape", [(4, 24, 8), (4, 8, 24), (2, 3, 16, 16)])
def test_a_stack_is_orthogonalized_matrix_by_matrix(shape: tuple[int, ...]) -> None:
    """MuonAdamW orthogonalizes same-shaped updates as one stack: each comes out as it would
    alone (its own norm, its own iterations), whatever the others hold."""
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    g[0] *= 1000.0  # one large matrix must not shrink the others
    flat = g.reshape(-1, *shape[-2:])
    alone = torch.stack([orthogonalize(m) for m in flat]).reshape(shape)
    # a stack's products may take other kernels than one matrix's
    tol = ns_tol(F32, min(shape[-2:]), max(shape[-2:]), alone.abs().max())
    torch.testing.assert_close(orthogonalize(g), alone, rtol=0, atol=tol)


@pytest.mark.parametrize("shape", [(576, 192), (192, 384), (12, 8), (8, 12)])
def test_gram_form_gives_the_loops_iterations(shape: tuple[int, int], monkeypatch) -> None:
    """For the blocks' wide and tall matrices float32 iterates on the small Gram matrix, from
    a long side GRAM_FORM_RATIO (1.5) times the short on; the result is the textbook loop's
    (run here in float64) to float32 rounding, not another polynomial. bfloat16 keeps the
    loop."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(shape[0], 8, generator=gen) @ torch.randn(8, shape[1], generator=gen)
    g += 0.01 * torch.randn(shape, generator=gen)  # low rank plus noise, as a gradient
    a, b, c = muon_module.NS_COEFFICIENTS
    x = g.double().T if shape[0] > shape[1] else g.double()
    x = x / x.norm()
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    loop = x.T if shape[0] > shape[1] else x
    calls = []
    gram_form = muon_module._iterate_on_the_gram
    monkeypatch.setattr(
        muon_module, "_iterate_on_the_gram", lambda *a: calls.append(1) or gram_form(*a)
    )
    out = orthogonalize(g)
    assert calls == [1]
    # float32 against float64: each step's sums of n and 4 m terms, grown by the later steps
    assert (out.double() - loop).abs().max() <= ns_tol(F32, *sorted(shape), loop.abs().max())
    orthogonalize(g, dtype=torch.bfloat16)
    assert calls == [1]


@pytest.mark.parametrize("shape", [(16, 16), (8, 11), (11, 8)])
def test_below_the_gram_ratio_float32_keeps_the_loop(shape: tuple[int, int], monkeypatch) -> None:
    """A square matrix, or one whose long side is under GRAM_FORM_RATIO (1.5) times the short
    (11 / 8 = 1.375), gains nothing from the Gram form: float32 runs the textbook loop there."""
    calls = []
    gram_form = muon_module._iterate_on_the_gram
    monkeypatch.setattr(
        muon_module, "_iterate_on_the_gram", lambda *a: calls.append(1) or gram_form(*a)
    )
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    out = orthogonalize(g)
    assert calls == []
    loop = _newton_schulz(g)
    # float32 against float64: each step's sums of n and 2 m terms, grown by the later steps
    assert (out.double() - loop).abs().max() <= ns_tol(F32, *sorted(shape), loop.abs().max())


def test_the_iterations_run_in_the_dtype_asked_for() -> None:
    """dtype=bfloat16 iterates in bfloat16 whatever the gradient's dtype, and hands the result
    back in the gradient's; MuonAdamW's ns_dtype reaches the iterations."""
    g = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    in_bf16 = orthogonalize(g.bfloat16(), dtype=torch.bfloat16).float()
    out = orthogonalize(g, dtype=torch.bfloat16)
    assert out.dtype == torch.float32 and torch.equal(out, in_bf16)
    assert (in_bf16 - orthogonalize(g)).abs().max() > 1e-3  # bfloat16's rounding shows
    # a bfloat16 gradient iterated in float32 comes back in bfloat16, its parameter's dtype
    assert orthogonalize(g.bfloat16()).dtype == torch.bfloat16
    w = nn.Parameter(torch.zeros(8, 16))
    opt = MuonAdamW(
        [{"params": [w], "use_muon": True}],
        lr=0.1,
        weight_decay=0.0,
        momentum=0.0,  # the look-ahead is the gradient itself
        ns_dtype=torch.bfloat16,
    )
    w.grad = g.clone()
    opt.step()
    # from zero, with no decay: one product of the same float32 numbers, rounded once
    assert torch.equal(w.detach(), -0.1 * 0.2 * 16**0.5 * in_bf16)


def test_in_bfloat16_each_step_rounds_once_and_lands_nearer_float64() -> None:
    """Each Newton-Schulz step's a x + p(G) x is one fused product (one rounding to bfloat16),
    not a product, a multiply and an add (three): on the blocks' shapes it lands nearer the
    float64 iteration than the three-rounding form does."""
    a, b, c = 3.4445, -4.7750, 2.0315
    gen = torch.Generator().manual_seed(0)
    for shape in [(4, 192, 192), (4, 192, 384)]:
        g = torch.randn(shape, generator=gen)
        exact = torch.stack([_newton_schulz(m) for m in g])
        x = (g / g.norm(dim=(1, 2), keepdim=True)).bfloat16()
        for _ in range(5):  # the three-rounding form
            s = x @ x.mT
            x = a * x + torch.baddbmm(s, s, s, beta=b, alpha=c) @ x
        fused = orthogonalize(g, dtype=torch.bfloat16, gram=False).double()
        assert (fused - exact).abs().max() < 0.85 * (x.double() - exact).abs().max()


def test_a_tiny_gradient_still_moves_the_weights_its_way() -> None:
    """A gradient far below the normalization's 1e-7 guard (late in training, or a layer that
    barely learns) is orthogonalized as its larger copies are, its sign kept."""
    q = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))[0]
    tiny = orthogonalize(q * 2.5e-8)  # Frobenius norm 5e-8
    assert torch.nn.functional.cosine_similarity(tiny.flatten(), q.flatten(), 0) > 0.95
    assert torch.equal(orthogonalize(torch.zeros(4, 4)), torch.zeros(4, 4))


@pytest.mark.parametrize("bias_group", [{}, {"lr": 3e-3}, {"betas": (0.8, 0.9)}, {"eps": 1e-3}])
def test_adamw_groups_update_as_torch_adamw(bias_group: dict) -> None:
    """AdamW's groups step as one where their settings agree, and each with its own where not."""
    torch.manual_seed(0)
    ours, ref = nn.Linear(6, 5), nn.Linear(6, 5)
    ref.load_state_dict(ours.state_dict())

    def groups(m: nn.Linear) -> list[dict]:
        return [
            {"params": [m.weight], "weight_decay": 0.05},
            {"params": [m.bias], "weight_decay": 0.0, **bias_group},
        ]

    opt = MuonAdamW(groups(ours), lr=1e-2, betas=(0.9, 0.99))
    ref_opt = torch.optim.AdamW(groups(ref), lr=1e-2, betas=(0.9, 0.99), foreach=False)
    for _ in range(5):
        x = torch.randn(4, 6)
        for m, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    # the same elementwise formula: per step the decay and the step round the weight (2 eps of
    # it) and the step's six operations round it (6 eps of lr); the gradients are not near zero
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=sum_tol(F32, 2 * 5), atol=sum_tol(F32, 6 * 5, 1e-2))


def test_muon_moves_each_matrix_as_it_would_alone_whatever_the_mix_of_shapes() -> None:
    """A group's matrices go through as stacks (one per shape, and one orthogonalization for the
    stacks whose blocks share a shape: here a conv filter 8 x 2 x 2 x 2 with the 8 x 8
    matrices); each must still move as it would in a group of its own, split ones included."""
    torch.manual_seed(0)
    shapes = [(8, 8), (8, 16), (8, 8), (8, 2, 2, 2), (16, 8), (8, 16)]
    mixed = [nn.Parameter(torch.randn(s)) for s in shapes]
    split = [nn.Parameter(torch.randn(24, 8)), nn.Parameter(torch.randn(12, 4))]
    alone = [nn.Parameter(p.detach().clone()) for p in mixed + split]
    settings = dict(lr=0.1, weight_decay=0.1, momentum=0.9, ns_dtype=torch.float32)
    opt = MuonAdamW(
        [{"params": mixed, "use_muon": True}, {"params": split, "use_muon": True, "split": 2}],
        **settings,
    )
    singles = [
        MuonAdamW(
            [{"params": [p], "use_muon": True, "split": 2 if i >= len(mixed) else 1}], **settings
        )
        for i, p in enumerate(alone)
    ]
    for _ in range(2):
        for p, q in zip(mixed + split, alone, strict=True):
            p.grad = torch.randn(p.shape)
            q.grad = p.grad.clone()
        opt.step()
        for single in singles:
            single.step()
    # per step: the decay rounds the weight, and the update (lr x scale <= 0.1 x 0.8) comes
    # from a stack's products, other kernels than one matrix's
    update_tol = 2 * 0.1 * 0.8 * ns_tol(F32, 8, 16)
    for p, q in zip(mixed + split, alone, strict=True):
        tol = update_tol + sum_tol(F32, 2 * 2, q.abs().max())
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=tol)


def _dispatched_ops(step) -> Counter:  # noqa: ANN001
    """The aten ops `step()` dispatches, by name (on a GPU each is about one kernel launch)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return ops


def test_a_step_dispatches_as_many_ops_for_many_matrices_as_for_few() -> None:
    """On a GPU the optimizer's step waits on its launches: a matrix or vector more must add no
    dispatch, only a shape more may (each shape: its stack and its orthogonalization)."""

    def ops(copies: int) -> int:
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(s)) for s in [(8, 16), (16, 16), (5,)] * copies]
        opt = MuonAdamW(
            [
                {"params": [p for p in params if p.dim() == 2], "use_muon": True},
                {"params": [p for p in params if p.dim() == 1]},
                {"params": [nn.Parameter(torch.randn(3))], "weight_decay": 0.0},
            ],
            ns_dtype=torch.float32,
        )
        for p in params + opt.param_groups[2]["params"]:
            p.grad = torch.randn(p.shape)
        opt.step()  # the first step creates the state
        return _dispatched_ops(opt.step)

    assert ops(1) == ops(4)


def test_padded_stacks_are_each_stacks_own_orthogonalization() -> None:
    """orthogonalize_stacks(padded=True) puts stacks of any shapes (wide, tall, square, other
    short sides) through one orthogonalization, zero-padded: each matrix comes out as it would
    alone, in its shape and dtype; stacks of mixed dtypes go through one by one."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 8, 16), (2, 16, 8), (4, 6, 6), (1, 5, 12)]
    stacks = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    alone = orthogonalize_stacks(stacks, dtype=torch.float64)
    together = orthogonalize_stacks(stacks, dtype=torch.float64, padded=True)
    for a, t, s in zip(alone, together, stacks, strict=True):
        assert t.shape == s.shape and t.dtype == s.dtype
        # zero padding adds exact zeros, but the padded products may sum in another order
        torch.testing.assert_close(t, a, rtol=0, atol=ns_tol(torch.float64, 8, 16, a.abs().max()))
        assert torch.equal(a, orthogonalize(s, dtype=torch.float64))  # the same call
    mixed = [stacks[0], stacks[1].float()]
    for a, m in zip(orthogonalize_stacks(mixed, padded=True), mixed, strict=True):
        assert a.dtype == m.dtype
        assert torch.equal(a, orthogonalize(m))  # mixed dtypes: the same calls, one by one


def test_stacks_take_the_steps_asked_for_and_two_already_share_one_iteration() -> None:
    """orthogonalize_stacks runs `steps` iterations either way, and pads from two stacks on:
    two shapes make one iteration's products (two baddbmm a step in bfloat16's loop form)."""
    gen = torch.Generator().manual_seed(1)
    stacks = [torch.randn(s, generator=gen, dtype=torch.float64) for s in [(2, 4, 8), (1, 8, 8)]]
    for padded in (False, True):
        out = orthogonalize_stacks(stacks, steps=2, dtype=torch.float64, padded=padded)
        for o, s in zip(out, stacks, strict=True):
            tol = ns_tol(torch.float64, 8, 8, steps=2)  # padded: sums in another order
            torch.testing.assert_close(
                o, orthogonalize(s, steps=2, dtype=torch.float64), rtol=0, atol=tol
            )
    counts = _dispatched_ops(
        lambda: orthogonalize_stacks(stacks, steps=3, dtype=torch.bfloat16, padded=True)
    )
    assert counts["baddbmm"] == 2 * 3


def test_one_stack_runs_one_orthogonalization_for_every_shape_and_moves_alike() -> None:
    """MuonAdamW(one_stack=True) (a GPU's default) orthogonalizes matrices of three shapes in
    one stack: one iteration's products (two baddbmm a step) instead of three; the weights move
    as with one stack per shape (a CPU's default)."""

    def run(one_stack: bool | None) -> tuple[MuonAdamW, Counter, list[torch.Tensor]]:
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(s)) for s in [(8, 16), (16, 8), (12, 12), (8, 16)]]
        # bfloat16: the loop form for every shape (float32 takes the Gram form for some)
        opt = MuonAdamW([{"params": params, "use_muon": True}], ns_dtype=torch.bfloat16,
                        one_stack=one_stack)  # fmt: skip
        for p in params:
            p.grad = torch.randn(p.shape)
        return opt, _dispatched_ops(opt.step), [p.detach() for p in params]

    default, per_shape, moved = run(None)
    assert default.one_stack is False  # parameters on a CPU
    _, one, moved_together = run(True)
    assert per_shape["baddbmm"] == 3 * 2 * 5 and one["baddbmm"] == 2 * 5
    # padding adds exact zeros to float32 sums; where one rounds to bfloat16 the other way the
    # update moves by a bfloat16 rounding (2^-8) of one step's update, lr x 0.2 sqrt(16)
    tol = 1e-3 * 0.2 * 16**0.5 * 2**-8
    for a, b in zip(moved, moved_together, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_muon_takes_every_shape_in_one_stack_by_default() -> None:
    w = nn.Parameter(torch.randn(8, 16, device="cuda"))
    assert MuonAdamW([{"params": [w], "use_muon": True}]).one_stack is True


def _newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Muon's quintic iteration written out in float64 (the reference code's coefficients and
    Frobenius normalization, on the wide side): the reference for MuonAdamW's update."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def test_muon_steps_by_the_orthogonalized_momentum_and_decays() -> None:
    """Three steps on known gradients against Muon's rule written out here, nothing read from
    the optimizer's state: momentum m = mu m + (1 - mu) g, the Nesterov look-ahead
    (1 - mu) g + mu m, Newton-Schulz, scale 0.2 sqrt(max(rows, cols)), decoupled decay. The
    same steps without the look-ahead land over 10x the tolerance away, so the check can tell."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(8, 16))
    lr, decay, mu, scale = 0.1, 0.5, 0.9, 0.2 * 16**0.5
    # per step: float32 Newton-Schulz against float64, lr x scale of it, and the decay rounds w
    tol = 3 * (lr * scale * ns_tol(F32, 8, 16) + sum_tol(F32, 2, w.detach().abs().max()))
    opt = MuonAdamW(
        [{"params": [w], "use_muon": True}],
        lr=lr,
        weight_decay=decay,
        momentum=mu,
        ns_dtype=torch.float32,
    )
    expected, plain = w.detach().double().clone(), w.detach().double().clone()
    momentum = torch.zeros(8, 16, dtype=torch.float64)
    for _ in range(3):
        g = torch.randn(8, 16)
        w.grad = g.clone()
        opt.step()
        momentum = mu * momentum + (1 - mu) * g.double()
        look_ahead = (1 - mu) * g.double() + mu * momentum
        expected = expected * (1 - lr * decay) - lr * scale * _newton_schulz(look_ahead)
        plain = plain * (1 - lr * decay) - lr * scale * _newton_schulz(momentum)
        torch.testing.assert_close(w.detach().double(), expected, atol=tol, rtol=0)
    assert (plain - expected).abs().max() > 10 * tol
    with pytest.raises(ValueError, match="matrices only"):
        MuonAdamW([{"params": [nn.Parameter(torch.zeros(3))], "use_muon": True}])
    with pytest.raises(ValueError, match="momentum=1.0"):
        MuonAdamW([{"params": [w]}], momentum=1.0)


def test_a_split_group_orthogonalizes_each_block_of_rows_on_its_own() -> None:
    torch.manual_seed(0)
    w, whole = nn.Parameter(torch.randn(12, 4)), nn.Parameter(torch.randn(12, 4))
    start = w.detach().clone()
    opt = MuonAdamW(
        [{"params": [w], "use_muon": True, "split": 3}, {"params": [whole], "use_muon": True}],
        lr=0.1,
        weight_decay=0.0,
        momentum=0.0,  # the look-ahead is the gradient itself
        ns_dtype=torch.float32,
    )
    w.grad, whole.grad = torch.randn(12, 4), torch.randn(12, 4)
    opt.step()
    # each 4 x 4 block by its own orthogonal matrix, scaled for a 4 x 4 matrix (not 12 x 4)
    blocks = [orthogonalize(g) for g in w.grad.split(4)]
    # a stack of blocks against one by one (other kernels), then w minus lr x scale of it
    tol = 0.1 * 0.2 * 4**0.5 * ns_tol(F32, 4, 4) + sum_tol(F32, 2, start.abs().max())
    expected = start - 0.1 * 0.2 * 4**0.5 * torch.cat(blocks)
    torch.testing.assert_close(w.detach(), expected, rtol=0, atol=tol)
    joint = orthogonalize(w.grad)  # what split 1 would do: a different update
    assert (torch.cat(blocks) - joint).abs().max() > 0.1
    for bad in (0, 2.0, "3"):
        with pytest.raises(ValueError, match=f"split={bad!r} must be a whole number"):
            MuonAdamW([{"params": [w], "use_muon": True, "split": bad}])
    with pytest.raises(ValueError, match=r"split=5 cuts .* \[\(12, 4\)\]"):
        MuonAdamW([{"params": [w], "use_muon": True, "split": 5}])


def test_muon_split_qkv_puts_qkv_in_a_split_group_and_trains(tmp_path) -> None:
    module = tiny_classifier(optimizer={"name": "muon", "muon": {"split_qkv": True}})
    groups = muon_param_groups(module.model, weight_decay=0.05, split_qkv=True)
    names = {id(p): n for n, p in module.model.named_parameters()}
    assert [g.get("split", 1) for g in groups[:2]] == [1, 3]
    assert {names[id(p)].rsplit(".", 2)[-2] for p in groups[1]["params"]} == {"qkv"}
    assert "qkv" not in {names[id(p)].rsplit(".", 2)[-2] for p in groups[0]["params"]}
    assert sum(len(g["params"]) for g in groups) == len(names)  # every parameter, once
    qkv = [p for n, p in module.model.named_parameters() if n.endswith("qkv.weight")]
    start = [p.detach().clone() for p in qkv]
    trainer = quiet_trainer(tmp_path, max_steps=2, max_epochs=1)
    trainer.fit(module, random_loader(48))
    assert [g["split"] for g in trainer.optimizers[0].param_groups[:2]] == [1, 3]
    assert all((p - s).abs().max() > 0 for p, s in zip(qkv, start, strict=True))
    with pytest.raises(ValueError, match="optimizer.name='adamw' has no Muon group"):
        ViTClassifier(optimizer={"name": "adamw", "muon": {"split_qkv": True}})


@pytest.mark.parametrize("spt", [True, False])
def test_muon_patch_embed_puts_the_patch_projection_in_muon_and_trains(
    tmp_path, spt, monkeypatch
) -> None:
    """With shifted patch tokens the projection is an nn.Linear (a matrix); without, a conv
    whose filter Muon takes as its out x in*k*k matrix, and gives back in the filter's shape.
    The iterations run in float32 on every machine here: in bfloat16 (the default where bf16 is
    fast) the step and this check's recomputation round apart by more than the tolerance."""
    monkeypatch.setattr(muon_module, "iteration_dtype", lambda params: torch.float32)
    torch.manual_seed(0)
    module = tiny_classifier(
        network={"spt": spt}, optimizer={"name": "muon", "muon": {"patch_embed": True}}
    )
    names = {id(p): n for n, p in module.model.named_parameters()}
    groups = muon_param_groups(module.model, weight_decay=0.05, patch_embed=True)
    assert "patch_embed.proj.weight" in {names[id(p)] for p in groups[0]["params"]}
    assert sum(len(g["params"]) for g in groups) == len(names)  # every parameter, once
    weight = module.model.patch_embed.proj.weight
    assert weight.ndim == (2 if spt else 4)
    start = weight.detach().clone()
    grads: list[torch.Tensor] = []  # the gradient the step used, as backward left it
    weight.register_post_accumulate_grad_hook(lambda p: grads.append(p.grad.detach().clone()))
    trainer = quiet_trainer(tmp_path, max_steps=1, max_epochs=1)
    trainer.fit(module, random_loader(48))
    opt = trainer.optimizers[0]
    assert any(p is weight for g in opt.param_groups if g["use_muon"] for p in g["params"])
    assert opt.ns_dtype == torch.float32
    # one step from zero momentum: decay, then the orthogonalized look-ahead (0.05 + 0.95*0.05)
    # of the gradient, scaled as the group's matrices are; the same as for the flat matrix
    group = next(g for g in opt.param_groups if any(p is weight for p in g["params"]))
    assert len(grads) == 1
    grad = grads[0]
    flat = grad.reshape(grad.shape[0], -1)
    update = orthogonalize(flat * (0.05 + 0.95 * 0.05), dtype=opt.ns_dtype).reshape(weight.shape)
    lr, scale = group["lr"], 0.2 * max(flat.shape) ** 0.5
    expected = start * (1 - lr * group["weight_decay"]) - lr * scale * update
    # the look-ahead is two lerps there, one product here: inputs a few roundings apart, which
    # the iterations grow as they grow their own; then the decay and the step round the weight
    update_tol = ns_tol(F32, *sorted(flat.shape)) + sum_tol(F32, 4) * GROWTH
    tol = lr * scale * update_tol + sum_tol(F32, 3, start.abs().max())
    torch.testing.assert_close(weight.detach(), expected, rtol=0, atol=tol)
    with pytest.raises(
        ValueError,
        match=r"optimizer.muon sets patch_embed=True, .*\(--model.optimizer.muon.patch_embed false",
    ):
        ViTClassifier(optimizer={"name": "adamw", "muon": {"patch_embed": True}})


def test_muon_ns_steps_reaches_the_iterations_and_is_checked(tmp_path, monkeypatch) -> None:
    steps_seen = []
    real = muon_module.orthogonalize
    monkeypatch.setattr(
        muon_module,
        "orthogonalize",
        lambda g, **kw: steps_seen.append(kw["steps"]) or real(g, **kw),
    )
    module = tiny_classifier(optimizer={"name": "muon", "muon": {"ns_steps": 3}})
    trainer = quiet_trainer(tmp_path, max_steps=1, max_epochs=1)
    trainer.fit(module, random_loader(48))
    muon = [g for g in trainer.optimizers[0].param_groups if g["use_muon"]]
    assert muon and all(g["ns_steps"] == 3 for g in muon)
    assert steps_seen and set(steps_seen) == {3}
    for bad in (0, -1, 2.5, True):
        with pytest.raises(
            ValueError, match=r"optimizer.muon.ns_steps=.*: expected a whole number"
        ):
            ViTClassifier(optimizer={"name": "muon", "muon": {"ns_steps": bad}})
    with pytest.raises(ValueError, match="--model.optimizer.muon.ns_steps 5"):
        ViTClassifier(optimizer={"name": "adamw", "muon": {"ns_steps": 3}})
    with pytest.raises(ValueError, match=r"ns_steps=0: expected a whole number"):
        MuonAdamW([{"params": [nn.Parameter(torch.ones(2, 2))], "use_muon": True}], ns_steps=0)


def test_muon_momentum_reaches_the_optimizer_and_is_checked(tmp_path) -> None:
    class Grads(L.Callback):  # the module drops the gradients when the step ends
        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            self.grads = {id(p): p.grad.clone() for p in pl_module.parameters()}

    module = tiny_classifier(optimizer={"name": "muon", "muon": {"momentum": 0.8}})
    seen = Grads()
    trainer = quiet_trainer(tmp_path, max_steps=1, max_epochs=1, callbacks=[seen])
    trainer.fit(module, random_loader(48))
    muon = [g for g in trainer.optimizers[0].param_groups if g["use_muon"]]
    assert muon and all(g["momentum"] == 0.8 for g in muon)
    state = trainer.optimizers[0].state[muon[0]["params"][0]]
    grad = seen.grads[id(muon[0]["params"][0])]
    assert torch.equal(state["momentum_buffer"], 0.2 * grad)  # (1 - 0.8) g: from 0, one product
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=rf"optimizer.muon.momentum={bad} must be in \[0, 1\)"):
            ViTClassifier(optimizer={"name": "muon", "muon": {"momentum": bad}})
    # two Muon settings over AdamW: both named, with the flags that turn them off
    with pytest.raises(
        ValueError,
        match="sets momentum=0.9, patch_embed=True, .*"
        "--model.optimizer.muon.momentum 0.95 --model.optimizer.muon.patch_embed false",
    ):
        ViTClassifier(optimizer={"name": "adamw", "muon": {"momentum": 0.9, "patch_embed": True}})


def test_muon_groups_take_the_blocks_matrices_only() -> None:
    module = tiny_classifier(optimizer={"name": "muon"})
    groups = muon_param_groups(module.model, weight_decay=0.05)
    names = {id(p): n for n, p in module.model.named_parameters()}
    muon = {names[id(p)] for p in groups[0]["params"]}
    assert groups[0]["use_muon"] and muon and all(n.startswith("blocks.") for n in muon)
    assert {n.rsplit(".", 2)[-2] for n in muon} == {"qkv", "proj", "fc1", "fc2"}
    rest = [names[id(p)] for g in groups[1:] for p in g["params"]]
    assert "head.weight" in rest and "patch_embed.proj.weight" in rest
    assert len(muon) + len(rest) == len(names)  # every parameter, once


def test_muon_trains_resumes_and_refuses_unknown_optimizers(tmp_path) -> None:
    torch.manual_seed(0)
    module = tiny_classifier(optimizer={"name": "muon"}, schedule={"warmup_epochs": 0})
    start = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer = quiet_trainer(tmp_path, max_steps=3, max_epochs=1)
    trainer.fit(module, random_loader(48))
    assert isinstance(trainer.optimizers[0], MuonAdamW)
    assert all((p - start[n]).abs().max() > 0 for n, p in module.named_parameters())
    path = tmp_path / "muon.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=True)["optimizer_states"][0]
    assert any("momentum_buffer" in s for s in state["state"].values())
    with pytest.raises(ValueError, match="optimizer.name='sgd': expected 'adamw', or 'muon'"):
        ViTClassifier(optimizer={"name": "sgd"})


def test_muon_lr_scale_sets_the_muon_groups_peak_and_the_schedule_scales_both(tmp_path) -> None:
    module = tiny_classifier(
        optimizer={"name": "muon", "muon": {"lr_scale": 3.0}}, schedule={"warmup_epochs": 1}
    )
    lrs = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, *_) -> None:
            lrs.append([g["lr"] for g in trainer.optimizers[0].param_groups])

    trainer = quiet_trainer(tmp_path, max_steps=4, max_epochs=2, callbacks=[Record()])
    trainer.fit(module, random_loader(48))
    assert len(lrs) == 4
    # warm-up then decay: every step, Muon's is 3x the others' (float64 on the host: approx's
    # 1e-6 is far above their rounding, and no CPU kind changes it)
    for muon, *adamw in lrs:
        assert all(a == adamw[0] for a in adamw) and muon == pytest.approx(3.0 * adamw[0])
    assert lrs[0][-1] < max(row[-1] for row in lrs)  # the warm-up moved them together
    logged = trainer.callback_metrics["train/lr"]  # the schedule's (AdamW's) lr, not Muon's
    assert float(logged) == pytest.approx(lrs[-1][-1])  # logged in float32: one rounding
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=f"optimizer.muon.lr_scale={bad} must be positive"):
            ViTClassifier(optimizer={"name": "muon", "muon": {"lr_scale": bad}})
    with pytest.raises(
        ValueError,
        match="optimizer.muon sets lr_scale=2.0, and optimizer.name='adamw' has no Muon group: "
        "set optimizer.name: muon, or drop those settings "
        r"\(--model.optimizer.muon.lr_scale 1.0 ",
    ):
        ViTClassifier(optimizer={"name": "adamw", "muon": {"lr_scale": 2.0}})


def test_a_resume_with_another_optimizer_layout_says_which_to_resume_with(tmp_path) -> None:
    torch.manual_seed(0)
    # a floor under the learning rate: the longer resumes below train on at min_lr (with a floor
    # of 0 past the saved schedule's end they would be refused: vit/train/schedule.py)
    floor = {"min_lr": 1e-5}
    module = tiny_classifier(optimizer={"name": "muon"}, schedule=floor)
    trainer = quiet_trainer(tmp_path, max_steps=2, max_epochs=1)
    trainer.fit(module, random_loader(48))
    path = tmp_path / "muon.ckpt"
    trainer.save_checkpoint(path)
    for other, flag in (
        ({"name": "muon", "muon": {"split_qkv": True}}, "--model.optimizer.muon.split_qkv false"),
        (
            {"name": "muon", "muon": {"patch_embed": True}},
            "--model.optimizer.muon.patch_embed false",
        ),
        ({"name": "adamw"}, "--model.optimizer.name muon"),
    ):
        resumed = tiny_classifier(optimizer=other, schedule=floor)
        with pytest.raises(ValueError, match=f"a resume needs the same .* {flag}"):
            quiet_trainer(tmp_path, max_steps=4, max_epochs=2).fit(
                resumed, random_loader(48), ckpt_path=path
            )
    # the same layout resumes; loading the weights into another layout (not a resume) works
    same = tiny_classifier(optimizer={"name": "muon"}, schedule=floor)
    quiet_trainer(tmp_path, max_steps=3, max_epochs=2).fit(same, random_loader(48), ckpt_path=path)
    loaded = ViTClassifier.load_from_checkpoint(path, optimizer={"name": "adamw"})
    assert loaded.hparams.optimizer["name"] == "adamw"


def test_muon_refuses_fsdp_which_shards_its_matrices() -> None:
    from types import SimpleNamespace

    from lightning.pytorch.strategies import FSDPStrategy

    module = tiny_classifier(optimizer={"name": "muon"})
    module._trainer = SimpleNamespace(strategy=FSDPStrategy(), max_epochs=1)
    with pytest.raises(ValueError) as error:
        module.configure_optimizers()
    assert str(error.value) == (
        "optimizer.name: muon orthogonalises whole weight matrices, and FSDP shards them "
        "across devices: use strategy ddp (each device holds every matrix) or "
        "optimizer.name: adamw."
    )


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_both_optimizers_take_the_configured_betas(name: str) -> None:
    """AdamW's betas reach AdamW, and MuonAdamW's AdamW groups (Muon's own use its momentum)."""
    from vit.train.optim import build_optimizer

    model = tiny_classifier().model
    opt = build_optimizer(model, OptimizerConfig(name=name, lr=0.01, betas=(0.8, 0.95)))
    assert isinstance(opt, torch.optim.AdamW if name == "adamw" else MuonAdamW)
    assert {g["betas"] for g in opt.param_groups} == {(0.8, 0.95)}


def test_iterations_run_in_bf16_only_where_bf16_is_fast(monkeypatch) -> None:
    import vit.train.muon

    w = nn.Parameter(torch.zeros(4, 4))
    for fast, dtype in ((False, torch.float32), (True, torch.bfloat16)):
        monkeypatch.setattr(vit.train.muon, "cpu_has_fast_bf16", lambda fast=fast: fast)
        assert MuonAdamW([{"params": [w], "use_muon": True}]).ns_dtype == dtype
    monkeypatch.setattr(vit.train.muon, "cpu_has_fast_bf16", lambda: True)
    opt = MuonAdamW([{"params": [w], "use_muon": True}], ns_dtype=torch.float32)
    assert opt.ns_dtype == torch.float32  # an explicit dtype wins
    # a parameter on a GPU iterates in bfloat16 even where the CPU's bf16 is slow; only the
    # device is read, so a stand-in with a CUDA device serves on a machine without one
    monkeypatch.setattr(vit.train.muon, "cpu_has_fast_bf16", lambda: False)
    on_gpu = SimpleNamespace(device=torch.device("cuda"))
    assert iteration_dtype([w, on_gpu]) == torch.bfloat16
    assert iteration_dtype([w]) == torch.float32


def test_muon_adamw_defaults_are_adamws_and_muons_own() -> None:
    """Unset, a group is an AdamW group with torch.optim.AdamW's lr, betas and eps, and the
    project's weight decay (OptimizerConfig's 0.05); Muon's momentum and steps are its
    reference code's (0.95, 5), and a Muon group orthogonalizes each matrix whole (split 1)."""
    w = nn.Parameter(torch.zeros(4, 4))
    opt = MuonAdamW([{"params": [w]}])
    adamw = torch.optim.AdamW([nn.Parameter(torch.zeros(1))]).defaults
    config = OptimizerConfig()
    assert opt.defaults == {
        "lr": adamw["lr"],
        "weight_decay": config.weight_decay,
        "betas": adamw["betas"],
        "eps": adamw["eps"],
        "momentum": 0.95,
        "ns_steps": 5,
        "use_muon": False,
        "split": 1,
    }
    assert opt.param_groups[0]["use_muon"] is False


def test_muon_groups_take_the_given_lr_or_the_optimizers() -> None:
    """Both Muon groups (the qkv one split in 3) carry Muon's settings and the given peak lr;
    without one, every group takes the optimizer's lr."""
    model = tiny_classifier(optimizer={"name": "muon"}).model
    groups = muon_param_groups(model, weight_decay=0.07, lr=0.5, split_qkv=True)
    assert [(g["use_muon"], g["weight_decay"], g["lr"]) for g in groups[:2]] == [
        (True, 0.07, 0.5),
        (True, 0.07, 0.5),
    ]
    assert groups[1]["split"] == 3
    assert all("use_muon" not in g for g in groups[2:])  # AdamW's, by MuonAdamW's default
    opt = MuonAdamW(muon_param_groups(model, weight_decay=0.07), lr=0.02)
    assert [g["lr"] for g in opt.param_groups] == [0.02] * len(opt.param_groups)


@pytest.mark.parametrize(
    ("saved", "ours"),
    [
        # saved before the optimizer was a setting: AdamW, no Muon options
        ({}, OptimizerConfig()),
        ({"name": "muon", "muon": None}, OptimizerConfig(name="muon")),
        (
            {"name": "muon", "muon": {"split_qkv": True, "patch_embed": True}},
            OptimizerConfig(name="muon", muon=MuonConfig(split_qkv=True, patch_embed=True)),
        ),
    ],
)
def test_a_resume_with_the_same_optimizer_layout_is_accepted(saved: dict, ours) -> None:
    check_resume_layout(saved, ours)  # raises on a mismatch


def test_a_resume_layout_mismatch_names_both_layouts_and_the_flags() -> None:
    message = (
        "--ckpt_path: the checkpoint's optimizer state was saved with {'name': 'muon', "
        "'muon.split_qkv': True, 'muon.patch_embed': False} and this run has {'name': 'adamw', "
        "'muon.split_qkv': False, 'muon.patch_embed': False}; a resume needs the same optimizer "
        "layout. Resume with --model.optimizer.name muon --model.optimizer.muon.split_qkv true "
        "--model.optimizer.muon.patch_embed false, or start a fresh run without --ckpt_path."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_resume_layout({"name": "muon", "muon": {"split_qkv": True}}, OptimizerConfig())


def test_param_groups_take_any_module_and_skip_only_the_frozen_parameters() -> None:
    """A module without no_weight_decay() is grouped too; a frozen parameter is left out and the
    ones after it are not."""
    from vit.train.optim import param_groups

    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    decay, no_decay = param_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [tuple(p.shape) for p in decay["params"]] == [(2, 4)]
    assert [tuple(p.shape) for p in no_decay["params"]] == [(4,), (4,), (4,), (2,)]


def _refusal(**kwargs: object) -> str:
    with pytest.raises(ValueError) as error:
        OptimizerConfig(**kwargs)
    return str(error.value)


def test_each_bad_optimizer_setting_is_refused_word_for_word() -> None:
    assert _refusal(name="sgd") == (
        "optimizer.name='sgd': expected 'adamw', or 'muon' (Muon for the blocks' weight "
        "matrices, AdamW for the rest)."
    )
    assert _refusal(lr=0.0) == "optimizer.lr=0.0 must be positive (1e-3 suits AdamW on a ViT)."
    assert _refusal(weight_decay=-0.1) == "optimizer.weight_decay=-0.1 must be >= 0."
    for betas in ([0.9, 1.0], [-0.1, 0.9], [1.5, 0.9], [0.9]):
        assert _refusal(betas=betas) == (
            f"optimizer.betas={betas} must be two numbers in [0, 1), e.g. [0.9, 0.999]."
        )
    assert _refusal(muon={"lr_scale": 0.0}) == (
        "optimizer.muon.lr_scale=0.0 must be positive: the Muon group's learning rate is lr "
        "times it."
    )
    assert _refusal(muon={"ns_steps": 0}) == (
        "optimizer.muon.ns_steps=0: expected a whole number of Newton-Schulz iterations, 1 or "
        "more (Muon's default is 5; fewer are cheaper and less exact)."
    )
    assert _refusal(compile=True) == (
        "optimizer.compile compiles Muon-with-AdamW's step (optimizer.name: muon); for adamw, "
        "optimizer.fused is PyTorch's own fused step."
    )
    assert _refusal(muon={"patch_embed": True}).endswith(
        "over a config that sets them, such as cpu60.yaml)."
    )


def test_the_edge_optimizer_settings_are_taken() -> None:
    """betas may be 0 (no averaging), one Newton-Schulz step is enough to be valid."""
    assert OptimizerConfig(betas=(0.0, 0.0)).betas == (0.0, 0.0)
    assert OptimizerConfig(name="muon", muon={"ns_steps": 1}).muon.ns_steps == 1
    assert OptimizerConfig(weight_decay=0.0).weight_decay == 0.0


def test_the_update_at_tensor_learning_rates_is_the_update_at_numbers() -> None:
    """What the compiled step runs (optimizer.compile; tests/test_compile.py compiles it), run
    eager: the learning rates as 0-d tensors, the bias corrections from tensor step counts,
    gradients and state handed in; three steps land where step() at the same numbers does."""
    torch.manual_seed(0)
    model = mixed_model()
    twin = mixed_model()
    twin.load_state_dict(model.state_dict())
    start = [p.detach().clone() for p in model.parameters()]
    kwargs = dict(lr=1e-2, weight_decay=0.1, ns_dtype=torch.float32)
    numbers, tensors = (
        MuonAdamW(mixed_groups(model), **kwargs),
        MuonAdamW(mixed_groups(twin), **kwargs),
    )
    for step in range(3):
        grads = [torch.randn_like(p) for p in model.parameters()]
        for opt, m in ((numbers, model), (tensors, twin)):
            for p, g in zip(m.parameters(), grads, strict=True):
                p.grad = g.clone()
            schedule_lr(opt, step)
        numbers.step()
        tensors._init_state()
        with torch.no_grad():
            lrs = [torch.tensor(g["lr"]) for g in tensors.param_groups]
            tensors._update(tensors._step_groups(), lrs)
    assert tensors.state[twin[1].bias]["step"] == 3
    # the same products; per step the tensors round lr x scale, the product and the sum of
    # Muon's update (entries at most ~1.2: singular values near one), AdamW's six operations
    # once more each (float32 factors, not Python's doubles), and the decay the weight twice
    for a, b, a0 in zip(model.parameters(), twin.parameters(), start, strict=True):
        w, lr = a.detach().abs().max(), 1e-2  # the largest group lr
        scale = 1.2 * 0.2 * max(a.shape) ** 0.5 if a.dim() == 2 else 1.0
        tol = 3 * (sum_tol(F32, 6, lr * scale) + sum_tol(F32, 2, w))
        assert (a - b).abs().max() <= tol
        assert (b - a0).abs().max() > 100 * tol  # the steps moved it: the check can tell


def test_optimizer_compile_builds_a_compiled_muon_and_counts_as_compiling() -> None:
    model = tiny_classifier(optimizer={"name": "muon", "compile": True})
    assert model.compiles_in_fit  # TimeBudget then takes the first step off the clock
    assert build_optimizer(model.model, model.optimizer_config).compiled
    plain = tiny_classifier(optimizer={"name": "muon"})
    assert not plain.compiles_in_fit
    assert not build_optimizer(plain.model, plain.optimizer_config).compiled


def test_a_group_without_gradients_is_skipped_and_the_rest_step() -> None:
    """A group whose parameters have no gradient (frozen, or unused this step) before the
    others: it keeps its weights and gets no state, and the groups after it still step."""
    torch.manual_seed(0)
    model = mixed_model()
    frozen = nn.Parameter(torch.randn(4, 4))
    opt = MuonAdamW([{"params": [frozen], "use_muon": True}, *mixed_groups(model)], lr=1e-2)
    before = [p.detach().clone() for p in (frozen, *model.parameters())]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert torch.equal(frozen, before[0]) and not opt.state[frozen]
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before[1:], strict=True))


def test_adamw_groups_at_equal_settings_step_as_one_however_the_schedule_set_them() -> None:
    """A schedule writes each group's lr as a new number: groups whose settings agree in value
    still step as one (no dispatch more than one group holding all their parameters)."""

    def ops(split: bool) -> int:
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(5)), nn.Parameter(torch.randn(3))]
        groups = [{"params": params[:1]}, {"params": params[1:]}] if split else [{"params": params}]
        opt = MuonAdamW(groups, weight_decay=0.0)
        for p in params:
            p.grad = torch.randn(p.shape)
        opt.step()  # the first step creates the state
        for group in opt.param_groups:
            group["lr"] = float(str(group["lr"] * 0.5))  # equal values, distinct objects
        assert len({id(g["lr"]) for g in opt.param_groups}) == len(groups)
        return sum(_dispatched_ops(opt.step).values())

    assert ops(split=True) == ops(split=False)


def test_the_compiled_path_fills_one_lr_tensor_per_group_and_compiles_once(monkeypatch) -> None:
    """optimizer.compile's plumbing, with torch.compile stood in by the identity (the compile
    itself: tests/test_compile.py): one compile, of the update, without dynamic shapes; each
    step writes every group's current lr into that group's tensor, which the update reads."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    torch.manual_seed(0)
    model = mixed_model()
    start = [p.detach().clone() for p in model.parameters()]
    opt = MuonAdamW(mixed_groups(model), lr=1e-2, ns_dtype=torch.float32, compiled=True)
    for step in range(2):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        schedule_lr(opt, step)
        opt.step()
        lrs = [g["lr"] for g in opt.param_groups]
        assert [t.item() for t in opt._lr_tensors] == pytest.approx(lrs, rel=1e-7)
    assert calls == [{"dynamic": False}]
    assert all(not torch.equal(p, s) for p, s in zip(model.parameters(), start, strict=True))
