"""VisionTransformer: shapes, config errors, both attention paths, gradients, overfitting, purity."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from tests.helpers import TINY, forward_sums, head_products, load_script, sum_tol
from vit.model.embed import (
    PatchEmbed,
    keep_index,
    resize_pos_embed,
    sincos_2d_table,
    sinusoidal_table,
    take_patches,
)
from vit.model.vision_transformer import PRESETS, VisionTransformer, create_model

F32 = torch.float32


def test_forward_shapes_and_timm_names(tiny_model: VisionTransformer) -> None:
    x = torch.randn(3, 3, 32, 32)
    assert tiny_model(x).shape == (3, 10)
    assert tiny_model.forward_features(x).shape == (3, 1 + 16, 32)
    names = set(tiny_model.state_dict())
    for name in (
        "cls_token",
        "pos_embed",
        "patch_embed.proj.weight",
        "blocks.0.norm1.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.weight",
        "blocks.1.norm2.bias",
        "blocks.1.mlp.fc1.weight",
        "blocks.1.mlp.fc2.weight",
        "norm.weight",
        "head.weight",
    ):
        assert name in names


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_build_and_run(preset: str) -> None:
    model = create_model(preset)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_create_model_applies_the_overrides() -> None:
    model = create_model("vit_nano", depth=1, num_classes=3)
    assert len(model.blocks) == 1 and model.head.out_features == 3


def test_vit_tiny_matches_the_benchmark_size() -> None:
    n = sum(p.numel() for p in create_model("vit_tiny").parameters())
    assert 2.6e6 < n < 2.8e6  # width 192, depth 6, MLP 768, patch 4: "about 2.7 M"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(img_size=32, patch_size=5), "not divisible by patch_size=5"),
        (dict(patch_size=64), "larger than img_size"),
        (dict(embed_dim=30, num_heads=4), "not divisible by num_heads=4"),
        (dict(depth=0), "depth=0 must be a positive integer"),
        (dict(num_classes=-1), "num_classes=-1"),
        (dict(drop_rate=1.5), "drop_rate=1.5 must be in"),
        (dict(patch_drop_rate=1.0), "patch_drop_rate=1.0 must be in \\[0, 1\\)"),
        (dict(mlp_ratio=0), "mlp_ratio=0"),
        (dict(global_pool="token", class_token=False), "needs class_token=True"),
        (
            dict(img_size=8, patch_size=8, class_token=False, global_pool="avg", lsa=True),
            "lsa=True needs at least 2 tokens",
        ),
        (dict(pos_embed="rotary"), "pos_embed='rotary'"),
        (dict(attn_init="xavier"), "attn_init='xavier' must be one of"),
        (dict(pos_init="zeros"), "pos_init='zeros' must be one of"),
        (dict(pos_init="sincos2d", pos_embed="sincos"), "use pos_embed='learned' with it"),
        (dict(pos_init="sincos2d", embed_dim=30, num_heads=3), "divisible by 4, got embed_dim=30"),
    ],
)
def test_bad_config_fails_at_construction(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VisionTransformer(**{**TINY, **overrides})


@pytest.mark.parametrize(
    ("img_size", "patch_size", "sizes"),
    [(32, 5, "2, 4, 8, 16"), (30, 4, "2, 3, 5, 6, 10, 15"), (31, 2, "1, 31")],
)
def test_a_patch_that_does_not_divide_the_image_names_the_sizes_that_do(
    img_size: int, patch_size: int, sizes: str
) -> None:
    # the sizes between 1 and the image itself that tile it; a prime image has only those two
    expected = f"Pick a patch_size that divides {img_size}: {sizes}."
    with pytest.raises(ValueError, match=f"patch_size={patch_size}:.*{re.escape(expected)}$"):
        PatchEmbed(img_size=img_size, patch_size=patch_size)


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="unknown preset 'vit_huge'.*vit_tiny"):
        create_model("vit_huge")


@pytest.mark.parametrize("shape", [(2, 1, 32, 32), (2, 3, 28, 28), (3, 32, 32), (2, 3, 32, 48)])
def test_wrong_input_shape_names_the_expected_shape(tiny_model, shape) -> None:
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 3, 32, 32\)"):
        tiny_model(torch.randn(*shape))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool])
def test_pixels_not_yet_floats_name_the_conversion(tiny_model, dtype) -> None:
    images = torch.zeros(2, 3, 32, 32, dtype=dtype)  # the right shape: only the type is wrong
    with pytest.raises(ValueError, match=f"expected float images.*got {dtype}.*preprocess") as e:
        tiny_model(images)
    assert str(e.value) == (  # whole: what was expected, and the call that converts
        f"expected float images, normalised as the model was trained, got {dtype}. Convert uint8 "
        "pixels with vit.data.datasets.preprocess(images, normalization) (the normalization a "
        "checkpoint records: vit.data.datasets.recorded_normalization)."
    )
    tiny_model(images.float())  # the same batch as floats runs


@pytest.mark.parametrize("kernel", ["explicit", "fused"])
def test_forward_with_attention_equals_forward(kernel: str) -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**TINY, kernel=kernel).eval()
    x = torch.randn(4, 3, 32, 32)
    logits, maps = model.forward_with_attention(x)
    # the explicit path against the kernel's, the last block's CLS row alone: every sum's order
    tol = sum_tol(F32, forward_sums(model), max(1.0, logits.abs().max()))
    torch.testing.assert_close(logits, model(x), rtol=0, atol=tol)
    assert len(maps) == TINY["depth"]
    for w in maps:
        assert w.shape == (4, TINY["num_heads"], 17, 17)
        assert torch.all(w >= 0)
        ones = torch.ones(4, TINY["num_heads"], 17)
        torch.testing.assert_close(w.sum(-1), ones, rtol=0, atol=sum_tol(F32, 2 * 17))  # softmax


@pytest.mark.parametrize("lsa", [False, True])
@pytest.mark.parametrize("kernel", ["explicit", "fused"])
def test_cls_only_last_block_gives_the_full_forward_logits_and_gradients(
    kernel: str, lsa: bool
) -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "depth": 3}, kernel=kernel, lsa=lsa)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    grads = []
    for forward in (model, lambda x: model.forward_head(model.forward_features(x))):
        model.zero_grad()
        logits = forward(x)
        torch.nn.functional.cross_entropy(logits, y).backward()
        grads.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (fast, fast_grads), (full, full_grads) = grads
    # the last block's CLS row alone takes other products: every sum's order may change
    k = forward_sums(model)
    torch.testing.assert_close(fast, full, rtol=0, atol=sum_tol(F32, k, max(1.0, full.abs().max())))
    for a, b in zip(fast_grads, full_grads, strict=True):
        # backward: the forward's sums again and the batch's 4 x 17 tokens, per tensor's largest
        torch.testing.assert_close(a, b, rtol=0, atol=sum_tol(F32, 2 * k + 4 * 17, b.abs().max()))


def test_lsa_model_has_a_temperature_per_head_and_block_and_no_self_attention() -> None:
    model = VisionTransformer(**TINY, lsa=True)
    temps = [n for n, _ in model.named_parameters() if n.endswith("attn.temperature")]
    assert len(temps) == TINY["depth"] and model.blocks[0].attn.temperature.shape == (2,)
    _, maps = model.forward_with_attention(torch.randn(2, 3, 32, 32))
    for w in maps:
        assert (w.diagonal(dim1=-2, dim2=-1) == 0).all()
    assert not hasattr(VisionTransformer(**TINY).blocks[0].attn, "temperature")


def test_every_parameter_gets_a_gradient(tiny_model: VisionTransformer) -> None:
    tiny_model(torch.randn(2, 3, 32, 32)).sum().backward()
    for name, p in tiny_model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_patch_embed_conv_equals_rearrange_and_linear() -> None:
    torch.manual_seed(0)
    pe = PatchEmbed(img_size=32, patch_size=4, in_chans=3, embed_dim=16)
    x = torch.randn(2, 3, 32, 32)
    patches = rearrange(x, "b c (gh p1) (gw p2) -> b (gh gw) (c p1 p2)", p1=4, p2=4)
    weight = pe.proj.weight.reshape(16, -1)  # (D, C*p*p), same (c, p1, p2) order
    # a convolution against a product: sums of 48 terms and the bias, in another order
    scale = (patches.abs() @ weight.abs().T + pe.proj.bias.abs()).max()
    torch.testing.assert_close(
        pe(x), patches @ weight.T + pe.proj.bias, rtol=0, atol=sum_tol(F32, 48 + 1, scale)
    )


def _shift(x: Tensor, dx: int, dy: int) -> Tensor:
    """x moved dx pixels right and dy down (negative: left, up), zeros where nothing moved in."""
    out = torch.zeros_like(x)
    h, w = x.shape[-2:]
    out[..., max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = x[
        ..., max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


@pytest.mark.parametrize("size", [32, 16])  # 16: a low-resolution stage of the curriculum
def test_spt_is_layernorm_then_linear_of_the_image_and_its_four_diagonal_shifts(size: int) -> None:
    torch.manual_seed(0)
    pe = PatchEmbed(img_size=32, patch_size=4, embed_dim=16, dynamic_img_size=True, spt=True)
    with torch.no_grad():
        pe.norm.weight.uniform_(0.5, 1.5)
        pe.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, size, size)
    shifted = [x] + [_shift(x, dx, dy) for dx, dy in ((2, 2), (-2, 2), (2, -2), (-2, -2))]
    patches = rearrange(
        torch.cat(shifted, 1), "b c (gh p1) (gw p2) -> b (gh gw) (c p1 p2)", p1=4, p2=4
    )
    normed = F.layer_norm(patches, (5 * 3 * 4 * 4,), pe.norm.weight, pe.norm.bias)
    assert pe(x).shape == (2, (size // 4) ** 2, 16)
    # the same LayerNorm; the linear's sums of 240 terms and the bias in another order
    w, b = pe.proj.weight, pe.proj.bias
    tol = sum_tol(F32, 240 + 1, (normed.abs() @ w.abs().T + b.abs()).max())
    torch.testing.assert_close(pe(x), normed @ w.T + b, rtol=0, atol=tol)


def test_spt_tokens_see_the_pixels_around_their_patch() -> None:
    """A pixel one step outside a patch reaches its token with spt, and never without."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, 32)
    poked = x.clone()
    poked[..., 4, 8] += 1.0  # row 4, column 8: patch (1, 2), just below-right of patch (0, 1)
    for spt in (False, True):
        pe = PatchEmbed(img_size=32, patch_size=4, embed_dim=16, spt=spt)
        changed = (pe(poked) - pe(x)).abs().sum(-1) > 0  # (1, 64): which tokens moved
        assert changed[0, 1 * 8 + 2]  # its own patch, either way
        assert changed[0, 0 * 8 + 1] == spt  # the neighbour, through the up-left shifted copy


