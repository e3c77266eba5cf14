"""Attention math against the tutorials' worked numbers and torch.nn.MultiheadAttention; DropPath."""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import head_products, sum_tol
from vit.model.attention import (
    Attention,
    causal_mask,
    default_kernel,
    mask_and_renormalize,
    scaled_dot_product_attention,
)
from vit.model.block import Block, DropPath, Mlp

F32 = torch.float32


def _attention_tol(attn: Attention, x: torch.Tensor, out: torch.Tensor) -> float:
    """Two computations of attn(x) that differ only in summation order (fused or explicit kernel,
    a reference, other row counts): sums of head_dim terms (scores), of N (softmax, context) and
    of C (projections), on values of the output's size or 1 (the weights)."""
    n, c = x.shape[-2:]
    return sum_tol(x.dtype, 2 * c + attn.head_dim + 2 * n, max(1.0, out.detach().abs().max()))


def test_softmax_worked_example() -> None:
    """The tutorials' scores [4.0, -1.0, 2.1] -> weights [0.8648, 0.0058, 0.1294], through our
    function: with d_k = 4 a query 2 e_0 scores key j as 2 k_j0 / sqrt(4) = k_j0, so a missing or
    wrong 1/sqrt(d_k), or a softmax over the wrong axis, gives other numbers."""
    q = torch.tensor([[2.0, 0.0, 0.0, 0.0]])  # (N=1, d_k=4)
    k = torch.tensor([[4.0, 0.3, -0.7, 1.1], [-1.0, 2.0, 0.5, -0.2], [2.1, -1.5, 0.9, 0.4]])
    v = torch.eye(3)  # each key's value is its one-hot: the context is the weights themselves
    ctx, weights = scaled_dot_product_attention(q, k, v)
    expected = torch.tensor([[0.8648, 0.0058, 0.1294]])
    # the tutorial's numbers: 4 printed decimals, so within a unit of the last
    assert torch.allclose(weights, expected, atol=1e-4)
    assert torch.allclose(ctx, expected, atol=1e-4)


def test_hello_shiny_sun_context_vector() -> None:
    """Plain dot-product attention (no projections, no scaling) over three 3-d embeddings."""
    x = torch.tensor([[0.34, 0.22, 0.54], [0.53, 0.34, 0.98], [0.29, 0.54, 0.93]])
    scores = x @ x.T
    weights = scores.softmax(dim=-1)
    context = weights @ x
    # the tutorial's 3 printed decimals (from its rounded weights: 0.386 for 0.3854)
    assert torch.allclose(context[1], torch.tensor([0.399, 0.386, 0.861]), atol=1e-3)
    # the library function computes the same thing once its 1/sqrt(d_k) scale is undone
    ctx, w = scaled_dot_product_attention(x * 3**0.5, x, x)
    # rounding: the scale's, then sums of 3 terms (scores, softmax, context) on scores up to 1.4
    torch.testing.assert_close(ctx, context, rtol=0, atol=sum_tol(F32, 2 + 3 * 3, scores.max()))
    # rows of a softmax: its normalising sum and this one, 3 terms each
    torch.testing.assert_close(w.sum(dim=-1), torch.ones(3), rtol=0, atol=sum_tol(F32, 2 * 3))


def test_scaled_dot_product_matches_formula_and_torch() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    ctx, w = scaled_dot_product_attention(q, k, v)
    expected_w = (q @ k.transpose(-1, -2) / 8**0.5).softmax(-1)
    assert w.shape == (2, 3, 5, 7)
    assert torch.equal(w, expected_w)  # the same formula, the same kernels: bit for bit
    # torch's fused kernel sums in another order: scores of 8 terms, softmax and context of 7
    fused = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(ctx, fused, rtol=0, atol=sum_tol(F32, 8 + 2 * 7, v.abs().max()))


