"""vit.maps.inspection against hand-made cases and from-scratch loops: attention distance, the
patch filters' principal components, the position vectors' similarity."""

from __future__ import annotations

import math
import re

import pytest
import torch

from tests.helpers import TINY
from vit.maps.capture import attention_maps
from vit.maps.inspection import (
    attention_distance,
    cls_share,
    filter_components,
    mean_attention_distance,
    patch_distances,
    patch_filters,
    position_similarity,
)
from vit.model.vision_transformer import VisionTransformer

F64_TOL = 1e-12  # float64 sums of at most a few thousand terms of size <= 10


def _grid_points(grid: tuple[int, int]) -> list[tuple[int, int]]:
    return [(r, c) for r in range(grid[0]) for c in range(grid[1])]


def test_patch_distances_are_centre_to_centre_in_patches() -> None:
    d = patch_distances((2, 3))
    points = _grid_points((2, 3))
    expected = torch.tensor([[math.dist(a, b) for b in points] for a in points], dtype=d.dtype)
    assert torch.equal(d.diagonal(), torch.zeros(6))
    torch.testing.assert_close(d, expected, rtol=0, atol=F64_TOL)
    assert d[0, 5] == pytest.approx(math.sqrt(1 + 4))  # (0, 0) to (1, 2)


def _weights(rows: torch.Tensor, *, prefix: int) -> torch.Tensor:
    """(1, 1, N, N) weights from (P, P) patch-to-patch rows; prefix rows and columns zero."""
    p = rows.shape[0]
    w = torch.zeros(1, 1, prefix + p, prefix + p, dtype=torch.float64)
    w[0, 0, prefix:, prefix:] = rows
    return w


@pytest.mark.parametrize("prefix", [0, 1])
def test_a_head_on_its_own_patch_has_distance_zero(prefix: int) -> None:
    w = _weights(torch.eye(9, dtype=torch.float64), prefix=prefix)
    assert attention_distance([w], grid=(3, 3), num_prefix_tokens=prefix).item() == 0.0


@pytest.mark.parametrize("grid", [(3, 3), (4, 4), (2, 5)])
def test_uniform_attention_has_the_grids_mean_pairwise_distance(grid: tuple[int, int]) -> None:
    points = _grid_points(grid)
    n = 1 + len(points)  # the CLS key takes its share too: left out, the rest renormalised
    w = torch.full((2, 3, n, n), 1 / n)
    expected = sum(math.dist(a, b) for a in points for b in points) / len(points) ** 2
    got = attention_distance([w, w], grid=grid)
    assert got.shape == (2, 3)
    torch.testing.assert_close(got, torch.full((2, 3), expected, dtype=torch.float64))
    torch.testing.assert_close(
        cls_share([w], num_prefix_tokens=1), torch.full((1, 3), 1 / n, dtype=torch.float64)
    )


def test_distance_is_the_weighted_mean_over_queries_and_images() -> None:
    # image 0: every patch attends to its right neighbour (the last column to itself) -> the
    # mean over 3 columns is 2/3; image 1: 3/4 on the patch below (wrapping to row 0), 1/4 on
    # itself -> each row moves 1 except the last, which moves 2 rows: (1 + 1 + 2) / 3 * 3/4 = 1
    grid, points = (3, 3), _grid_points((3, 3))
    right = torch.zeros(9, 9, dtype=torch.float64)
    below = torch.zeros(9, 9, dtype=torch.float64)
    for i, (r, c) in enumerate(points):
        right[i, points.index((r, min(c + 1, 2)))] = 1.0
        below[i, points.index(((r + 1) % 3, c))] += 0.75
        below[i, i] += 0.25
    w = torch.cat([_weights(right, prefix=1), _weights(below, prefix=1)])
    got = attention_distance([w], grid=grid).item()
    assert got == pytest.approx((2 / 3 + 1.0) / 2, abs=F64_TOL)