def test_spt_model_trains_every_parameter_and_needs_a_patch_to_shift() -> None:
    model = VisionTransformer(**TINY, spt=True)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    with pytest.raises(ValueError, match="patch_size >= 2"):
        VisionTransformer(**{**TINY, "patch_size": 1}, spt=True)
    with pytest.raises(ValueError, match="patch_size >= 2"):
        PatchEmbed(img_size=32, patch_size=1, spt=True)


@pytest.mark.parametrize("spt", [False, True])
def test_patch_dropout_keeps_cls_and_a_random_subset_of_each_images_positioned_patches(
    spt: bool,
) -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**TINY, patch_drop_rate=0.5, spt=spt)  # 16 patches of 8x8, 8 kept
    x = torch.randn(4, 3, 32, 32, requires_grad=True)
    full = model.eval().embed(x).detach()  # evaluation: every token, as without the option
    assert full.shape == (4, 17, 32)
    kept = model.train().embed(x)
    assert kept.shape == (4, 9, 32)
    assert torch.equal(kept[:, 0], full[:, 0])  # the CLS token always stays
    # a kept token is its patch's token of the full sequence: the embedding's rows computed
    # among fewer rows, so equal up to the rounding of one sum per entry (5*3*8*8 terms with spt)
    fan_in = model.patch_embed.proj.weight[0].numel()
    tol = sum_tol(F32, fan_in, full.abs().max())
    subsets = []
    for image in range(4):  # each kept token is one of the image's own patch tokens, none twice
        gap = (kept[image, 1:, None] - full[image, None, 1:]).abs().amax(-1)  # (8 kept, 16)
        match = gap <= tol
        assert match.sum(-1).tolist() == [1] * 8
        subsets.append(frozenset(match.int().argmax(-1).tolist()))
        assert len(subsets[-1]) == 8
    assert len(set(subsets)) > 1  # drawn per image, not one subset for the batch
    if not spt:  # a dropped patch's pixels reach nothing: 8 of 16 patches get an input gradient
        model(x).sum().backward()  # (with spt a kept neighbour's shifted copies still see them)
        per_patch = rearrange(x.grad.abs(), "b c (h p) (w q) -> b (h w) (c p q)", p=8, q=8)
        assert (per_patch.sum(-1) > 0).sum(-1).tolist() == [8] * 4