def test_causal_mask_two_ways_agree() -> None:
    """-inf above the diagonal before softmax == mask the weights and renormalise the rows."""
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 6, 16), torch.randn(4, 6, 16), torch.randn(4, 6, 16)
    mask = causal_mask(6)
    _, w_inf = scaled_dot_product_attention(q, k, v, mask=mask)
    _, w_plain = scaled_dot_product_attention(q, k, v)
    w_renorm = mask_and_renormalize(w_plain, mask)
    # each way a softmax of 6 terms, the second renormalised by a sum of up to 6: weights <= 1
    torch.testing.assert_close(w_inf, w_renorm, rtol=0, atol=sum_tol(F32, 3 * 6))
    assert torch.all(w_inf.triu(diagonal=1) == 0)  # nothing above the diagonal
    torch.testing.assert_close(w_inf.sum(-1), torch.ones(4, 6), rtol=0, atol=sum_tol(F32, 2 * 6))
    # an additive mask (-inf) is the same as the boolean one: scores + 0 and -inf, bit for bit
    additive = torch.zeros(6, 6).masked_fill(~mask, float("-inf"))
    _, w_add = scaled_dot_product_attention(q, k, v, mask=additive)
    assert torch.equal(w_add, w_inf)


def test_attention_dropout_drops_weights_only_in_training() -> None:
    torch.manual_seed(0)
    q = k = v = torch.randn(2, 10, 8)
    ctx_eval, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=False)
    ctx_ref, _ = scaled_dot_product_attention(q, k, v)
    assert torch.equal(ctx_eval, ctx_ref)
    ctx_train, w_train = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=True)
    assert not torch.allclose(ctx_train, ctx_ref)
    # the returned weights are before dropout: rows of a softmax of 10 terms
    torch.testing.assert_close(w_train.sum(-1), torch.ones(2, 10), rtol=0, atol=sum_tol(F32, 20))


def test_attention_dropout_defaults_to_training_and_rescales_the_kept_weights() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(2, 16, 8), torch.randn(2, 16, 8)
    v = torch.eye(16)  # one-hot values: the context is the (dropped) weights themselves
    ctx, w = scaled_dot_product_attention(q, k, v, dropout_p=0.25)  # training=True by default
    kept = ctx != 0
    assert 0 < (~kept).sum() < ctx.numel()
    # inverted dropout at the rate asked for: w times a rounded 1 / 0.75, against w / 0.75
    torch.testing.assert_close(ctx[kept], w[kept] / 0.75, rtol=sum_tol(F32, 2), atol=0)


def test_forward_with_weights_drops_weights_as_forward_does() -> None:
    torch.manual_seed(0)
    attn = Attention(16, num_heads=2, attn_drop=0.5, kernel="explicit")
    x = torch.randn(2, 7, 16)
    torch.manual_seed(1)
    dropped = attn(x)
    torch.manual_seed(1)
    out, _ = attn.forward_with_weights(x)
    assert torch.equal(out, dropped)  # the explicit kernel both ways, the same draws: bit for bit
    attn.eval()
    clean = attn(x)
    assert not torch.allclose(out, clean, atol=1e-3)  # training did drop weights
    assert torch.equal(attn.forward_with_weights(x)[0], clean)  # evaluation: none


def test_fused_kernel_drops_attention_weights_in_training_only() -> None:
    """attn_drop holds on the fused kernel as on the explicit one. In training every sample draws
    its own dropout (inverted: kept weights / (1 - p)), so the draws differ from the undropped
    output yet average to it within 5 standard errors; in evaluation nothing is dropped, so the
    fused output is the explicit kernel's."""
    torch.manual_seed(0)
    fused = Attention(8, num_heads=2, attn_drop=0.5, kernel="fused")
    explicit = Attention(8, num_heads=2, attn_drop=0.5, kernel="explicit").eval()
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(1, 5, 8)
    clean = explicit(x)[0]  # (N, C): no dropout in evaluation
    fused.eval()
    evaluated = fused(x)
    torch.testing.assert_close(
        evaluated[0], clean, rtol=0, atol=_attention_tol(fused, x, evaluated)
    )
    fused.train()
    draws = fused(x.expand(4000, 5, 8))  # 4000 copies of one sample, each with its own dropout
    assert not torch.allclose(draws, clean.expand_as(draws), atol=1e-2)
    stderr = draws.std(dim=0) / len(draws) ** 0.5
    assert ((draws.mean(dim=0) - clean).abs() <= 5 * stderr).all()


