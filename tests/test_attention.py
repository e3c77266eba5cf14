"""Attention math against the tutorials' worked numbers and torch.nn.MultiheadAttention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import head_products
from vit.model.attention import (
    Attention,
    causal_mask,
    default_kernel,
    mask_and_renormalize,
    scaled_dot_product_attention,
)


def test_softmax_worked_example() -> None:
    """The tutorials' scores [4.0, -1.0, 2.1] -> weights [0.8648, 0.0058, 0.1294], through our
    function: with d_k = 4 a query 2 e_0 scores key j as 2 k_j0 / sqrt(4) = k_j0, so a missing or
    wrong 1/sqrt(d_k), or a softmax over the wrong axis, gives other numbers."""
    q = torch.tensor([[2.0, 0.0, 0.0, 0.0]])  # (N=1, d_k=4)
    k = torch.tensor([[4.0, 0.3, -0.7, 1.1], [-1.0, 2.0, 0.5, -0.2], [2.1, -1.5, 0.9, 0.4]])
    v = torch.eye(3)  # each key's value is its one-hot: the context is the weights themselves
    ctx, weights = scaled_dot_product_attention(q, k, v)
    expected = torch.tensor([[0.8648, 0.0058, 0.1294]])
    assert torch.allclose(weights, expected, atol=1e-4)
    assert torch.allclose(ctx, expected, atol=1e-4)


def test_hello_shiny_sun_context_vector() -> None:
    """Plain dot-product attention (no projections, no scaling) over three 3-d embeddings."""
    x = torch.tensor([[0.34, 0.22, 0.54], [0.53, 0.34, 0.98], [0.29, 0.54, 0.93]])
    scores = x @ x.T
    weights = scores.softmax(dim=-1)
    context = weights @ x
    assert torch.allclose(context[1], torch.tensor([0.399, 0.386, 0.861]), atol=1e-3)
    # the library function computes the same thing once its 1/sqrt(d_k) scale is undone
    ctx, w = scaled_dot_product_attention(x * 3**0.5, x, x)
    assert torch.allclose(ctx, context, atol=1e-6)
    assert torch.allclose(w.sum(dim=-1), torch.ones(3))


def test_scaled_dot_product_matches_formula_and_torch() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    ctx, w = scaled_dot_product_attention(q, k, v)
    expected_w = (q @ k.transpose(-1, -2) / 8**0.5).softmax(-1)
    assert w.shape == (2, 3, 5, 7)
    assert torch.allclose(w, expected_w, atol=1e-6)
    assert torch.allclose(ctx, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=1e-5)


def test_causal_mask_two_ways_agree() -> None:
    """-inf above the diagonal before softmax == mask the weights and renormalise the rows."""
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 6, 16), torch.randn(4, 6, 16), torch.randn(4, 6, 16)
    mask = causal_mask(6)
    _, w_inf = scaled_dot_product_attention(q, k, v, mask=mask)
    _, w_plain = scaled_dot_product_attention(q, k, v)
    w_renorm = mask_and_renormalize(w_plain, mask)
    assert torch.allclose(w_inf, w_renorm, atol=1e-6)
    assert torch.all(w_inf.triu(diagonal=1) == 0)  # nothing above the diagonal
    assert torch.allclose(w_inf.sum(-1), torch.ones(4, 6))
    # an additive mask (-inf) is the same as the boolean one
    additive = torch.zeros(6, 6).masked_fill(~mask, float("-inf"))
    _, w_add = scaled_dot_product_attention(q, k, v, mask=additive)
    assert torch.allclose(w_add, w_inf)


def test_attention_dropout_drops_weights_only_in_training() -> None:
    torch.manual_seed(0)
    q = k = v = torch.randn(2, 10, 8)
    ctx_eval, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=False)
    ctx_ref, _ = scaled_dot_product_attention(q, k, v)
    assert torch.equal(ctx_eval, ctx_ref)
    ctx_train, w_train = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=True)
    assert not torch.allclose(ctx_train, ctx_ref)
    assert torch.allclose(w_train.sum(-1), torch.ones(2, 10))  # returned weights: before dropout


def test_attention_dropout_defaults_to_training_and_rescales_the_kept_weights() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(2, 16, 8), torch.randn(2, 16, 8)
    v = torch.eye(16)  # one-hot values: the context is the (dropped) weights themselves
    ctx, w = scaled_dot_product_attention(q, k, v, dropout_p=0.25)  # training=True by default
    kept = ctx != 0
    assert 0 < (~kept).sum() < ctx.numel()
    assert torch.allclose(ctx[kept], w[kept] / 0.75)  # inverted dropout at the rate asked for


def test_forward_with_weights_drops_weights_as_forward_does() -> None:
    torch.manual_seed(0)
    attn = Attention(16, num_heads=2, attn_drop=0.5, kernel="explicit")
    x = torch.randn(2, 7, 16)
    torch.manual_seed(1)
    dropped = attn(x)
    torch.manual_seed(1)
    out, _ = attn.forward_with_weights(x)
    assert torch.allclose(out, dropped, atol=1e-6)
    attn.eval()
    clean = attn(x)
    assert not torch.allclose(out, clean, atol=1e-3)  # training did drop weights
    assert torch.allclose(attn.forward_with_weights(x)[0], clean, atol=1e-6)  # evaluation: none


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
    assert torch.allclose(ours(x, mask=mask), expected, atol=1e-5)
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.allclose(weights, ref_w, atol=1e-6)


def test_fused_equals_explicit() -> None:
    torch.manual_seed(0)
    fused = Attention(48, num_heads=3, kernel="fused")
    explicit = Attention(48, num_heads=3, kernel="explicit")
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(4, 65, 48)
    assert torch.allclose(fused(x), explicit(x), atol=1e-5)
    with_weights, _ = fused.forward_with_weights(x)
    assert torch.allclose(with_weights, fused(x), atol=1e-5)


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
    """bf16 keeps 8 significant bits: each rounding of a value is off by at most 2^-9 of it.
    The qkv product, the scores, the softmax, the context and the output projection round in
    turn, so each path is held to 4 x 2^-8 of the output's largest entry (measured: about 1x);
    a computation without 1/sqrt(d_k) misses by over 10x that bound, so the bound can tell."""
    torch.manual_seed(0)
    fused = Attention(48, num_heads=3, kernel="fused").to(torch.bfloat16)
    explicit = Attention(48, num_heads=3, kernel="explicit").to(torch.bfloat16)
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(4, 65, 48, dtype=torch.bfloat16)
    reference = _attention_float64(fused, x)
    bound = 4 * 2**-8 * reference.abs().max()
    outputs = {
        "fused": fused(x),
        "explicit": explicit(x),
        "forward_with_weights": fused.forward_with_weights(x)[0],
    }
    for name, out in outputs.items():
        assert out.dtype == torch.bfloat16
        error = (out.double() - reference).abs().max()
        assert error <= bound, (name, error.item(), bound.item())
    unscaled = (_attention_float64(fused, x, scale=False) - reference).abs().max()
    assert unscaled > 10 * bound, (unscaled.item(), bound.item())


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
    for q in (1, 3):
        rows = attn(x, mask=mask, num_queries=q)
        assert rows.shape == (2, q, 16)
        assert torch.allclose(rows, full[:, :q], atol=1e-6)


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)], ids=["2d", "3d", "4d"])
def test_mask_self_equals_a_mask_without_the_diagonal_and_keeps_gradients(
    lead: tuple[int, ...],
) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(*lead, 6, 4, requires_grad=True) for _ in range(3))  # any leading dims
    no_self = ~torch.eye(6, dtype=torch.bool)
    ctx, weights = scaled_dot_product_attention(q, k, v, mask_self=True)
    ctx_ref, weights_ref = scaled_dot_product_attention(q, k, v, mask=no_self)
    assert torch.allclose(weights, weights_ref) and torch.allclose(ctx, ctx_ref)
    (grad,) = torch.autograd.grad(ctx.sum(), q)
    (grad_ref,) = torch.autograd.grad(ctx_ref.sum(), q)
    assert torch.allclose(grad, grad_ref, atol=1e-6)


def test_lsa_masks_the_diagonal_and_scales_scores_by_a_trained_temperature() -> None:
    torch.manual_seed(0)
    attn = Attention(16, num_heads=2, kernel="explicit", lsa=True).eval()
    with torch.no_grad():
        attn.temperature.copy_(torch.tensor([0.5, 3.0]))
    x = torch.randn(2, 5, 16)
    out, weights = attn.forward_with_weights(x)
    assert torch.equal(weights.diagonal(dim1=-2, dim2=-1), torch.zeros(2, 2, 5))  # no self
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 5))
    # by hand: softmax(tau_h q k^T / sqrt(d_k)) with -inf on the diagonal, per head
    q, k, _ = (x @ attn.qkv.weight.T + attn.qkv.bias).reshape(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-2, -1) / 8**0.5 * torch.tensor([0.5, 3.0])[:, None, None]
    by_hand = scores.masked_fill(torch.eye(5, dtype=torch.bool), float("-inf")).softmax(-1)
    assert torch.allclose(weights, by_hand, atol=1e-6)
    assert torch.allclose(attn(x), out, atol=1e-6)
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
    assert torch.allclose(full, out, atol=1e-5)
    assert (weights.diagonal(dim1=-2, dim2=-1) == 0).all()
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 7), atol=1e-5)
    if mask is not None:
        assert (weights[..., 5:] == 0).all()  # the given mask still holds
    rows = attn(x, mask=given, num_queries=3)
    assert torch.allclose(rows, full[:, :3], atol=1e-6)


def test_lsa_refuses_a_mask_that_leaves_a_token_nothing() -> None:
    attn = Attention(8, num_heads=2, lsa=True)
    with pytest.raises(ValueError, match="causal mask"):  # token 0 may see only itself
        attn(torch.randn(1, 4, 8), mask=causal_mask(4))


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
    assert torch.allclose(vo, -torch.eye(64), atol=1e-5)
    assert torch.allclose(qk[0] @ qk[0], qk[0], atol=1e-5)  # idempotent: a projection