@pytest.mark.parametrize("spt", [False, True])
def test_patch_dropout_embeds_only_the_kept_patches_with_spt(spt: bool) -> None:
    """With spt the dropped patches never reach the norm and the projection (the work scales
    with the kept patches); a stride-p convolution embeds every patch, then keeps some."""
    model = VisionTransformer(**TINY, patch_drop_rate=0.5, spt=spt).train()
    rows = []
    model.patch_embed.proj.register_forward_hook(lambda m, args, out: rows.append(out.shape))
    model(torch.randn(4, 3, 32, 32))
    assert rows == [(4, 8, 32) if spt else (4, 32, 4, 4)]


@pytest.mark.parametrize("spt", [False, True])
def test_patch_dropout_trains_as_if_every_patch_were_embedded_then_dropped(spt: bool) -> None:
    """Dropping before the embedding is the same function as embedding every patch, adding the
    positions and then dropping (timm's order): the same loss and gradients for the same draw."""
    torch.manual_seed(0)
    model = VisionTransformer(**TINY, patch_drop_rate=0.5, spt=spt).train()
    x = torch.randn(4, 3, 32, 32)
    torch.manual_seed(1)
    model(x).square().sum().backward()
    early = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    # the order before, as scripts/recipe_step.py's drop-after variants time it
    load_script("recipe_step").embed_every_patch_then_drop(model)
    torch.manual_seed(1)
    model(x).square().sum().backward()
    for name, p in model.named_parameters():
        # the patch embedding's weight gradients sum over the kept rows instead of every row
        # with zeros at the dropped ones: another order of the same sums of 4 * 16 rows at most,
        # scaled by the largest entry (seeds 0-4 differ by 1.1-1.8 eps of it; conv path: 0)
        tol = sum_tol(F32, 4 * 16, p.grad.abs().amax())
        torch.testing.assert_close(early[name], p.grad, rtol=0, atol=tol, msg=name)