def test_causal_mask_is_made_on_the_given_device() -> None:
    assert torch.equal(causal_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())
    assert causal_mask(3, device="meta").device.type == "meta"  # meta stands in for a GPU


@pytest.mark.parametrize("masked", [False, True])
def test_parity_with_torch_multihead_attention(masked: bool) -> None:
    torch.manual_seed(0)
    dim, heads = 24, 4
    ours = Attention(dim, num_heads=heads, kernel="explicit")
    ref = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
    with torch.no_grad():
        ours.qkv.weight.copy_(ref.in_proj_weight)  # both stack q, k, v rows in that order
        ours.qkv.bias.copy_(ref.in_proj_bias)
        ours.proj.weight.copy_(ref.out_proj.weight)
        ours.proj.bias.copy_(ref.out_proj.bias)
    x = torch.randn(3, 9, dim)
    mask = causal_mask(9) if masked else None
    expected, ref_w = ref(
        x,
        x,
        x,
        attn_mask=None if mask is None else ~mask,  # torch: True = block
        average_attn_weights=False,
    )
    out, weights = ours.forward_with_weights(x, mask=mask)
    tol = _attention_tol(ours, x, expected)  # torch's order: q scaled before q k^T, then bmm
    torch.testing.assert_close(ours(x, mask=mask), expected, rtol=0, atol=tol)
    torch.testing.assert_close(out, expected, rtol=0, atol=tol)
    # weights <= 1: projections of C terms, scores of head_dim, a softmax of N
    tol_w = sum_tol(F32, dim + dim // heads + 9)
    torch.testing.assert_close(weights, ref_w, rtol=0, atol=tol_w)


def test_fused_equals_explicit() -> None:
    torch.manual_seed(0)
    fused = Attention(48, num_heads=3, kernel="fused")
    explicit = Attention(48, num_heads=3, kernel="explicit")
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(4, 65, 48)
    out = fused(x)
    tol = _attention_tol(fused, x, out)  # the fused kernel sums in its own order
    torch.testing.assert_close(out, explicit(x), rtol=0, atol=tol)
    with_weights, _ = fused.forward_with_weights(x)
    torch.testing.assert_close(with_weights, out, rtol=0, atol=tol)


def _attention_float64(attn: Attention, x: torch.Tensor, *, scale: bool = True) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_k)) v and the projections, written out in float64 from attn's
    weights and x as they are (bf16 values are exact in float64); scale=False drops 1/sqrt(d_k)."""
    w, b = attn.qkv.weight.double(), attn.qkv.bias.double()
    qkv = F.linear(x.double(), w, b).unflatten(-1, (3, attn.num_heads, attn.head_dim))
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, N, D)
    scores = q @ k.transpose(-1, -2) / (attn.head_dim**0.5 if scale else 1.0)
    ctx = (scores.softmax(dim=-1) @ v).transpose(1, 2).flatten(2)  # (B, N, H * D)
    return F.linear(ctx, attn.proj.weight.double(), attn.proj.bias.double())


@torch.no_grad()
def test_each_kernel_in_bf16_is_within_rounding_of_float64() -> None:
    """bf16 keeps 8 significant bits: each rounding of a value is off by at most 2^-8 of it
    (half its epsilon, 2^-7); the products accumulate in float32. The qkv product, the scores, the
    softmax, the context and the output projection round in turn, so each path is held to 4 x
    2^-8 of the output's largest entry; a computation without 1/sqrt(d_k) misses by over 10x
    that bound, so the bound can tell."""
    torch.manual_seed(0)
    fused = Attention(48, num_heads=3, kernel="fused").to(torch.bfloat16)
    explicit = Attention(48, num_heads=3, kernel="explicit").to(torch.bfloat16)
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(4, 65, 48, dtype=torch.bfloat16)
    reference = _attention_float64(fused, x)
    bound = 4 * 2**-8 * reference.abs().max()  # bf16: four roundings of the largest value
    outputs = {
        "explicit": explicit(x),
        "forward_with_weights": fused.forward_with_weights(x)[0],
    }
    try:
        outputs["fused"] = fused(x)
    except RuntimeError as err:
        # torch's fused bf16 kernel packs for AMX/AVX512-BF16 by the hardware's flags, then
        # refuses when ATEN_CPU_CAPABILITY holds ATen below AVX-512 (scripts/kernel_matrix.sh
        # sets that; a real CPU's flags and capability agree): not a number to bound
        forced = os.environ.get("ATEN_CPU_CAPABILITY") in ("default", "avx2")
        if not (forced and "pack_vnni2" in str(err)):
            raise
    for name, out in outputs.items():
        assert out.dtype == torch.bfloat16
        error = (out.double() - reference).abs().max()
        assert error <= bound, (name, error.item(), bound.item())
    unscaled = (_attention_float64(fused, x, scale=False) - reference).abs().max()
    assert unscaled > 10 * bound, (unscaled.item(), bound.item())


@torch.no_grad()
def test_attention_defaults_are_eight_heads_with_bias_and_no_dropout() -> None:
    """Attention(dim) by default: 8 heads, a qkv bias, kernel "auto", no LSA, and no dropout on
    the weights or the output even in training: it is the float64 reference's softmax attention."""
    torch.manual_seed(0)
    attn = Attention(16)  # training mode
    assert attn.num_heads == 8 and attn.head_dim == 2 and attn.kernel == "auto"
    assert attn.qkv.bias is not None and not hasattr(attn, "temperature")
    x = torch.randn(2, 5, 16)
    reference = _attention_float64(attn, x)
    tol = _attention_tol(attn, x, reference)  # float32 against float64: its rounding alone
    torch.testing.assert_close(attn(x).double(), reference, rtol=0, atol=tol)
    torch.testing.assert_close(
        attn.forward_with_weights(x)[0].double(), reference, rtol=0, atol=tol
    )


