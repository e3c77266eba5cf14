"""Batched TrivialAugment and RandAugment: each op equals torchvision's per-image result, the
magnitude tables are torchvision's, and the draws are per image."""

from __future__ import annotations

import math
import re
import warnings
from functools import partial

import pytest
import torch
from torchvision.transforms import v2

from vit.data.trivial_augment import (
    OPS,
    SIGNED,
    apply_op,
    apply_ops,
    draw_rand,
    draw_trivial,
    magnitudes,
    rand_augment_batch,
    rand_magnitudes,
    to_device,
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


@pytest.mark.parametrize("hw", [(2, 5), (5, 2), (3, 5), (5, 3)])
def test_sharpness_on_small_images_is_torchvisions(hw: tuple[int, int]) -> None:
    """torchvision leaves an image 2 pixels high or wide as it is (it has no inner pixels to
    sharpen); from 3 pixels on, the inner pixels are sharpened."""
    x = torch.randint(0, 256, (2, 3, *hw), dtype=torch.uint8, generator=gen(0))
    m = torch.tensor([0.9, -0.9])
    out = apply_op("Sharpness", x, m)
    for i in range(len(x)):
        ref = reference("Sharpness", x[i], float(m[i]))
        assert (out[i].int() - ref.int()).abs().max() <= 1, (hw, float(m[i]))
    assert torch.equal(out, x) == (min(hw) <= 2)


def test_ops_warn_nothing() -> None:
    """Every batch of a training run passes through the ops: one warning each would flood the
    log. The GPU way runs every op on every image, so one call covers them all."""
    x = images(n=8, side=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = trivial_augment_batch(x, generator=gen(0), grouped=False)
    assert out.shape == x.shape and not torch.equal(out, x)


def replay_trivial_augment(
    x: torch.Tensor, seed: int, num_bins: int = 31
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image through apply_op with the op, bin and sign the seeded generator draws for it
    (negative where the uniform draw is <= 0.5); also the uniform draws."""
    n, replay, expected = len(x), gen(seed), x.clone()
    op_index = torch.randint(0, len(OPS), (n,), generator=replay)
    bins = torch.randint(0, num_bins, (n,), generator=replay)
    uniform = torch.rand(n, generator=replay)
    for i in range(n):
        op = OPS[int(op_index[i])]
        table = magnitudes(op, num_bins)
        m = 0.0 if table is None else float(table[bins[i]])
        m = -m if op in SIGNED and uniform[i] <= 0.5 else m
        expected[i] = apply_op(op, x[i : i + 1], torch.tensor([m]))[0]
    return expected, uniform


@pytest.mark.parametrize(("seed", "num_bins"), [(330417, None), (0, 11)])
def test_trivial_augment_applies_each_images_drawn_op_at_its_bin(
    seed: int, num_bins: int | None
) -> None:
    """A seed gives the same images from one version to the next: op, bin and sign drawn in this
    order, over 31 bins unless told otherwise."""
    x = images(n=64, side=16)
    kwargs = {} if num_bins is None else {"num_bins": num_bins}
    out = trivial_augment_batch(x, generator=gen(seed), **kwargs)
    expected, uniform = replay_trivial_augment(x, seed, num_bins or 31)
    assert torch.equal(out, expected)
    if seed == 330417:  # found by search: image 20 draws Rotate and a sign draw of exactly 0.5
        assert float(uniform[20]) == 0.5


def test_without_a_generator_the_draws_come_from_the_global_rng() -> None:
    x = images(n=32, side=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        trivial = trivial_augment_batch(x)
        torch.manual_seed(7)
        rand = rand_augment_batch(x)
    assert torch.equal(trivial, trivial_augment_batch(x, generator=gen(7)))
    assert torch.equal(rand, rand_augment_batch(x, generator=gen(7)))


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


@pytest.mark.parametrize("side", [None, (32, 32), (24, 40)])  # None: the defaults, CIFAR's 32x32
def test_randaugment_magnitude_tables_are_torchvisions(side: tuple[int, int] | None) -> None:
    space = v2.RandAugment._AUGMENTATION_SPACE
    assert tuple(space) == OPS
    for op, (fn, signed) in space.items():
        if side is None:
            ref, ours = fn(31, 32, 32), rand_magnitudes(op)
        else:
            ref, ours = fn(31, *side), rand_magnitudes(op, height=side[0], width=side[1])
        assert (ref is None) == (ours is None), op
        if ref is not None:
            assert torch.equal(ref.float(), ours.float()), op
        assert signed == (op in SIGNED), op


def replay_randaugment(
    x: torch.Tensor, seed: int, *, num_ops: int = 2, magnitude: int = 9, num_bins: int = 31
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image through apply_op with its own ops and signs as the seeded generator draws them,
    in order, at the one magnitude of a table sized for the images; also the uniform draws."""
    (n, _, h, w), replay, expected = x.shape, gen(seed), x.clone()
    uniforms = []
    for _ in range(num_ops):
        op_index = torch.randint(0, len(OPS), (n,), generator=replay)
        uniforms.append(torch.rand(n, generator=replay))
        for i in range(n):
            op = OPS[int(op_index[i])]
            table = rand_magnitudes(op, num_bins, height=h, width=w)
            m = 0.0 if table is None else float(table[magnitude])
            m = -m if op in SIGNED and uniforms[-1][i] <= 0.5 else m
            expected[i] = apply_op(op, expected[i : i + 1], torch.tensor([m]))[0]
    return expected, torch.stack(uniforms)


def test_randaugment_applies_each_images_drawn_ops_in_turn() -> None:
    """Replaying the generator's draws, each image is apply_op of its own ops at the one magnitude,
    in order; grouped (CPU) and ungrouped (GPU) ways give the same images."""
    x, seed = images(n=64), 354891
    out = rand_augment_batch(x, num_ops=2, magnitude=9, generator=gen(seed))
    assert torch.equal(out, rand_augment_batch(x, generator=gen(seed), grouped=False))
    expected, uniforms = replay_randaugment(x, seed)
    assert torch.equal(out, expected)
    assert float(uniforms[0, 21]) == 0.5  # found by search: image 21's sign draw, on ShearY
    assert (out != x).flatten(1).any(1).float().mean() > 0.75  # two ops: few images unchanged
    assert torch.equal(rand_augment_batch(x, num_ops=0, generator=gen(5)), x)


@pytest.mark.parametrize(
    ("shape", "kwargs"),
    [
        ((32, 32), {"num_ops": 1, "magnitude": 0}),  # the lowest bin is allowed
        ((32, 32), {"magnitude": 10, "num_bins": 11}),  # the top bin of a table of 11
        ((24, 40), {"magnitude": 30}),  # translations scale with the height and the width
    ],
)
def test_randaugment_settings_reach_the_ops(shape: tuple[int, int], kwargs: dict) -> None:
    x = torch.randint(0, 256, (32, 3, *shape), dtype=torch.uint8, generator=gen(1))
    out = rand_augment_batch(x, generator=gen(2), **kwargs)
    assert torch.equal(out, replay_randaugment(x, 2, **kwargs)[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_ops": -1}, "RandAugment num_ops must be an int >= 0, got -1 (e.g. 2)."),
        ({"num_ops": 1.0}, "RandAugment num_ops must be an int >= 0, got 1.0 (e.g. 2)."),
        (
            {"magnitude": 31},
            "RandAugment magnitude must be an int bin in [0, 30], got 31 (e.g. 9, as timm's "
            "rand-m9).",
        ),
        (
            {"magnitude": -1},
            "RandAugment magnitude must be an int bin in [0, 30], got -1 (e.g. 9, as timm's "
            "rand-m9).",
        ),
        (
            {"magnitude": 9.0},
            "RandAugment magnitude must be an int bin in [0, 30], got 9.0 (e.g. 9, as timm's "
            "rand-m9).",
        ),
        (
            {"magnitude": 11, "num_bins": 11},
            "RandAugment magnitude must be an int bin in [0, 10], got 11 (e.g. 9, as timm's "
            "rand-m9).",
        ),
    ],
)
def test_randaugment_rejects_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        rand_augment_batch(images(n=2), **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("grouped", [None, True, False])
def test_gpu_images_stay_on_the_gpu_whatever_the_generator(grouped: bool | None) -> None:
    """Draws from a CPU generator, a GPU one or the global RNG all augment GPU images on the GPU;
    with the CPU generator they are the CPU's images."""
    x = images(n=64)
    on_gpu = x.cuda()
    for augment in (trivial_augment_batch, partial(rand_augment_batch, num_ops=1)):
        out = augment(on_gpu, generator=gen(3), grouped=grouped)
        ref = augment(x, generator=gen(3))
        assert out.device == on_gpu.device
        # grid_sample and the blends may round a pixel differently on the two devices
        assert (out.cpu().int() - ref.int()).abs().max() <= 1
        assert (out.cpu() == ref).float().mean() > 0.999
        for g in (torch.Generator(device="cuda").manual_seed(3), None):
            out = augment(on_gpu, generator=g, grouped=grouped)
            assert out.device == on_gpu.device and out.shape == x.shape


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_to_device_moves_draws_to_a_device_other_than_cuda_as_they_are() -> None:
    """No pinned memory (which needs a GPU) on the way to a non-CUDA device; meta stands in for
    one, and a tensor already there is returned as is."""
    draws = torch.rand(5, generator=torch.Generator().manual_seed(0))
    moved = to_device(draws, torch.device("meta"))
    assert moved.device.type == "meta" and moved.shape == (5,)
    assert to_device(draws, torch.device("cpu")) is draws


@pytest.mark.parametrize("draw", ["trivial", "rand"])
def test_the_drawn_magnitudes_are_each_ops_table_at_the_images_bin_and_sign(draw: str) -> None:
    """draw_trivial and draw_rand resolve each image's bin and sign into every op's magnitude
    (len(OPS), B): one bin and one sign per image across the ops, the table's value at that bin,
    negated for signed ops only, 0 for ops that take none."""
    b, g = 256, torch.Generator().manual_seed(5)
    if draw == "trivial":
        op_index, m = draw_trivial(b, generator=g)
        tables = {op: magnitudes(op) for op in OPS}
    else:
        ((op_index, m),) = draw_rand(b, num_ops=1, magnitude=12, generator=g, size=(24, 40))
        tables = {op: rand_magnitudes(op, height=24, width=40) for op in OPS}
    assert m.shape == (len(OPS), b) and m.dtype == torch.float32
    assert op_index.shape == (b,) and set(op_index.tolist()) == set(range(len(OPS)))
    shear = tables["ShearX"]  # a signed table whose bins all differ: it names each image's bin
    bins = (m[OPS.index("ShearX")].abs()[:, None] == shear[None, :]).int().argmax(1)
    if draw == "rand":
        assert set(bins.tolist()) == {12}
    else:
        assert len(set(bins.tolist())) > 20
    negative = m[OPS.index("ShearX")] < 0
    for i, op in enumerate(OPS):
        if tables[op] is None:
            assert torch.equal(m[i], torch.zeros(b)), op
            continue
        at_bin = tables[op][bins]
        assert torch.equal(m[i], torch.where(negative, -at_bin, at_bin) if op in SIGNED else at_bin)
    assert 0.3 < negative.float().mean() < 0.7


def test_apply_ops_takes_the_drawn_magnitudes_grouped_or_not() -> None:
    """apply_ops gives each image its own op at its own magnitude from the (len(OPS), B) table,
    whichever way it runs."""
    x = torch.randint(0, 256, (len(OPS), 3, 16, 16), dtype=torch.uint8, generator=gen(1))
    op_index = torch.arange(len(OPS))
    m = torch.rand(len(OPS), len(OPS), generator=gen(2)) * 0.9
    expected = torch.stack(
        [apply_op(op, x[i : i + 1], m[i, i : i + 1])[0] for i, op in enumerate(OPS)]
    )
    assert torch.equal(apply_ops(x, op_index, m, grouped=True), expected)
    assert torch.equal(apply_ops(x, op_index, m, grouped=False), expected)


DRAWS = {
    "trivial": lambda **kw: [draw_trivial(16, **kw)],
    "rand": lambda **kw: draw_rand(16, num_ops=2, magnitude=11, **kw),
}


@pytest.mark.parametrize("draw", DRAWS)
def test_draws_land_on_the_device_asked_whatever_the_default_device(draw: str) -> None:
    """A script that calls torch.set_default_device("cuda") still draws on the device it names,
    from its generator; meta stands in for the GPU. Drawn on meta, they stay there."""
    expected = DRAWS[draw](generator=gen(3), device="cpu")
    with torch.device("meta"):
        got = DRAWS[draw](generator=gen(3), device="cpu")
    for want, have in zip(expected, got, strict=True):
        for a, b in zip(want, have, strict=True):
            assert b.device.type == "cpu" and torch.equal(a, b)
    for op_index, magnitude in DRAWS[draw](device="meta"):
        assert op_index.device.type == "meta" and magnitude.device.type == "meta"


@pytest.mark.parametrize(
    "augment", [trivial_augment_batch, partial(rand_augment_batch, num_ops=2)], ids=["ta", "ra"]
)
def test_without_a_generator_a_batch_draws_on_its_own_device(augment) -> None:  # noqa: ANN001
    """With no generator, images on another device (meta stands in for a GPU) draw there, from
    that device's RNG: the host's RNG is left as it was. With a CPU generator the draws are the
    host's, and the generator moves on as a CPU batch's would."""
    on_meta = images(n=8).to("meta")
    host_rng = torch.get_rng_state()
    out = augment(on_meta)
    assert out.device.type == "meta" and out.shape == on_meta.shape
    assert torch.equal(torch.get_rng_state(), host_rng)
    on_cpu, for_meta = gen(4), gen(4)
    augment(images(n=8), generator=on_cpu)
    with torch.device("meta"):  # the draws' device comes from the generator, not the default
        assert augment(on_meta, generator=for_meta).device.type == "meta"
    assert torch.equal(for_meta.get_state(), on_cpu.get_state())


def test_grouped_picks_the_way_ops_run_and_each_caller_passes_it_on(monkeypatch) -> None:
    """On a CPU the default runs each op on the images that drew it (grouped); grouped=False runs
    every op on the whole batch. trivial_augment_batch, rand_augment_batch (once per round) and
    TrainAugment.apply hand their `grouped` on to apply_ops."""
    from vit.data import trivial_augment as module
    from vit.data.augment import TrainAugment

    calls = []
    real = module._ungrouped
    monkeypatch.setattr(module, "_ungrouped", lambda *a: calls.append(1) or real(*a))
    x = images(n=8, side=16)
    op_index, m = draw_trivial(8, generator=gen(0))
    for grouped, ungrouped_runs in ((None, 0), (True, 0), (False, 1)):
        calls.clear()
        apply_ops(x, op_index, m, grouped=grouped)
        assert len(calls) == ungrouped_runs, grouped
    # grouped on another device (meta stands in for a GPU): host draws, magnitudes moved there
    assert apply_ops(x.to("meta"), op_index, m, grouped=True).device.type == "meta"
    for run, rounds in (
        (lambda g: trivial_augment_batch(x, generator=gen(1), grouped=g), 1),
        (lambda g: rand_augment_batch(x, num_ops=2, generator=gen(1), grouped=g), 2),
        (lambda g: TrainAugment(trivial=True).apply(x, {"ops": [(op_index, m)]}, grouped=g), 1),
    ):
        for grouped, ungrouped_runs in ((None, 0), (True, 0), (False, rounds)):
            calls.clear()
            run(grouped)
            assert len(calls) == ungrouped_runs, grouped


def test_randaugment_defaults_are_timms_rand_m9_n2() -> None:
    """draw_rand's defaults: two ops per image at magnitude bin 9 (timm's rand-m9-n2)."""
    defaults = draw_rand(32, generator=gen(2))
    explicit = draw_rand(32, num_ops=2, magnitude=9, generator=gen(2))
    assert len(defaults) == 2
    for (i, m), (j, n) in zip(defaults, explicit, strict=True):
        assert torch.equal(i, j) and torch.equal(m, n)
    shear = rand_magnitudes("ShearX")
    assert torch.equal(defaults[0][1][OPS.index("ShearX")].abs(), shear[9].expand(32))