def test_keep_index_edge_rates_and_shared_rows() -> None:
    assert keep_index(2, 4, 0.0) is None  # nothing dropped: every patch, as without the option
    assert keep_index(2, 4, 0.99).shape == (2, 1)  # at least one patch stays
    keep = keep_index(3, 5, 0.5)
    assert keep.shape == (3, 2) and all(len(set(row)) == 2 for row in keep.tolist())
    table = torch.arange(10.0).view(1, 5, 2)  # one row per patch, shared by the batch
    assert torch.equal(take_patches(table, keep), table[0][keep])
    with pytest.raises(ValueError, match="rate 1.0 must be in \\[0, 1\\)"):
        keep_index(2, 4, 1.0)


def test_keep_index_draws_on_the_given_device() -> None:
    # meta stands in for a GPU: the random order is drawn there, not from the CPU generator
    # (a CPU draw would need a copy to the GPU, and gather would refuse a CPU index)
    state = torch.get_rng_state()
    keep = keep_index(2, 16, 0.5, device="meta")
    assert keep.shape == (2, 8) and keep.device.type == "meta"
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("spt", [False, True])
def test_patch_dropout_draws_on_the_models_device(spt: bool) -> None:
    # the model on meta, as on a GPU: the kept patches are drawn there, none from the CPU's
    # generator (a CPU index would not gather a meta or GPU tensor's rows)
    model = VisionTransformer(**TINY, patch_drop_rate=0.5, spt=spt).to("meta").train()
    state = torch.get_rng_state()
    tokens = model.embed(torch.zeros(2, 3, 32, 32, device="meta"))
    assert tokens.shape == (2, 9, 32) and tokens.device.type == "meta"
    assert torch.equal(torch.get_rng_state(), state)


def test_sinusoidal_table_values() -> None:
    table = sinusoidal_table(50, 8)
    assert table.shape == (50, 8)
    assert torch.equal(table[0], torch.tensor([0.0, 1, 0, 1, 0, 1, 0, 1]))  # sin 0, cos 0: exact
    pos, i = 7, 1  # PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...)
    angle = torch.tensor(pos / 10000 ** (2 * i / 8))
    # float32 angle and sine against the float64 table rounded once: two roundings of values <= 1
    torch.testing.assert_close(table[pos, 2 * i], angle.sin(), rtol=0, atol=sum_tol(F32, 2))
    torch.testing.assert_close(table[pos, 3], angle.cos(), rtol=0, atol=sum_tol(F32, 2))
    with pytest.raises(ValueError, match="even width"):
        sinusoidal_table(4, 5)


def test_position_tables_are_exact_to_float32_rounding() -> None:
    """Both tables are computed in float64 and rounded once: angles up to pos * 1 lose digits in
    float32 (a float32 frequency is off by up to ~1e-6 at position 64)."""
    half_ulp = 2.0**-24  # float32 rounding of values in [-1, 1]

    def sinusoid(pos: int, j: int, dim: int) -> float:  # the paper's formula, PE[pos, j]
        angle = pos / 10000.0 ** ((j - j % 2) / dim)
        return math.sin(angle) if j % 2 == 0 else math.cos(angle)

    expected = torch.tensor(
        [[sinusoid(pos, j, 192) for j in range(192)] for pos in range(65)], dtype=torch.float64
    )
    assert (sinusoidal_table(65, 192).double() - expected).abs().max() <= half_ulp
    freqs = [10000.0 ** (-k / 48) for k in range(48)]  # a quarter of 192 each
    rows = []
    for y in range(8):
        for x in range(8):
            rows.append(
                [math.sin(x * w) for w in freqs]
                + [math.cos(x * w) for w in freqs]
                + [math.sin(y * w) for w in freqs]
                + [math.cos(y * w) for w in freqs]
            )
    expected = torch.tensor(rows, dtype=torch.float64)
    assert (sincos_2d_table(8, 192).double() - expected).abs().max() <= half_ulp