def test_kernel_choice_is_explicit_and_validated() -> None:
    assert default_kernel(torch.device("cpu"), torch.bfloat16) == "explicit"
    assert default_kernel(torch.device("cpu"), torch.float32) == "fused"
    assert default_kernel(torch.device("cuda"), torch.bfloat16) == "fused"
    with pytest.raises(ValueError, match="kernel='flash'"):
        Attention(8, num_heads=2, kernel="flash")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        Attention(8, num_heads=3)


@pytest.mark.parametrize(("autocast", "fused_calls"), [(False, 1), (True, 0)])
def test_auto_picks_by_the_dtype_attention_runs_in(
    monkeypatch: pytest.MonkeyPatch, autocast: bool, fused_calls: int
) -> None:
    """On CPU, `auto` sees q's dtype: bf16 under autocast (explicit), float32 otherwise (fused)."""
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    attn = Attention(16, num_heads=2)  # kernel="auto"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        attn(torch.randn(2, 5, 16))
    assert len(calls) == fused_calls


@pytest.mark.parametrize("kernel", ["explicit", "fused"])
@pytest.mark.parametrize("masked", [False, True])
def test_num_queries_gives_the_first_rows_of_the_full_output(kernel: str, masked: bool) -> None:
    torch.manual_seed(0)
    attn = Attention(16, num_heads=4, kernel=kernel).eval()
    x = torch.randn(2, 7, 16)
    mask = causal_mask(7) if masked else None
    full = attn(x, mask=mask)
    tol = _attention_tol(attn, x, full)  # fewer rows: the products may take other kernels
    for q in (1, 3):
        rows = attn(x, mask=mask, num_queries=q)
        assert rows.shape == (2, q, 16)
        torch.testing.assert_close(rows, full[:, :q], rtol=0, atol=tol)