def test_mean_attention_distance_matches_a_loop_over_images_and_heads() -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "patch_size": 8}).eval()
    images = torch.randn(5, 3, 32, 32)
    result = mean_attention_distance(model, images, batch_size=2)  # batches of 2, 2, 1
    # the maps of the same chunks: float32 kernels may round a batch of 5 differently from one
    # of 2 (MKL's AVX2 products do), and the float64 bound below covers only the sums after
    with torch.inference_mode():
        chunks = [attention_maps(model, chunk)[1] for chunk in images.split(2)]
    maps = [torch.cat(per_layer) for per_layer in zip(*chunks, strict=True)]
    points = _grid_points((4, 4))
    expected = torch.zeros(TINY["depth"], TINY["num_heads"], dtype=torch.float64)
    for layer, w in enumerate(maps):
        for b in range(5):
            for h in range(TINY["num_heads"]):
                for q in range(16):
                    row = w[b, h, 1 + q, 1:].double()
                    d = sum(row[k] * math.dist(points[q], points[k]) for k in range(16))
                    expected[layer, h] += d / row.sum() / (5 * 16)
    torch.testing.assert_close(result.patches, expected, rtol=0, atol=F64_TOL)
    share = torch.stack([w[:, :, 1:, 0].double().mean(dim=(0, 2)) for w in maps])  # on CLS
    torch.testing.assert_close(result.cls_share, share, rtol=0, atol=F64_TOL)
    torch.testing.assert_close(result.pixels, expected * 8, rtol=0, atol=8 * F64_TOL)
    assert result.images == 5 and result.patch_size == 8
    assert result.uniform == pytest.approx(patch_distances((4, 4)).mean().item())
    assert not model.training  # left in eval mode, as given


def test_mean_attention_distance_restores_training_mode_and_refuses_no_images() -> None:
    model = VisionTransformer(**TINY).train()
    mean_attention_distance(model, torch.randn(2, 3, 32, 32))
    assert model.training
    with pytest.raises(ValueError, match=re.escape("expected a non-empty batch (B, C, H, W)")):
        mean_attention_distance(model, torch.randn(0, 3, 32, 32))


def test_filter_components_find_a_hand_made_direction() -> None:
    # every filter is the mean plus a multiple of one RGB pattern v: one component, all variance
    torch.manual_seed(0)
    model = VisionTransformer(**TINY)
    conv = model.patch_embed.proj
    v = torch.randn(3, 8, 8)
    scales = torch.randn(conv.weight.shape[0], 1, 1, 1)
    with torch.no_grad():
        conv.weight.copy_(0.3 + scales * v)
    comps, ratio = filter_components(model, k=4)
    assert comps.shape == (4, 1, 3, 8, 8) and ratio.shape == (4,)
    unit = (v / v.norm()).double()
    unit = unit * torch.sign(unit.flatten()[unit.abs().argmax()])  # the largest entry positive
    torch.testing.assert_close(comps[0, 0], unit, rtol=0, atol=1e-6)  # float32 weights
    assert ratio[0].item() == pytest.approx(1.0, abs=1e-10)


def test_filter_components_equal_the_covariance_eigenvectors() -> None:
    torch.manual_seed(1)
    model = VisionTransformer(**{**TINY, "patch_size": 4, "embed_dim": 64})
    flat = model.patch_embed.proj.weight.detach().double().flatten(1)  # (64, 48)
    centred = flat - flat.mean(0)
    values, vectors = torch.linalg.eigh(centred.T @ centred)  # ascending
    comps, ratio = filter_components(model, k=5)
    torch.testing.assert_close(ratio, (values.flip(0) / values.sum())[:5], rtol=1e-9, atol=0)
    for i in range(5):
        u = vectors[:, -1 - i]
        got = comps[i].flatten()
        assert got[got.abs().argmax()] > 0
        assert abs(float(got @ u)) == pytest.approx(1.0, abs=1e-9)  # equal up to sign


def test_filters_fold_the_shifted_tokens_norm_and_keep_its_layout() -> None:
    torch.manual_seed(2)
    model = VisionTransformer(**{**TINY, "spt": True})
    embed = model.patch_embed
    with torch.no_grad():
        embed.norm.weight.copy_(torch.rand_like(embed.norm.weight) + 0.5)
    filters = patch_filters(model)
    assert filters.shape == (32, 5, 3, 8, 8)
    folded = embed.proj.weight.detach().double() * embed.norm.weight.detach().double()
    assert torch.equal(filters.flatten(1), folded)
    x = torch.randn(1, 3, 32, 32)
    patches = embed._shifted_patches(x).reshape(1, 16, 5, 3, 8, 8)  # the filters' layout
    assert torch.equal(patches[0, 0, 0], x[0, :, :8, :8])  # shift 0 is the image itself
    with pytest.raises(ValueError, match=re.escape("k=0 components: ask for at least 1.")):
        filter_components(model, k=0)