def test_sincos_2d_table_builds_without_warnings() -> None:
    # torch.meshgrid warns when its indexing is left implicit, but only once per process unless
    # warn_always is on: an earlier test must not hide it
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sincos_2d_table(4, 8)
    finally:
        torch.set_warn_always(before)


def test_sincos_model_has_fixed_positions() -> None:
    model = VisionTransformer(**TINY, pos_embed="sincos")
    assert "pos_embed" not in dict(model.named_parameters())
    assert torch.equal(model.pos_embed[0], sinusoidal_table(17, 32))  # the table itself


def test_sincos_2d_table_values() -> None:
    table = sincos_2d_table(3, 8)  # 3x3 grid, a quarter of 8 = 2 frequencies: 1 and 1/100
    assert table.shape == (9, 8)
    row, col = 2, 1  # patch 7 of a 3x3 grid, row by row
    x = torch.tensor([col * 1.0, col / 100.0])
    y = torch.tensor([row * 1.0, row / 100.0])
    expected = torch.cat([x.sin(), x.cos(), y.sin(), y.cos()])
    # float32 angles and sines against the float64 table rounded once: two roundings, values <= 1
    torch.testing.assert_close(table[row * 3 + col], expected, rtol=0, atol=sum_tol(F32, 2))
    assert torch.equal(table[0], torch.tensor([0.0, 0, 1, 1, 0, 0, 1, 1]))  # sin 0, cos 0: exact
    # neighbours across rows are as close as neighbours along a row: a 2-D table, not 1-D
    along, across = (table[4] - table[3]).norm(), (table[4] - table[1]).norm()
    # the same differences in other places: norms of 8 squares, summed in another order
    torch.testing.assert_close(along, across, rtol=sum_tol(F32, 8), atol=0)
    assert (table[4] - table[0]).norm() > along  # farther apart, less alike
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d_table(4, 6)


def test_sincos2d_pos_init_starts_a_learned_table_at_the_2d_table() -> None:
    model = VisionTransformer(**TINY, pos_init="sincos2d")
    assert isinstance(model.pos_embed, torch.nn.Parameter) and model.pos_embed.requires_grad
    assert torch.equal(model.pos_embed[0, 0], torch.zeros(32))  # the CLS entry
    assert torch.equal(model.pos_embed[0, 1:], sincos_2d_table(4, 32))  # the table, copied
    torch.manual_seed(0)
    default = VisionTransformer(**TINY)
    torch.manual_seed(0)
    other = VisionTransformer(**TINY, pos_init="sincos2d")
    assert torch.equal(default.blocks[0].attn.qkv.weight, other.blocks[0].attn.qkv.weight)
    assert default.pos_embed.std() < 0.03  # timm's: std 0.02 noise
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert model.pos_embed.grad is not None and model.pos_embed.grad.abs().sum() > 0


def test_init_weights_rejects_an_unknown_init(tiny_model: VisionTransformer) -> None:
    with pytest.raises(ValueError, match="pos_init='sincos'"):
        tiny_model.init_weights(pos_init="sincos")


def test_mean_pooling_without_class_token() -> None:
    model = VisionTransformer(**TINY, class_token=False, global_pool="avg")
    assert model.forward_features(torch.randn(2, 3, 32, 32)).shape == (2, 16, 32)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_resize_pos_embed_keeps_cls_and_interpolates() -> None:
    pos = torch.randn(1, 1 + 16, 8)
    bigger = resize_pos_embed(pos, new_grid=6)
    assert bigger.shape == (1, 37, 8)
    assert torch.equal(bigger[:, 0], pos[:, 0])
    assert torch.equal(resize_pos_embed(pos, new_grid=4), pos)


