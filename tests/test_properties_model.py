"""Laws of the model side checked on generated inputs (hypothesis): attention weights, the two
causal masks, rollout, resizing positions, and the safetensors and timm round trips.

Inputs stay small and the examples few, so the file runs in seconds; `derandomize` makes every run
draw the same examples. Float64 where the law is exact in real arithmetic: the tolerances then
bound rounding (a few ulps of 1), far below what any wrong formula would give.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.helpers import forward_sums, sum_tol
from vit.io.load import export_safetensors
from vit.io.safetensors_file import load_safetensors
from vit.io.timm_interop import config_of, mlp_ratio_of
from vit.maps.rollout import rollout
from vit.model.attention import (
    Attention,
    causal_mask,
    mask_and_renormalize,
    scaled_dot_product_attention,
)
from vit.model.embed import resize_pos_embed
from vit.model.vision_transformer import VisionTransformer

needs_timm = pytest.mark.skipif(
    importlib.util.find_spec("timm") is None, reason='timm not installed: pip install -e ".[timm]"'
)
# derandomize: CI draws the same examples every run; database=None: nothing written to the checkout
LAW = settings(max_examples=40, deadline=None, derandomize=True, database=None)
ROUND_TRIP = settings(LAW, max_examples=20)  # each example builds and saves models

ROUNDING = 1e-12  # float64 sums of at most a few dozen terms in [0, 1]: errors near 1e-15


def _floats(shape: tuple[int, ...], low: float = -3.0, high: float = 3.0) -> st.SearchStrategy:
    """float64 tensors with entries in [low, high]: bounded, so no softmax underflows to 0/0."""
    elements = st.floats(low, high, allow_nan=False, allow_infinity=False)
    return hnp.arrays(np.float64, shape, elements=elements).map(torch.from_numpy)


@st.composite
def masks(draw: st.DrawFn, n: int, m: int, *, off_diagonal: bool = False) -> torch.Tensor:
    """A boolean (n, m) mask that leaves each query at least one key (off the diagonal if asked:
    locality self-attention masks the diagonal itself)."""
    mask = torch.from_numpy(draw(hnp.arrays(np.bool_, (n, m))))
    for i in range(n):
        keys = [j for j in range(m) if not (off_diagonal and j == i)]
        assume(keys)
        mask[i, draw(st.sampled_from(keys))] = True
    return mask


# ---- attention (vit/model/attention.py) --------------------------------------------------------


@st.composite
def attention_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """q (B, H, N, d), k and v (B, H, M, d), and no mask, a boolean one or an additive one."""
    b, h, n, m, d = (draw(st.integers(1, top)) for top in (2, 3, 5, 5, 6))
    q, k, v = draw(_floats((b, h, n, d))), draw(_floats((b, h, m, d))), draw(_floats((b, h, m, d)))
    kind = draw(st.sampled_from(["none", "bool", "additive"]))
    mask = None if kind == "none" else draw(masks(n, m))
    if kind == "additive":  # finite biases where allowed, -inf where blocked
        mask = draw(_floats((n, m), -2.0, 2.0)).masked_fill(~mask, float("-inf"))
    return dict(q=q, k=k, v=v, mask=mask)


@LAW
@given(attention_inputs())
def test_attention_rows_sum_to_one_and_blocked_keys_get_exactly_zero(inputs: dict) -> None:
    q, k, mask = inputs["q"], inputs["k"], inputs["mask"]
    _, weights = scaled_dot_product_attention(**inputs)
    assert weights.shape == (*q.shape[:-1], k.shape[-2])
    assert bool((weights >= 0).all())
    torch.testing.assert_close(
        weights.sum(-1), torch.ones(q.shape[:-1], dtype=q.dtype), rtol=0, atol=ROUNDING
    )
    if mask is not None:
        blocked = ~mask if mask.dtype == torch.bool else mask.isinf()
        assert bool((weights[..., blocked] == 0).all())  # exp(-inf) is exactly 0


@LAW
@given(
    b=st.integers(1, 2),
    n=st.integers(1, 5),
    heads=st.integers(1, 3),
    head_dim=st.integers(1, 4),
    lsa=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_multi_head_weights_rows_sum_to_one_for_any_head_count_and_mask(
    b: int, n: int, heads: int, head_dim: int, lsa: bool, seed: int, data: st.DataObject
) -> None:
    """Attention's own weights, (B, H, N, N): its projections and head split keep the law."""
    assume(not lsa or n > 1)  # with lsa a lone token has no key but itself (a ValueError)
    torch.manual_seed(seed)
    attn = Attention(heads * head_dim, num_heads=heads, lsa=lsa).double().eval()
    mask = data.draw(st.none() | masks(n, n, off_diagonal=lsa))
    x = data.draw(_floats((b, n, heads * head_dim)))
    _, weights = attn.forward_with_weights(x, mask=mask)
    assert weights.shape == (b, heads, n, n)
    torch.testing.assert_close(
        weights.sum(-1), torch.ones(b, heads, n, dtype=x.dtype), rtol=0, atol=ROUNDING
    )
    if mask is not None:
        assert bool((weights[..., ~mask] == 0).all())
    if lsa:
        assert bool((weights.diagonal(dim1=-2, dim2=-1) == 0).all())  # no token attends to itself