def test_num_queries_without_qkv_bias_gives_the_first_rows() -> None:
    """Without a qkv bias the split projection (queries for the first tokens, keys and values for
    all) still gives the full output's first rows."""
    torch.manual_seed(0)
    attn = Attention(16, num_heads=4, qkv_bias=False).eval()
    x = torch.randn(2, 7, 16)
    full = attn(x)
    tol = _attention_tol(attn, x, full)  # fewer rows: the products may take other kernels
    torch.testing.assert_close(attn(x, num_queries=3), full[:, :3], rtol=0, atol=tol)


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)], ids=["2d", "3d", "4d"])
def test_mask_self_equals_a_mask_without_the_diagonal_and_keeps_gradients(
    lead: tuple[int, ...],
) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(*lead, 6, 4, requires_grad=True) for _ in range(3))  # any leading dims
    no_self = ~torch.eye(6, dtype=torch.bool)
    ctx, weights = scaled_dot_product_attention(q, k, v, mask_self=True)
    ctx_ref, weights_ref = scaled_dot_product_attention(q, k, v, mask=no_self)
    # the same scores with -inf written on the diagonal two ways: bit for bit
    assert torch.equal(weights, weights_ref) and torch.equal(ctx, ctx_ref)
    (grad,) = torch.autograd.grad(ctx.sum(), q)
    (grad_ref,) = torch.autograd.grad(ctx_ref.sum(), q)
    # two autograd graphs (an in-place fill, a masked_fill): sums of 6 keys and 4 channels
    scale = max(1.0, grad_ref.abs().max())
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=sum_tol(F32, 2 * 6 + 2 * 4, scale))


def test_lsa_masks_the_diagonal_and_scales_scores_by_a_trained_temperature() -> None:
    torch.manual_seed(0)
    attn = Attention(16, num_heads=2, kernel="explicit", lsa=True).eval()
    with torch.no_grad():
        attn.temperature.copy_(torch.tensor([0.5, 3.0]))
    x = torch.randn(2, 5, 16)
    out, weights = attn.forward_with_weights(x)
    assert torch.equal(weights.diagonal(dim1=-2, dim2=-1), torch.zeros(2, 2, 5))  # no self
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 5), rtol=0, atol=sum_tol(F32, 10))
    # by hand: softmax(tau_h q k^T / sqrt(d_k)) with -inf on the diagonal, per head
    q, k, _ = (x @ attn.qkv.weight.T + attn.qkv.bias).reshape(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-2, -1) / 8**0.5 * torch.tensor([0.5, 3.0])[:, None, None]
    by_hand = scores.masked_fill(torch.eye(5, dtype=torch.bool), float("-inf")).softmax(-1)
    # weights <= 1 from scores of 16 + 8 terms (the temperature applied before or after), 5 keys
    tol = sum_tol(F32, 16 + 8 + 5, max(1.0, scores.abs().max()))
    torch.testing.assert_close(weights, by_hand, rtol=0, atol=tol)
    assert torch.equal(attn(x), out)  # the explicit kernel both ways: bit for bit
    attn.train()
    attn(x).sum().backward()
    assert attn.temperature.grad is not None and attn.temperature.grad.abs().sum() > 0


@pytest.mark.parametrize("kernel", ["explicit", "fused"])
@pytest.mark.parametrize("mask", [None, "bool", "additive"])
def test_lsa_combines_with_a_given_mask_on_both_kernels(kernel: str, mask: str | None) -> None:
    torch.manual_seed(0)
    attn = Attention(16, num_heads=4, kernel=kernel, lsa=True).eval()
    x = torch.randn(2, 7, 16)
    padding = torch.ones(7, 7, dtype=torch.bool)
    padding[:, 5:] = False  # keys 5 and 6 blocked for every query, as padding would be
    blocked = torch.zeros(7, 7).masked_fill(~padding, float("-inf"))
    given = {None: None, "bool": padding, "additive": blocked}[mask]
    full = attn(x, mask=given)
    out, weights = attn.forward_with_weights(x, mask=given)
    tol = _attention_tol(attn, x, full)
    # the explicit kernel both ways is bit for bit; the fused one sums in its own order
    torch.testing.assert_close(full, out, rtol=0, atol=0 if kernel == "explicit" else tol)
    assert (weights.diagonal(dim1=-2, dim2=-1) == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 7), rtol=0, atol=sum_tol(F32, 14))
    if mask is not None:
        assert (weights[..., 5:] == 0).all()  # the given mask still holds
    rows = attn(x, mask=given, num_queries=3)
    torch.testing.assert_close(rows, full[:, :3], rtol=0, atol=tol)  # fewer rows: other kernels


