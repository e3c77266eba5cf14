"""Batched TrivialAugment and RandAugment: each op equals torchvision's per-image result, the
magnitude tables are torchvision's, and the draws are per image."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.transforms import v2

from vit.data.trivial_augment import (
    OPS,
    SIGNED,
    apply_op,
    magnitudes,
    rand_augment_batch,
    rand_magnitudes,
    trivial_augment_batch,
)


def reference(op: str, image: torch.Tensor, m: float) -> torch.Tensor:
    """torchvision's TrivialAugmentWide op on one image, at magnitude m (its own code path)."""
    return v2.TrivialAugmentWide()._apply_image_or_video_transform(
        image, op, m, interpolation=v2.InterpolationMode.NEAREST, fill={torch.Tensor: None}
    )


def images(n: int = 24, side: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=g)
    x[0] = 7  # a flat image: autocontrast's and equalize's edge case
    x[1, :, :, : side // 2] = 255  # strong edges for sharpness and the geometric ops
    return x


@pytest.mark.parametrize("op", OPS)
def test_each_op_equals_torchvision_per_image(op: str) -> None:
    x = images()
    table = magnitudes(op)
    g = torch.Generator().manual_seed(1)
    if table is None:
        m = torch.zeros(len(x))
    else:  # every bin appears, both signs for signed ops
        m = table[torch.arange(len(x)) % len(table)]
        if op in SIGNED:
            m = torch.where(torch.rand(len(x), generator=g) < 0.5, -m, m)
    out = apply_op(op, x, m)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    for i in range(len(x)):
        ref = reference(op, x[i], float(m[i]))
        diff = (out[i].int() - ref.int()).abs()
        # blends round like torchvision's up to fused multiply-add: at most 1 grey level apart
        assert diff.max() <= (1 if op in ("Brightness", "Color", "Contrast", "Sharpness") else 0), (
            op,
            float(m[i]),
            int(diff.max()),
        )
        assert (diff == 0).float().mean() > 0.99, (op, float(m[i]))


def test_magnitude_tables_are_torchvisions() -> None:
    space = v2.TrivialAugmentWide._AUGMENTATION_SPACE
    assert tuple(space) == OPS
    for op, (fn, signed) in space.items():
        ref, ours = fn(31, 32, 32), magnitudes(op)
        assert (ref is None) == (ours is None), op
        if ref is not None:
            assert torch.equal(ref.float(), ours.float()), op
        assert signed == (op in SIGNED), op


def test_draws_are_per_image_seeded_and_cover_every_op() -> None:
    x = images(n=512, side=16)
    a = trivial_augment_batch(x, generator=torch.Generator().manual_seed(3))
    b = trivial_augment_batch(x, generator=torch.Generator().manual_seed(3))
    c = trivial_augment_batch(x, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    changed = (a != x).flatten(1).any(1).float().mean()
    # 1/14 of images draw Identity and some draws are no-ops (magnitude 0, posterize 8 bits)
    assert 0.75 < changed < 1.0
    assert torch.equal(x, images(n=512, side=16))  # the input is not modified


def test_rotate_by_90_degrees_is_rot90() -> None:
    x = images(n=4)
    out = apply_op("Rotate", x, torch.full((4,), 90.0))
    assert torch.equal(out, torch.rot90(x, 1, dims=(-2, -1)))  # counter-clockwise
    assert math.isclose(float(magnitudes("Rotate")[-1]), 135.0)


def test_unknown_op_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown TrivialAugment op 'Blur'"):
        apply_op("Blur", images(n=2), torch.zeros(2))


def test_ungrouped_ops_give_the_grouped_images() -> None:
    """The GPU way (every op on the whole batch, each image keeps its own op's result) draws and
    computes the same images as the CPU way (each op on the images that drew it)."""
    x = images(n=256)
    for seed in range(3):
        grouped = trivial_augment_batch(x, generator=torch.Generator().manual_seed(seed))
        ungrouped = trivial_augment_batch(
            x, generator=torch.Generator().manual_seed(seed), grouped=False
        )
        assert torch.equal(grouped, ungrouped), seed
    assert torch.equal(x, images(n=256))  # the input is not modified


@pytest.mark.parametrize("side", [(32, 32), (24, 40)])
def test_randaugment_magnitude_tables_are_torchvisions(side: tuple[int, int]) -> None:
    space = v2.RandAugment._AUGMENTATION_SPACE
    assert tuple(space) == OPS
    for op, (fn, signed) in space.items():
        ref, ours = fn(31, *side), rand_magnitudes(op, height=side[0], width=side[1])
        assert (ref is None) == (ours is None), op
        if ref is not None:
            assert torch.equal(ref.float(), ours.float()), op
        assert signed == (op in SIGNED), op


def test_randaugment_applies_each_images_drawn_ops_in_turn() -> None:
    """Replaying the generator's draws, each image is apply_op of its own ops at the one magnitude,
    in order; grouped (CPU) and ungrouped (GPU) ways give the same images."""
    x, n, num_ops, magnitude = images(n=64), 64, 2, 9
    out = rand_augment_batch(x, num_ops=num_ops, magnitude=magnitude, generator=gen(5))
    assert torch.equal(out, rand_augment_batch(x, generator=gen(5), grouped=False))
    replay, expected = gen(5), x.clone()
    for _ in range(num_ops):
        op_index = torch.randint(0, len(OPS), (n,), generator=replay)
        negative = torch.rand(n, generator=replay) <= 0.5
        for i in range(n):
            op = OPS[int(op_index[i])]
            table = rand_magnitudes(op)
            m = 0.0 if table is None else float(table[magnitude])
            m = -m if op in SIGNED and negative[i] else m
            expected[i] = apply_op(op, expected[i : i + 1], torch.tensor([m]))[0]
    assert torch.equal(out, expected)
    assert (out != x).flatten(1).any(1).float().mean() > 0.75  # two ops: few images unchanged
    assert torch.equal(rand_augment_batch(x, num_ops=0, generator=gen(5)), x)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"num_ops": -1}, "num_ops must be an int >= 0"), ({"magnitude": 31}, r"bin in \[0, 30\]")],
)
def test_randaugment_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rand_augment_batch(images(n=2), **kwargs)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