def test_resize_pos_embed_samples_bicubic_at_half_pixel_centres() -> None:
    # 4x4 -> 2x2: output cell i sits at source coordinate 2i + 0.5 (align_corners=False, as timm
    # and PIL resize), between cells 2i and 2i+1. Keys' cubic (a = -0.75, PyTorch's) weighs the
    # neighbours at distances 1.5, 0.5, 0.5, 1.5 by -3/32, 19/32, 19/32, -3/32; the edge repeats.
    # On the ramp 0, 1, 2, 3: (0*-3 + 0*19 + 1*19 + 2*-3)/32 and (1*-3 + 2*19 + 3*19 + 3*-3)/32.
    ramp = torch.tensor([13 / 32, 83 / 32])
    rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij")
    table = torch.stack([cols, 10 * rows], dim=-1).reshape(1, 16, 2)  # channel 0: column, 1: row
    pos = torch.cat([torch.tensor([[[7.0, -7.0]]]), table], dim=1)
    small = resize_pos_embed(pos, new_grid=2)
    new_rows, new_cols = torch.meshgrid(ramp, ramp, indexing="ij")
    expected = torch.stack([new_cols, 10 * new_rows], dim=-1).reshape(1, 4, 2)
    # exact: the weights (-3/32, 19/32), the values and their sums are short binary fractions
    assert torch.equal(small, torch.cat([pos[:, :1], expected], dim=1))


def test_resize_pos_embed_rejects_a_table_that_is_not_a_square_grid() -> None:
    pos = torch.randn(1, 1 + 15, 8)  # 15 patch entries: no g x g grid
    message = "position table has 15 patch entries, not a square grid."
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        resize_pos_embed(pos, new_grid=4)


def test_set_patch_drop_takes_rates_in_0_to_1_and_refuses_1(tiny_model: VisionTransformer) -> None:
    tiny_model.set_patch_drop(0.75)
    assert tiny_model.patch_drop_rate == 0.75
    for rate in (1.0, 1.5, -0.1):  # dropping every patch (1.0) leaves nothing to attend to
        message = f"patch_drop_rate={rate} must be in [0, 1): the fraction dropped."
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            tiny_model.set_patch_drop(rate)
    assert tiny_model.patch_drop_rate == 0.75  # a refused rate changes nothing