@LAW
@given(
    shape=st.tuples(st.integers(1, 2), st.integers(1, 5), st.integers(1, 5), st.integers(1, 6)),
    extra=st.integers(1, 6),
    data=st.data(),
)
def test_scores_are_scaled_by_one_over_sqrt_dk(
    shape: tuple[int, int, int, int], extra: int, data: st.DataObject
) -> None:
    """Zero channels appended to q and k leave q k^T as is but raise d_k to d + extra: the same
    weights as q scaled by sqrt(d / (d + extra)) at d_k = d. Holds for 1/sqrt(d_k) alone."""
    b, n, m, d = shape
    q, k = data.draw(_floats((b, n, d))), data.draw(_floats((b, m, d)))
    v = torch.zeros(b, m, 1, dtype=q.dtype)
    pad = torch.zeros(b, 1, extra, dtype=q.dtype)
    _, padded = scaled_dot_product_attention(
        torch.cat([q, pad.expand(b, n, extra)], -1), torch.cat([k, pad.expand(b, m, extra)], -1), v
    )
    _, scaled = scaled_dot_product_attention(q * (d / (d + extra)) ** 0.5, k, v)
    torch.testing.assert_close(padded, scaled, rtol=0, atol=ROUNDING)


@LAW
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6)), data=st.data())
def test_both_causal_methods_agree_and_are_zero_above_the_diagonal(
    shape: tuple[int, int, int], data: st.DataObject
) -> None:
    """-inf before the softmax == zero after it and renormalise (softmax's denominator cancels).
    Bounded scores: a blocked score ~700 above the allowed ones would underflow the second
    method's kept weights to 0 (then 0/0); in real arithmetic the two are equal everywhere."""
    b, n, d = shape
    q, k, v = (data.draw(_floats((b, n, d))) for _ in range(3))
    mask = causal_mask(n)
    _, before = scaled_dot_product_attention(q, k, v, mask=mask)
    after = mask_and_renormalize(scaled_dot_product_attention(q, k, v)[1], mask)
    for weights in (before, after):
        assert bool((weights.triu(diagonal=1) == 0).all())
        torch.testing.assert_close(
            weights.sum(-1), torch.ones(b, n, dtype=q.dtype), rtol=0, atol=ROUNDING
        )
    torch.testing.assert_close(after, before, rtol=ROUNDING, atol=ROUNDING)


# ---- rollout (vit/maps/rollout.py) ---------------------------------------------------------------