def test_position_similarity_hand_made_and_against_a_loop() -> None:
    model = VisionTransformer(**TINY)  # 4 x 4 grid, 16 positions of width 32
    with torch.no_grad():
        model.pos_embed.zero_()
        model.pos_embed[0, 1:17, :16] = torch.eye(16)  # one-hot positions: orthogonal
    assert torch.equal(position_similarity(model), torch.eye(16, dtype=torch.float64))
    torch.manual_seed(3)
    with torch.no_grad():
        model.pos_embed.normal_()
        model.pos_embed[0, 2] = 3 * model.pos_embed[0, 1]  # positions 0 and 1: one direction
    sim = position_similarity(model)
    pos = model.pos_embed.detach()[0, 1:].double()
    expected = torch.tensor(
        [[torch.cosine_similarity(a, b, dim=0).item() for b in pos] for a in pos],
        dtype=torch.float64,
    )
    torch.testing.assert_close(sim, expected, rtol=0, atol=1e-12)
    assert sim[0, 1].item() == pytest.approx(1.0, abs=1e-12)


def test_position_similarity_without_a_class_token_uses_every_row() -> None:
    model = VisionTransformer(**{**TINY, "class_token": False, "global_pool": "avg"})
    sim = position_similarity(model)
    assert sim.shape == (16, 16)
    pos = model.pos_embed.detach()[0].double()
    torch.testing.assert_close(sim[3, 7], torch.cosine_similarity(pos[3], pos[7], dim=0))


def test_filter_components_take_one_and_stop_at_the_number_of_filters() -> None:
    model = VisionTransformer(**TINY)  # 32 filters of 3 x 8 x 8 = 192 numbers
    one, ratio = filter_components(model, k=1)
    assert one.shape == (1, 1, 3, 8, 8) and ratio.shape == (1,)
    comps, ratio = filter_components(model, k=40)  # more than 32 filters have components
    assert comps.shape[0] == ratio.shape[0] == 32
    assert ratio.sum().item() == pytest.approx(1.0, abs=1e-12)  # all the variance, once


def test_cls_share_reads_one_prefix_token_by_default() -> None:
    w = torch.zeros(1, 1, 3, 3)  # a CLS token and two patches
    w[0, 0, 1:] = torch.tensor([0.25, 0.75, 0.0])  # each patch query: 0.25 on CLS, 0.75 on patch 1
    torch.testing.assert_close(cls_share([w]), torch.tensor([[0.25]], dtype=torch.float64))


def test_without_a_class_token_no_weight_is_left_out() -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "class_token": False, "global_pool": "avg"})
    images = torch.randn(3, 3, 32, 32)
    result = mean_attention_distance(model, images)
    assert torch.equal(result.cls_share, torch.zeros(TINY["depth"], TINY["num_heads"]).double())
    with torch.inference_mode():
        maps = attention_maps(model.eval(), images)[1]
    expected = attention_distance(maps, grid=(4, 4), num_prefix_tokens=0)
    torch.testing.assert_close(result.patches, expected, rtol=0, atol=F64_TOL)


def test_filter_components_default_to_the_papers_28() -> None:
    comps, ratio = filter_components(VisionTransformer(**TINY))  # 32 filters: 28 of them
    assert comps.shape == (28, 1, 3, 8, 8) and ratio.shape == (28,)


def test_a_grid_that_does_not_match_the_tokens_is_named() -> None:
    w = torch.full((1, 1, 17, 17), 1 / 17)  # a CLS token and 16 patches
    message = "16 patch tokens, but grid (3, 5) has 15."
    with pytest.raises(ValueError, match=re.escape(message)):
        attention_distance([w], grid=(3, 5))