def test_lsa_builds_its_diagonal_mask_on_the_inputs_device() -> None:
    """The fused kernel needs LSA's no-self mask on q's device; meta stands in for a GPU (a mask
    made on the CPU is refused there, as on CUDA)."""
    attn = Attention(8, num_heads=2, kernel="fused", lsa=True).to("meta")
    out = attn(torch.randn(2, 4, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 4, 8)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_lsa_takes_a_per_sample_mask_with_leading_dims(kind: str) -> None:
    """A (B, 1, N, N) mask, one per sample, combines with LSA's diagonal as a 2-D one does: each
    sample's rows equal that sample run alone with its own (N, N) mask, on both kernels."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    allow = torch.ones(2, 6, 6, dtype=torch.bool)
    allow[0, :, 5:] = False  # sample 0: key 5 is padding
    allow[1, :, 4:] = False  # sample 1: keys 4 and 5 are padding
    masks = allow if kind == "bool" else torch.zeros(2, 6, 6).masked_fill(~allow, float("-inf"))
    for kernel in ("explicit", "fused"):
        attn = Attention(8, num_heads=2, kernel=kernel, lsa=True).eval()
        out = attn(x, mask=masks[:, None])  # (B, 1, N, N): broadcast over the heads
        for i in range(2):
            alone = attn(x[i : i + 1], mask=masks[i])
            tol = _attention_tol(attn, x, out)  # one sample: the products may take other kernels
            torch.testing.assert_close(out[i : i + 1], alone, rtol=0, atol=tol, msg=(kernel, i))


def test_lsa_without_qkv_bias_scales_only_the_query_weights() -> None:
    """With qkv_bias=False the temperature scales the query rows of the weight alone: scores are
    softmax(tau_h q k^T / sqrt(d_k)) from the bias-free projections, by hand."""
    torch.manual_seed(0)
    attn = Attention(8, num_heads=2, qkv_bias=False, kernel="explicit", lsa=True).eval()
    with torch.no_grad():
        attn.temperature.copy_(torch.tensor([2.0, 0.5]))
    x = torch.randn(1, 4, 8)
    _, weights = attn.forward_with_weights(x)
    q, k, _ = (x @ attn.qkv.weight.T).reshape(1, 4, 3, 2, 4).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-2, -1) / 4**0.5 * torch.tensor([2.0, 0.5])[:, None, None]
    by_hand = scores.masked_fill(torch.eye(4, dtype=torch.bool), float("-inf")).softmax(-1)
    # weights <= 1 from scores of 8 + 4 terms (the temperature applied before or after), 4 keys
    tol = sum_tol(F32, 8 + 4 + 4, max(1.0, scores.abs().max()))
    torch.testing.assert_close(weights, by_hand, rtol=0, atol=tol)


def test_lsa_refuses_a_mask_that_leaves_a_token_nothing() -> None:
    attn = Attention(8, num_heads=2, lsa=True)
    with pytest.raises(ValueError, match="causal mask"):  # token 0 may see only itself
        attn(torch.randn(1, 4, 8), mask=causal_mask(4))


LSA_EMPTY_ROW = (
    "with lsa=True each token's own key is masked, and the given mask leaves some tokens no other "
    "key (a causal mask does that to the first token): the softmax would be 0/0. Use lsa=False "
    "with causal masks, or allow every query another key."
)


@pytest.mark.parametrize("kernel", ["explicit", "fused"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_lsa_refusal_of_an_empty_row_says_why_and_what_to_do(kernel: str, kind: str) -> None:
    """A causal mask leaves token 0 only its own key, which LSA masks: refused word for word, for
    boolean and additive masks alike, though every other row still has keys."""
    attn = Attention(8, num_heads=2, kernel=kernel, lsa=True)
    causal = causal_mask(4)
    mask = causal if kind == "bool" else torch.zeros(4, 4).masked_fill(~causal, float("-inf"))
    with pytest.raises(ValueError) as caught:
        attn(torch.randn(1, 4, 8), mask=mask)
    assert str(caught.value) == LSA_EMPTY_ROW


def test_mimetic_init_writes_identity_structure_into_attention() -> None:
    torch.manual_seed(0)
    attn = Attention(96, num_heads=3)
    nn.init.trunc_normal_(attn.qkv.bias, std=0.5)  # biases are zeroed by the init
    attn.mimetic_init_(qk=(0.7, 0.7), vo=(0.4, 0.4))
    qk, vo = head_products(attn)
    off = ~torch.eye(96, dtype=torch.bool)
    for product in qk:  # rank head_dim approximation of 0.7 Z + 0.7 I: diagonal clearly positive
        assert torch.linalg.matrix_rank(product) == 32
        assert product.diagonal().mean() > 0.25 and product.diagonal().min() > 0
        assert product[off].abs().mean() < 0.25 * product.diagonal().mean()
    assert not torch.allclose(qk[0], qk[1])  # each head draws its own noise
    # full rank: W_v^T W_proj^T is 0.4 Z - 0.4 I exactly, so its diagonal sits at -0.4
    assert vo.diagonal().mean().item() == pytest.approx(-0.4, abs=0.03)
    assert vo[off].std().item() == pytest.approx(0.4 / 96**0.5, rel=0.15)
    assert attn.qkv.bias.abs().max() == 0 and attn.proj.bias.abs().max() == 0
    # a token's query now matches its own key best: self-attention dominates the diagonal
    x = F.layer_norm(torch.randn(1, 10, 96), (96,))
    with torch.no_grad():
        q, k, _ = attn._qkv(x)
    scores = q @ k.transpose(-2, -1)
    assert (scores.argmax(dim=-1) == torch.arange(10)).float().mean() > 0.9


def test_mimetic_init_follows_the_generator_and_its_scales() -> None:
    a, b = Attention(64, num_heads=2), Attention(64, num_heads=2)
    a.mimetic_init_(generator=torch.Generator().manual_seed(3))
    b.mimetic_init_(generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.qkv.weight, b.qkv.weight) and torch.equal(a.proj.weight, b.proj.weight)
    b.mimetic_init_(qk=(0.0, 1.0), vo=(0.0, 1.0), generator=torch.Generator().manual_seed(3))
    qk, vo = head_products(b)  # no noise: a projection on head_dim directions, and -I
    # float32 SVDs (orthogonal to about 64 eps) and products of 64 and 32 terms, entries <= 1
    torch.testing.assert_close(vo, -torch.eye(64), rtol=0, atol=sum_tol(F32, 2 * 64 + 32))
    # idempotent, a projection: one more product of 64 terms
    torch.testing.assert_close(qk[0] @ qk[0], qk[0], rtol=0, atol=sum_tol(F32, 3 * 64 + 32))


# --- vit/model/block.py: DropPath (stochastic depth), Mlp and Block -------------------------


def test_drop_path_drops_whole_samples_and_rescales_the_kept_ones() -> None:
    """Stochastic depth drops a residual branch per sample: each sample's output is either all
    zeros or its input / (1 - drop_prob), so the branch keeps its expected value."""
    torch.manual_seed(0)
    drop = DropPath(0.25)  # keep = 0.75
    x = torch.rand(64, 3, 5) + 1.0  # (B, N, C), no zero entries; B != N
    out = drop(x)
    assert out.shape == x.shape
    dropped = (out == 0).flatten(1).all(dim=1)  # (B,)
    kept = (out == x / 0.75).flatten(1).all(dim=1)  # x * 1 / keep is x / keep, bit for bit
    assert (dropped ^ kept).all()  # one or the other, for the whole sample
    assert 0 < dropped.sum() < 64


def test_drop_path_is_a_no_op_in_eval_and_at_rate_zero() -> None:
    """In evaluation, or at drop_prob 0, DropPath returns its input itself and draws nothing from
    the random stream, so a rate of 0 leaves a run's random numbers as they were."""
    x = torch.randn(4, 3, 5)
    state = torch.get_rng_state()
    assert DropPath(0.0)(x) is x  # training mode, rate 0
    assert DropPath()(x) is x  # the default rate is 0
    assert DropPath(0.5).eval()(x) is x
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("rate", [1.0, -0.1, 1.5])
def test_drop_path_refuses_a_rate_outside_0_to_1(rate: float) -> None:
    """At 1 every branch would be dropped, and the kept ones divided by 0 (NaN): refused, as is
    any rate that is no probability, naming the range and a usual value."""
    message = re.escape(
        f"DropPath drop_prob={rate} must be in [0, 1): the chance a sample's branch is dropped "
        "(0.1 is usual for a small ViT)."
    )
    with pytest.raises(ValueError, match=message):
        DropPath(rate)
    assert DropPath(0.99).drop_prob == 0.99 and DropPath(0.0).drop_prob == 0.0


def test_mlp_is_fc2_of_gelu_of_fc1_with_no_dropout_by_default() -> None:
    """Mlp's default drop is 0: even in training it is exactly fc2(GELU(fc1(x)))."""
    torch.manual_seed(0)
    mlp = Mlp(6, hidden_dim=12)  # training mode
    x = torch.randn(2, 3, 6)
    hidden = F.gelu(x @ mlp.fc1.weight.T + mlp.fc1.bias)  # (B, N, hidden_dim)
    expected = hidden @ mlp.fc2.weight.T + mlp.fc2.bias
    # the bias added in or after the product: sums of 6 + 1, then 12 + 1 terms
    tol = sum_tol(F32, 7 + 13, max(1.0, hidden.abs().max(), expected.abs().max()))
    torch.testing.assert_close(mlp(x), expected, rtol=0, atol=tol)


def _layer_norm_float64(x: torch.Tensor, norm: nn.LayerNorm, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, in float64."""
    var, mean = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
    return (x - mean) / (var + eps).sqrt() * norm.weight.double() + norm.bias.double()


@torch.no_grad()
def test_block_defaults_are_timms_pre_norm_block() -> None:
    """Block(dim, num_heads) by default is timm's: x + attn(LN(x)), then x + mlp(LN(x)), with
    LayerNorm eps 1e-6, a qkv bias, an MLP 4 x dim wide, no LSA and no dropout or drop path even
    in training, checked against a float64 reference. Inputs of std 1e-3 (variance 1e-6) make
    LayerNorm's eps matter: torch's default 1e-5 would scale the normalised values by ~0.4."""
    torch.manual_seed(0)
    block = Block(8, num_heads=2)  # training mode
    for norm in (block.norm1, block.norm2):
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
    assert block.mlp.fc1.out_features == 32 and block.attn.qkv.bias is not None
    x = 1e-3 * torch.randn(2, 5, 8)
    x64 = x.double()
    h = x64 + _attention_float64(block.attn, _layer_norm_float64(x64, block.norm1, 1e-6))
    m = block.mlp
    hidden = F.gelu(
        F.linear(
            _layer_norm_float64(h, block.norm2, 1e-6), m.fc1.weight.double(), m.fc1.bias.double()
        )
    )
    expected = h + F.linear(hidden, m.fc2.weight.double(), m.fc2.bias.double())
    # float32 against float64: two LayerNorms of 8, the attention's sums, an MLP of 8 and 32
    k = 2 * 8 + (2 * 8 + 4 + 2 * 5) + 8 + 32
    tol = sum_tol(torch.float32, k, max(1.0, hidden.abs().max(), expected.abs().max()))
    torch.testing.assert_close(block(x).double(), expected, rtol=0, atol=tol)
    assert not hasattr(block.attn, "temperature")  # lsa off


def test_block_passes_its_settings_to_its_parts() -> None:
    """Each Block argument reaches its part: num_heads, qkv_bias, kernel and lsa (a temperature
    per head) the attention; drop its output and both MLP dropouts; attn_drop the attention
    weights; mlp_ratio the MLP width; drop_path both residual branches."""
    block = Block(
        8,
        num_heads=4,
        mlp_ratio=2.0,
        qkv_bias=False,
        drop=0.1,
        attn_drop=0.2,
        drop_path=0.3,
        kernel="explicit",
        lsa=True,
    )
    attn = block.attn
    assert attn.num_heads == 4 and attn.head_dim == 2
    assert attn.qkv.bias is None and attn.kernel == "explicit"
    assert attn.temperature.shape == (4,)
    assert attn.proj_drop.p == block.mlp.drop1.p == block.mlp.drop2.p == 0.1
    assert attn.attn_drop == 0.2
    assert block.mlp.fc1.out_features == 16
    assert block.drop_path1.drop_prob == block.drop_path2.drop_prob == 0.3