@st.composite
def rollout_options(draw: st.DrawFn, depth: int) -> dict[str, Any]:
    return dict(
        head_fusion=draw(st.sampled_from(["mean", "max", "min"])),
        discard_ratio=draw(st.floats(0.0, 0.99)),
        start_layer=draw(st.integers(0, depth - 1)),
        num_prefix_tokens=draw(st.integers(0, 1)),
    )


@LAW
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(1, 3), st.integers(2, 6)),
    data=st.data(),
)
def test_rollout_rows_sum_to_one(shape: tuple[int, int, int, int], data: st.DataObject) -> None:
    """For any non-negative per-layer maps: the identity added per layer keeps each row's sum
    positive, and the renormalisation then makes it 1 through every product."""
    depth, b, h, n = shape
    maps = [data.draw(_floats((b, h, n, n), 0.0, 1.0)) for _ in range(depth)]
    joint = rollout(maps, **data.draw(rollout_options(depth)))
    assert joint.shape == (b, n, n) and bool((joint >= 0).all())
    torch.testing.assert_close(
        joint.sum(-1), torch.ones(b, n, dtype=joint.dtype), rtol=0, atol=ROUNDING
    )


@LAW
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(1, 3), st.integers(2, 6)),
    data=st.data(),
)
def test_identity_attention_gives_identity_rollout(
    shape: tuple[int, int, int, int], data: st.DataObject
) -> None:
    """Every token attending only to itself: (I + I) / 2 = I per layer, exactly, whatever the
    head fusion, the discarded share (a zeroed diagonal plus the residual is 1 again) or start."""
    depth, b, h, n = shape
    eye = torch.eye(n, dtype=torch.float64).expand(b, h, n, n)
    joint = rollout([eye.clone() for _ in range(depth)], **data.draw(rollout_options(depth)))
    assert torch.equal(joint, torch.eye(n, dtype=torch.float64).expand(b, n, n))


# ---- positions (vit/model/embed.py) ----------------------------------------------------------------


@LAW
@given(
    prefix=st.integers(0, 2),
    grid=st.integers(1, 5),
    new_grid=st.integers(1, 6),
    dim=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    data=st.data(),
)
def test_resizing_positions_to_the_same_grid_is_exact(
    prefix: int, grid: int, new_grid: int, dim: int, dtype: torch.dtype, data: st.DataObject
) -> None:
    """Same grid: the table itself, in every dtype (a float32 interpolation would round float64).
    Another grid: the prefix (CLS) rows untouched, new_grid^2 patch rows."""
    table = data.draw(_floats((1, prefix + grid * grid, dim))).to(dtype)
    assert torch.equal(resize_pos_embed(table, new_grid=grid, num_prefix_tokens=prefix), table)
    resized = resize_pos_embed(table, new_grid=new_grid, num_prefix_tokens=prefix)
    assert resized.shape == (1, prefix + new_grid * new_grid, dim) and resized.dtype == dtype
    assert torch.equal(resized[:, :prefix], table[:, :prefix])


# ---- round trips (vit/io/) ----------------------------------------------------------------------


@st.composite
def small_configs(draw: st.DrawFn, *, timm: bool = False) -> dict[str, Any]:
    """Constructor arguments of a small VisionTransformer; `timm`: only what timm can express
    (no lsa or spt), plus in_chans, which vit-train's network config does not carry."""
    heads, head_dim, patch = (
        draw(st.integers(1, 3)),
        draw(st.integers(1, 5)),
        draw(st.integers(1, 4)),
    )
    dim = heads * head_dim
    class_token = draw(st.booleans())
    cfg = dict(
        img_size=patch * draw(st.integers(1, 3)),
        patch_size=patch,
        num_classes=draw(st.integers(1, 5)),
        embed_dim=dim,
        depth=draw(st.integers(1, 2)),
        num_heads=heads,
        mlp_ratio=draw(st.floats(1.0, 4.0)),
        qkv_bias=draw(st.booleans()),
        class_token=class_token,
        global_pool=draw(st.sampled_from(["token", "avg"])) if class_token else "avg",
        pos_embed=draw(st.sampled_from(["learned", "sincos"])) if dim % 2 == 0 else "learned",
    )
    if timm:
        return {**cfg, "in_chans": draw(st.integers(1, 4))}
    # a lone token under lsa has no key but itself: the constructor refuses that model
    lsa = draw(st.booleans()) and (class_token or cfg["img_size"] > patch)
    return {**cfg, "lsa": lsa, "spt": patch >= 2 and draw(st.booleans())}