def test_state_dict_round_trip_is_exact(tiny_model: VisionTransformer) -> None:
    other = VisionTransformer(**TINY)
    other.load_state_dict(tiny_model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(other.eval()(x), tiny_model.eval()(x))


def test_mimetic_attn_init_reaches_every_block_and_only_attention() -> None:
    torch.manual_seed(0)
    default = VisionTransformer(**TINY)
    torch.manual_seed(0)
    mimetic = VisionTransformer(**TINY, attn_init="mimetic")
    for a, b in zip(default.blocks, mimetic.blocks, strict=True):
        qk = head_products(b.attn)[0][0]
        assert qk.diagonal().mean() > 0.2  # the default init's is ~0 (std 0.02 weights)
        assert head_products(a.attn)[0][0].diagonal().mean() < 0.01
        assert torch.equal(a.mlp.fc1.weight, b.mlp.fc1.weight)  # the rest is timm's init
    assert torch.equal(default.head.weight, mimetic.head.weight)
    x = torch.randn(2, 3, 32, 32)
    assert mimetic(x).shape == (2, 10) and torch.isfinite(mimetic(x)).all()


def test_tiny_model_overfits_a_tiny_batch(tiny_model: VisionTransformer) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(16, 3, 32, 32), torch.arange(16) % 10
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(tiny_model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    assert (tiny_model(x).argmax(-1) == y).all()


@pytest.mark.parametrize(
    ("modules", "forbidden"),
    [
        # the model, attention maps and checkpoint tools lift into any training loop
        (
            "vit vit.model vit.maps vit.maps.explorer vit.io.load vit.io.migrate vit.io.pretrained "
            "vit.io.timm_interop vit.data.datasets vit.data.folder_source vit.data.cifar10_source "
            "vit.data.loader vit.train.evaluation",
            ("lightning", "torchmetrics", "pytorch_lightning", "timm"),
        ),
        (
            "vit.data.augment",
            ("lightning", "torchvision", "PIL"),
        ),  # batched augmentation: torch only
    ],
)
def test_library_imports_stay_light(modules: str, forbidden: tuple[str, ...]) -> None:
    code = (
        f"import sys\nimport {', '.join(modules.split())}\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {forbidden!r}]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dynamic_img_size_takes_smaller_grids_and_trains_the_one_position_table() -> None:
    torch.manual_seed(0)
    strict = VisionTransformer(**TINY)
    dynamic = VisionTransformer(**TINY, dynamic_img_size=True)
    dynamic.load_state_dict(strict.state_dict())
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(dynamic(x), strict(x))  # at its own size: the same ops, bit for bit
    small = torch.randn(2, 3, 16, 16)  # a 2x2 grid instead of 4x4
    with pytest.raises(ValueError, match="expected images of shape"):
        strict(small)
    dynamic(small).sum().backward()
    assert dynamic.pos_embed.grad is not None and dynamic.pos_embed.grad[:, 1:].abs().sum() > 0
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 3, 32, 32\)"):
        dynamic(torch.randn(2, 3, 20, 20))  # not whole patches


@pytest.mark.parametrize(
    "shape",
    [(2, 3, 16, 32), (2, 3, 32, 16), (2, 3, 20, 20), (2, 1, 16, 16), (3, 16, 16)],
)  # not square either way round, not whole patches, another channel count, no batch dim
def test_dynamic_patch_embed_takes_only_square_whole_patch_images(shape: tuple) -> None:
    embed = PatchEmbed(img_size=32, patch_size=8, in_chans=3, embed_dim=16, dynamic_img_size=True)
    assert embed(torch.randn(2, 3, 16, 16)).shape == (2, 4, 16)  # a 2x2 grid
    message = (
        f"expected images of shape (B, 3, 32, 32), got {shape}. Resize or convert the input, or "
        "build the model with img_size/in_chans matching it (checkpoints can be loaded at "
        "another image size)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        embed(torch.randn(*shape))


@pytest.mark.parametrize(
    ("class_token", "embed_dim"),
    [(True, 32), (False, 32), (True, 16)],  # 16: as wide as the 4x4 grid has patches
)
def test_dynamic_embed_adds_the_bicubic_resized_table_to_a_smaller_grid(
    class_token: bool, embed_dim: int
) -> None:
    """At a 2x2 grid the tokens are the patch vectors (after CLS, if any) plus the position table
    with its patch part resized bicubically from 4x4 and its prefix part kept: however many
    prefix tokens there are, and whatever the width."""
    torch.manual_seed(0)
    model = VisionTransformer(
        **{**TINY, "embed_dim": embed_dim},
        class_token=class_token,
        global_pool="token" if class_token else "avg",
        dynamic_img_size=True,
    ).eval()
    with torch.no_grad():
        model.pos_embed.normal_()  # a table whose resizing shows
    x = torch.randn(2, 3, 16, 16)
    prefix = 1 if class_token else 0
    pos = model.pos_embed.detach()
    grid = pos[:, prefix:].reshape(1, 4, 4, embed_dim).permute(0, 3, 1, 2)  # (1, D, 4, 4)
    grid = F.interpolate(grid, size=(2, 2), mode="bicubic", align_corners=False)
    table = torch.cat([pos[:, :prefix], grid.permute(0, 2, 3, 1).reshape(1, 4, embed_dim)], 1)
    with torch.no_grad():
        tokens = model.patch_embed(x)
        if class_token:
            tokens = torch.cat([model.cls_token.expand(2, 1, embed_dim), tokens], 1)
        assert torch.equal(model.embed(x), tokens + table)  # the same ops, bit for bit
    assert model(x).shape == (2, 10)


def test_patch_dropout_without_class_token_treats_every_token_as_a_patch() -> None:
    """With no prefix token all 16 tokens are patches: rate 0.9 keeps int(16 * 0.1) = 1 of them,
    drawn per image from all 16, the first as droppable as any other."""
    torch.manual_seed(0)
    model = VisionTransformer(**TINY, class_token=False, global_pool="avg", patch_drop_rate=0.9)
    x = torch.randn(8, 3, 32, 32)
    full = model.eval().embed(x)
    kept = model.train().embed(x)
    assert kept.shape == (8, 1, 32)
    match = (kept[:, :, None] == full[:, None]).all(-1)  # (8, 1 kept, 16 tokens)
    assert match.sum(-1).tolist() == [[1]] * 8  # each kept token is one of the image's own
    assert len(set(match[:, 0].int().argmax(-1).tolist())) > 1  # not always the same token


@pytest.mark.parametrize("spt", [False, True])
def test_patch_projection_starts_lecun_normal(spt: bool) -> None:
    """The patch projection is a linear map of a flattened patch of fan_in = C*p*p values
    (5*C*p*p with spt): its weights start with std sqrt(1 / fan_in), its bias at zero."""
    torch.manual_seed(0)
    proj = VisionTransformer(**TINY, spt=spt).patch_embed.proj
    fan_in = (5 if spt else 1) * 3 * 8 * 8
    expected = (1.0 / fan_in) ** 0.5
    assert proj.weight.numel() == 32 * fan_in
    assert abs(proj.weight.std().item() / expected - 1) < 0.05  # 6144+ draws: ~1% spread
    assert torch.equal(proj.bias, torch.zeros(32))


def test_init_weights_defaults_are_timms_init(tiny_model: VisionTransformer) -> None:
    """init_weights() with no arguments redraws timm's init: std 0.02 noise for the positions
    (not the 2-D table), the CLS entry included, linear biases at zero."""
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.fill_(1.0)
    tiny_model.init_weights()
    pos = tiny_model.pos_embed[0]
    assert abs(pos.std().item() / 0.02 - 1) < 0.1  # 544 draws: ~3% spread; the table's ~0.7
    assert pos[0].abs().sum() > 0  # noise at the CLS entry too, which sincos2d leaves at zero
    assert torch.equal(tiny_model.head.bias, torch.zeros(10))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(global_pool="max"), "global_pool='max' must be 'token' or 'avg'."),
        (
            dict(global_pool="token", class_token=False),
            "global_pool='token' needs class_token=True; use global_pool='avg'.",
        ),
        (
            dict(attn_init="xavier"),
            "attn_init='xavier' must be one of ('default', 'mimetic') ('mimetic' starts each "
            "attention near the structure trained ViTs show; 'default' is timm's init).",
        ),
        (
            dict(pos_init="zeros"),
            "pos_init='zeros' must be one of ('trunc_normal', 'sincos2d') ('sincos2d' starts the "
            "learned position table at the 2-D sine-cosine table; 'trunc_normal' is timm's init).",
        ),
        (  # one patch (6 // 4: the 4-pixel patch fits once) and no class token
            dict(img_size=6, patch_size=4, class_token=False, global_pool="avg", lsa=True),
            "lsa=True needs at least 2 tokens, but this model has 1 (one patch, no class token); "
            "use a smaller patch_size, class_token=True, or lsa=False.",
        ),
    ],
)
def test_bad_config_messages_word_for_word(overrides: dict, message: str) -> None:
    """What a user reads when a name or a combination is refused: the value, the choices and
    the fix, as written."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        VisionTransformer(**{**TINY, **overrides})


def test_lsa_takes_two_tokens_whether_patches_or_a_class_token() -> None:
    """LSA masks each token's own score, so it needs a second token to attend to: one patch and
    the class token are enough, as are two by two patches without it."""
    one_patch = VisionTransformer(**{**TINY, "img_size": 8, "patch_size": 8, "lsa": True})
    assert one_patch(torch.zeros(1, 3, 8, 8)).shape == (1, 10)
    no_cls = dict(img_size=16, patch_size=8, class_token=False, global_pool="avg", lsa=True)
    assert VisionTransformer(**{**TINY, **no_cls})(torch.zeros(1, 3, 16, 16)).shape == (1, 10)


def test_model_and_patch_embedding_defaults() -> None:
    """VisionTransformer() is ViT-Tiny's width at depth 6 (192 wide, 3 heads, MLP 4x) for CIFAR
    (32 x 32, patch 4, 10 classes); PatchEmbed() embeds those patches at that width."""
    model = VisionTransformer()
    assert (model.embed_dim, len(model.blocks), model.blocks[0].attn.num_heads) == (192, 6, 3)
    assert model.blocks[0].mlp.fc1.out_features == 4 * 192
    embed = PatchEmbed()
    assert (embed.img_size, embed.patch_size, embed.in_chans) == (32, 4, 3)
    assert embed.dynamic_img_size is False and embed.proj.out_channels == 192


def test_the_blocks_take_the_models_bias_dropout_and_drop_path_settings() -> None:
    """qkv_bias, drop_rate, attn_drop_rate and drop_path_rate (a linear rise over the depth) and
    in_chans reach each block's layers and the patch projection."""
    model = VisionTransformer(
        **{**TINY, "depth": 3},
        qkv_bias=False,
        drop_rate=0.1,
        attn_drop_rate=0.2,
        drop_path_rate=0.3,
        in_chans=1,
    )
    assert model.patch_embed.proj.in_channels == 1
    for block, rate in zip(model.blocks, [0.0, 0.15, 0.3], strict=True):
        assert block.attn.qkv.bias is None
        assert block.mlp.drop1.p == block.mlp.drop2.p == 0.1
        assert block.attn.attn_drop == 0.2
        assert block.drop_path1.drop_prob == pytest.approx(rate)


@pytest.mark.parametrize("name", ["img_size", "patch_size", "in_chans", "embed_dim"])
def test_patch_embedding_refuses_a_size_below_one_naming_it(name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}=0 must be a positive integer.$"):
        PatchEmbed(**{name: 0})


def test_spt_refuses_a_one_pixel_patch_word_for_word() -> None:
    """Shifting by half a patch needs a patch of 2 pixels or more."""
    message = (
        "spt=True shifts the image by half a patch, which needs patch_size >= 2; got "
        "patch_size=1. Use a larger patch or spt=False."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        PatchEmbed(patch_size=1, spt=True)