def _random_model(cfg: dict[str, Any], seed: int) -> VisionTransformer:
    """The model of `cfg` with every parameter drawn from N(0, 1): no init value can hide a
    swapped or dropped tensor. Buffers (a fixed sin-cos table) stay as built."""
    model = VisionTransformer(**cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def _images(model: VisionTransformer, seed: int) -> torch.Tensor:
    side, chans = model.patch_embed.img_size, model.patch_embed.in_chans
    return torch.randn(2, chans, side, side, generator=torch.Generator().manual_seed(seed))


def _assert_same_state(got: torch.nn.Module, want: torch.nn.Module) -> None:
    got_state, want_state = got.state_dict(), want.state_dict()
    assert list(got_state) == list(want_state)
    for key, value in want_state.items():
        assert got_state[key].dtype == value.dtype and torch.equal(got_state[key], value), key


@settings(LAW, max_examples=300)  # one division each: cheap, and rare widths need many draws
@given(dim=st.integers(1, 1024), hidden=st.integers(1, 4096))
def test_mlp_ratio_of_gives_back_every_mlp_width(dim: int, hidden: int) -> None:
    """config_of records an MLP's width as mlp_ratio, which our Block and timm's turn back into
    int(dim * mlp_ratio): hidden / dim alone falls one short for some pairs (7, 61)."""
    assert int(dim * mlp_ratio_of(dim, hidden)) == hidden


@ROUND_TRIP
@given(cfg=small_configs(), seed=st.integers(0, 2**16))
def test_safetensors_round_trip_is_exact(cfg: dict[str, Any], seed: int) -> None:
    """A vit-train checkpoint of any small model -> export_safetensors -> load_safetensors: the
    same architecture, the same tensors bit for bit, the same logits bit for bit."""
    model = _random_model(cfg, seed)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "m.ckpt"
        state = {f"model.{k}": v for k, v in model.state_dict().items()}
        network = {"preset": "vit_nano", **cfg}
        torch.save({"state_dict": state, "hyper_parameters": {"network": network}}, ckpt)
        loaded = load_safetensors(export_safetensors(ckpt, Path(tmp) / "m.safetensors"))
    assert config_of(loaded) == config_of(model)
    _assert_same_state(loaded, model)
    x = _images(model, seed)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


@needs_timm
@ROUND_TRIP
@given(cfg=small_configs(timm=True), seed=st.integers(0, 2**16))
def test_timm_round_trip_is_exact(cfg: dict[str, Any], seed: int) -> None:
    """Ours -> timm -> ours: the same tensors and logits bit for bit (a sin-cos table comes back
    learned, holding the same values: timm has learned positions only); timm's logits agree."""
    from vit.io.timm_interop import from_timm, to_timm

    model = _random_model(cfg, seed)
    theirs = to_timm(model)
    back = from_timm(theirs)
    assert config_of(back) == {**config_of(model), "pos_embed": "learned"}
    _assert_same_state(back, model)
    x = _images(model, seed)
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
        # the same function in another library's code: float32 rounding in another order
        expected = model(x)
        tol = sum_tol(torch.float32, forward_sums(model), max(1.0, expected.abs().max()))
        torch.testing.assert_close(theirs(x), expected, rtol=0, atol=tol)
