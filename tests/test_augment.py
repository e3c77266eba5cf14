"""Tests for vit.data.augment: batched crop, flip, normalize and the policies on uint8 images."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF

from tests.helpers import sum_tol
from vit.data.augment import (
    TrainAugment,
    mix_batch,
    normalize,
    random_crop,
    random_erasing,
    random_hflip,
    trivial_augment,
)
from vit.data.trivial_augment import draw_rand, rand_augment_batch

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _images(b: int = 8, h: int = 32, w: int = 32, *, seed: int = 0) -> torch.Tensor:
    """Random uint8 images with no zero pixels, so zero padding is told apart from content."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (b, 3, h, w), generator=g, dtype=torch.uint8)


def _crop_offsets(images: torch.Tensor, out: torch.Tensor, padding: int) -> list[tuple[int, int]]:
    """For each output image, the (top, left) window of the zero-padded input it equals exactly."""
    padded = F.pad(images, (padding,) * 4)
    h, w = images.shape[-2:]
    offsets = []
    for i in range(images.shape[0]):
        hits = [
            (top, left)
            for top in range(2 * padding + 1)
            for left in range(2 * padding + 1)
            if torch.equal(padded[i, :, top : top + h, left : left + w], out[i])
        ]
        assert len(hits) == 1, f"image {i}: output is not exactly one window of the padded input"
        offsets.append(hits[0])
    return offsets


@pytest.mark.parametrize("h, w", [(32, 32), (24, 40)])
def test_shapes_and_dtype_kept(h: int, w: int) -> None:
    images = _images(5, h, w)
    for out in (random_crop(images), random_hflip(images), TrainAugment()(images)):
        assert out.shape == images.shape
        assert out.dtype == torch.uint8


@pytest.mark.parametrize("h, w", [(32, 32), (24, 40)])
def test_crop_output_is_a_window_of_the_padded_input(h: int, w: int) -> None:
    images = _images(6, h, w)
    out = random_crop(images, padding=4, generator=torch.Generator().manual_seed(1))
    offsets = _crop_offsets(images, out, padding=4)
    assert all(0 <= top <= 8 and 0 <= left <= 8 for top, left in offsets)


@pytest.mark.parametrize("padding", [1, 4])
def test_crop_offsets_differ_between_images_and_reach_every_window(padding: int) -> None:
    images = _images(64, 16, 16)
    out = random_crop(images, padding=padding, generator=torch.Generator().manual_seed(2))
    offsets = _crop_offsets(images, out, padding=padding)
    # 64 draws of (top, left): one shared offset would give 1 distinct pair
    assert len(set(offsets)) > min(20, (2 * padding + 1) ** 2 // 2)
    # windows touching the padding on either side are drawn too, flush ones (offset 0) included
    tops, lefts = zip(*offsets, strict=True)
    assert set(tops) == set(lefts) == set(range(2 * padding + 1))


def test_crop_padding_zero_is_identity_and_negative_raises() -> None:
    images = _images()
    assert torch.equal(random_crop(images, padding=0), images)
    with pytest.raises(ValueError, match="padding must be >= 0, got -1"):
        random_crop(images, padding=-1)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("random_crop", random_crop),
        ("random_hflip", random_hflip),
        ("normalize", lambda x: normalize(x, MEAN, STD)),
        ("trivial_augment", trivial_augment),
        ("mix_batch", lambda x: mix_batch(x, torch.tensor([0]), num_classes=2)),
    ],
)
def test_unbatched_images_are_refused_naming_the_function_and_the_fix(
    name: str, call: Callable[[torch.Tensor], object]
) -> None:
    message = (
        f"{name} expects a batch of images shaped (B, C, H, W), got (3, 8, 8); "
        "add a batch dimension with images.unsqueeze(0) for a single image."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        call(_images(1, 8, 8)[0])


def test_a_non_tensor_is_refused_naming_its_type() -> None:
    message = (
        "random_crop expects a batch of images shaped (B, C, H, W), got list; "
        "add a batch dimension with images.unsqueeze(0) for a single image."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        random_crop([[0, 1], [2, 3]])


def test_flip_p0_is_identity_and_p1_mirrors_every_image() -> None:
    images = _images()
    assert torch.equal(random_hflip(images, p=0.0), images)
    assert torch.equal(random_hflip(images, p=1.0), images.flip(-1))


def test_flip_half_mirrors_some_images_whole() -> None:
    images = _images(64)
    out = random_hflip(images, p=0.5, generator=torch.Generator().manual_seed(3))
    same = (out == images).flatten(1).all(1)
    mirrored = (out == images.flip(-1)).flatten(1).all(1)
    assert bool((same | mirrored).all()), "each image is either kept or mirrored as a whole"
    assert 16 < int(mirrored.sum()) < 48


def test_flip_mirrors_an_image_when_its_draw_is_below_p() -> None:
    """One uniform draw per image from the generator; p equal to a draw leaves that image alone,
    so p = 0 never flips, even on a draw of exactly 0."""
    images = _images(8)
    u = torch.rand(8, generator=torch.Generator().manual_seed(5))
    p = float(u[3])
    out = random_hflip(images, p=p, generator=torch.Generator().manual_seed(5))
    mirrored = (out == images.flip(-1)).flatten(1).all(1)
    assert mirrored.tolist() == (u < p).tolist()
    assert not mirrored[3] and 0 < int(mirrored.sum()) < 8


def test_flip_rejects_a_probability_outside_0_1() -> None:
    with pytest.raises(ValueError, match=r"p must be a probability in \[0, 1\], got 1.5"):
        random_hflip(_images(), p=1.5)


def test_normalize_matches_torchvision() -> None:
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    expected = TF.normalize(images.float() / 255, mean=list(MEAN), std=list(STD))
    out = normalize(images, MEAN, STD)
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)  # the same correctly rounded /255, -mean, /std: bit for bit


def test_normalize_rejects_float_input_and_wrong_channel_count() -> None:
    dtype_message = (
        "normalize expects uint8 images (0-255), got dtype torch.float32; "
        "pass the raw uint8 batch, it divides by 255 itself."
    )
    with pytest.raises(ValueError, match=re.escape(dtype_message)):
        normalize(torch.zeros(1, 3, 4, 4), MEAN, STD)
    channels_message = (
        "normalize got 2 means and 3 stds for 3 channels; give one mean and one std per channel."
    )
    with pytest.raises(ValueError, match=re.escape(channels_message)):
        normalize(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), MEAN[:2], STD)
    with pytest.raises(ValueError, match="std values must all be > 0"):
        normalize(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), MEAN, (1.0, 0.0, 1.0))


def test_normalize_is_torchvisions_bit_for_bit_with_float64_statistics() -> None:
    """Statistics computed in numpy (float64) are taken in float32, as torchvision's Normalize
    takes them, so a model sees the same inputs through either."""
    images = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(2, 3, 16, 16)
    mean, std = np.array(MEAN, dtype=np.float64), np.array(STD, dtype=np.float64)
    expected = TF.normalize(images.float() / 255, mean=mean, std=std)
    assert torch.equal(normalize(images, mean, std), expected)


def test_seeded_generator_is_deterministic() -> None:
    images = _images(32)
    augment = TrainAugment(padding=4, hflip=True)
    first = augment(images, generator=torch.Generator().manual_seed(7))
    again = augment(images, generator=torch.Generator().manual_seed(7))
    other = augment(images, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_train_augment_crops_then_flips() -> None:
    images = _images(16)
    out = TrainAugment(padding=2, hflip=True)(images, generator=torch.Generator().manual_seed(4))
    crop = random_crop(images, padding=2, generator=torch.Generator().manual_seed(4))
    # same generator stream: the crop draws come first, so un-flipping gives back the crop
    flipped = ~(out == crop).flatten(1).all(1)
    assert torch.equal(torch.where(flipped[:, None, None, None], out.flip(-1), out), crop)
    assert 0 < int(flipped.sum()) < 16


def test_train_augment_off_is_identity_and_validates_padding() -> None:
    images = _images()
    assert torch.equal(TrainAugment(padding=0, hflip=False)(images), images)
    # RandAugment's settings are shown only when it is on
    assert repr(TrainAugment()) == "TrainAugment(padding=4, hflip=True, trivial=False)"
    with pytest.raises(ValueError, match="padding must be an int >= 0, got -2"):
        TrainAugment(padding=-2)


def _uint8_batch(n: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)


def test_trivial_augment_is_per_image_seeded_and_leaves_the_global_rng_alone() -> None:
    images = _uint8_batch()
    state = torch.get_rng_state()
    a = trivial_augment(images, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.get_rng_state(), state)
    b = trivial_augment(images, generator=torch.Generator().manual_seed(1))
    c = trivial_augment(images, generator=torch.Generator().manual_seed(2))
    assert a.dtype == torch.uint8 and a.shape == images.shape
    assert torch.equal(a, b) and not torch.equal(a, c)
    changed = (a != images).flatten(1).float().mean(1)  # how much of each image an op touched
    assert changed.unique().numel() > 3  # ops and strengths differ from image to image
    with pytest.raises(ValueError, match="uint8"):
        trivial_augment(images.float())


def test_train_augment_with_trivial_augment_differs_from_crop_and_flip_alone() -> None:
    images = _uint8_batch()
    plain = TrainAugment()(images, generator=torch.Generator().manual_seed(0))
    strong = TrainAugment(trivial=True)(images, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(plain, strong) and strong.shape == images.shape


def test_mixup_targets_weigh_the_two_images_as_mixed() -> None:
    images = torch.randn(8, 3, 4, 4)
    labels = torch.arange(8) % 10
    g = torch.Generator().manual_seed(0)
    mixed, targets = mix_batch(images, labels, num_classes=10, mixup_alpha=0.8, generator=g)
    lam = targets[0, labels[0]].item()
    assert 0 < lam < 1
    # lam read back in float32: 1 - lam may round an ulp apart, and the sum rounds once
    tol = sum_tol(torch.float32, 2, images.abs().max())
    expected = images * lam + images.flip(0) * (1 - lam)
    torch.testing.assert_close(mixed, expected, rtol=0, atol=tol)
    # lam and 1 - lam, each rounded to float32, and their sum
    torch.testing.assert_close(
        targets.sum(1), torch.ones(8), rtol=0, atol=sum_tol(torch.float32, 2)
    )


def test_cutmix_targets_match_the_pasted_area() -> None:
    images = torch.zeros(4, 3, 32, 32)
    images[2:] = 1.0  # images 0, 1 are black, 2, 3 white: the pasted box shows as ones
    labels = torch.tensor([0, 1, 2, 3])
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        mixed, targets = mix_batch(images, labels, num_classes=4, cutmix_alpha=1.0, generator=g)
        shown_other = mixed[0, 0].mean().item()  # fraction of image 0 taken from image 3
        # exact: pixels over 1024, short binary fractions, in float32 and float64 alike
        assert targets[0, 3].item() == shown_other
        assert targets[0, 0].item() == 1 - shown_other


def test_mixing_off_gives_one_hot_and_bad_values_fail() -> None:
    images, labels = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 1])
    out, targets = mix_batch(images, labels, num_classes=3, mixup_alpha=1.0, prob=0.0)
    assert torch.equal(out, images) and torch.equal(targets, F.one_hot(labels, 3).float())
    with pytest.raises(ValueError, match="must be >= 0"):
        mix_batch(images, labels, num_classes=3, cutmix_alpha=-1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_augmentation_never_makes_the_host_wait() -> None:
    """Crop, flip, TrivialAugment, mixing and normalize on a GPU batch with CPU-drawn randomness
    queue their work without a host sync (each sync costs a launch-bound step its overlap), and
    TrivialAugment's GPU way gives the CPU way's images."""
    images = _images(64).cuda()
    labels = torch.arange(64, device="cuda") % 10
    augment = TrainAugment(trivial=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for seed in range(4):
            out = augment(images, generator=torch.Generator().manual_seed(seed))
            mixed, _ = mix_batch(
                normalize(out, MEAN, STD), labels, num_classes=10, mixup_alpha=0.8,
                cutmix_alpha=1.0,
            )  # fmt: skip
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert mixed.shape == (64, 3, 32, 32)
    on_gpu = trivial_augment(images, generator=torch.Generator().manual_seed(9))
    on_cpu = trivial_augment(images.cpu(), generator=torch.Generator().manual_seed(9))
    # grid_sample and the blends may round a pixel differently on the two devices
    assert (on_gpu.cpu().int() - on_cpu.int()).abs().max() <= 1
    assert (on_gpu.cpu() == on_cpu).float().mean() > 0.999


def test_train_augment_with_trivial_augment_is_crop_flip_then_trivial_augment() -> None:
    images = _uint8_batch()
    out = TrainAugment(trivial=True)(images, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)  # one stream: crop, flip, then TrivialAugment's draws
    expected = trivial_augment(
        random_hflip(random_crop(images, generator=g), generator=g), generator=g
    )
    assert torch.equal(out, expected)


@pytest.mark.parametrize(("ops", "magnitude"), [(2, 9), (1, 20)])
def test_train_augment_with_randaugment_is_crop_flip_then_randaugment(
    ops: int, magnitude: int
) -> None:
    images = _uint8_batch()
    out = TrainAugment(rand_ops=ops, rand_magnitude=magnitude)(
        images, generator=torch.Generator().manual_seed(3)
    )
    g = torch.Generator().manual_seed(3)  # the same stream: crop, flip, then RandAugment's draws
    expected = rand_augment_batch(
        random_hflip(random_crop(images, generator=g), generator=g),
        num_ops=ops,
        magnitude=magnitude,
        generator=g,
    )
    assert torch.equal(out, expected)
    assert "rand_ops=2, rand_magnitude=9" in repr(TrainAugment(rand_ops=2))


def _black_and_white() -> torch.Tensor:
    """Image 0 all zeros, image 1 all ones: what one shows of the other reads off its values."""
    return torch.stack([torch.zeros(3, 32, 32), torch.ones(3, 32, 32)])


def _draws(seed: int) -> list[float]:
    """mix_batch's draw contract: three uniforms per batch from its generator, u0 against the
    mixing probability, u1 the coin between Mixup and CutMix, u2 the seed of lambda's draw."""
    return torch.rand(3, generator=torch.Generator().manual_seed(seed)).tolist()


def _reference_lambda(seed: int, alpha: float) -> tuple[float, int]:
    """Lambda ~ Beta(alpha, alpha) from numpy seeded by u2 (torch's Beta takes no generator),
    and that seed."""
    numpy_seed = int(_draws(seed)[2] * 2**53)
    return float(np.random.default_rng(numpy_seed).beta(alpha, alpha)), numpy_seed


def _reference_box(seed: int, h: int, w: int) -> tuple[int, int, int, int]:
    """CutMix's box as the paper draws it: sides sqrt(1 - lambda) of the image's, the centre
    uniform over the image (from the next numpy seed), clipped at the borders."""
    lam, numpy_seed = _reference_lambda(seed, 1.0)
    centre = np.random.default_rng(numpy_seed + 1)
    ch, cw = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
    cy, cx = int(centre.integers(0, h)), int(centre.integers(0, w))
    return (
        max(cy - ch // 2, 0),
        min(cy + ch - ch // 2, h),
        max(cx - cw // 2, 0),
        min(cx + cw - cw // 2, w),
    )


@pytest.mark.parametrize("seed", [13, 15, 20, 21])  # boxes clipped at a corner, odd-sided, small
def test_cutmix_pastes_the_papers_box_and_weighs_targets_by_its_area(seed: int) -> None:
    images, labels = _black_and_white(), torch.tensor([0, 1])
    g = torch.Generator().manual_seed(seed)
    mixed, targets = mix_batch(images, labels, num_classes=3, cutmix_alpha=1.0, generator=g)
    top, bottom, left, right = _reference_box(seed, 32, 32)
    assert 0 < (bottom - top) * (right - left) < 32**2, "the seeds were chosen for a real box"
    expected = images.clone()
    expected[:, :, top:bottom, left:right] = images.flip(0)[:, :, top:bottom, left:right]
    assert torch.equal(mixed, expected)
    # the targets weigh what each image really shows: read off the pixels
    shown = float((mixed[0] == 1).float().mean())
    expected_targets = torch.tensor([[1 - shown, shown, 0.0], [shown, 1 - shown, 0.0]])
    assert torch.equal(targets, expected_targets)  # exact: pixels over 1024, binary fractions


def test_mixup_takes_each_batchs_own_draws_from_one_generator() -> None:
    """One generator drives a run's batches: each batch must take exactly its three draws, so a
    resumed run (its generator restored) mixes as the first did."""
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([2, 0, 1, 1])
    one_hot = F.one_hot(labels, 3).float()
    g, reference = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    rng_state = torch.get_rng_state()
    for _ in range(3):
        u2 = torch.rand(3, generator=reference)[2].item()
        lam = float(np.random.default_rng(int(u2 * 2**53)).beta(0.8, 0.8))
        mixed, targets = mix_batch(images, labels, num_classes=3, mixup_alpha=0.8, generator=g)
        # the same lam and the same expressions as mix_batch's: bit for bit
        assert torch.equal(mixed, images * lam + images.flip(0) * (1 - lam))
        assert torch.equal(targets, one_hot * lam + one_hot.flip(0) * (1 - lam))
    assert torch.equal(torch.get_rng_state(), rng_state), "the global RNG is left alone"


def test_mix_batch_defaults_leave_the_batch_unmixed() -> None:
    images, labels = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 1])
    out, targets = mix_batch(images, labels, num_classes=3)
    assert out is images and torch.equal(targets, F.one_hot(labels, 3).float())


def test_with_both_alphas_each_batch_picks_mixup_or_cutmix_at_even_odds() -> None:
    images, labels = _black_and_white(), torch.tensor([0, 1])
    # seed 5095276's coin draw is exactly 0.5, which falls on Mixup's side
    assert _draws(5095276)[1] == 0.5
    assert {_draws(seed)[1] < 0.5 for seed in range(8)} == {True, False}
    for seed in [*range(8), 5095276]:
        cutmix = _draws(seed)[1] < 0.5
        g = torch.Generator().manual_seed(seed)
        mixed, _ = mix_batch(
            images, labels, num_classes=3, mixup_alpha=0.8, cutmix_alpha=1.0, generator=g
        )
        pasted = bool(((mixed == 0) | (mixed == 1)).all())  # a Mixup blend lies strictly between
        assert pasted == cutmix, f"seed {seed}"


def test_mix_prob_is_the_chance_a_batch_is_mixed() -> None:
    images, labels = _black_and_white(), torch.tensor([0, 1])

    def mixes(prob: float, seed: int) -> bool:
        g = torch.Generator().manual_seed(seed)
        out, _ = mix_batch(images, labels, num_classes=3, mixup_alpha=0.8, prob=prob, generator=g)
        return not torch.equal(out, images)

    assert [mixes(0.5, seed) for seed in range(8)] == [_draws(seed)[0] < 0.5 for seed in range(8)]
    # a batch mixes when its uniform draw u is below prob, so prob 0 never mixes, even at u = 0
    u = torch.rand(1, generator=torch.Generator().manual_seed(9)).item()
    assert not mixes(u, seed=9) and mixes(math.nextafter(u, 1.0), seed=9)


def test_mix_batch_draws_on_the_generator_device_whatever_the_default_device() -> None:
    """A script that calls torch.set_default_device("cuda") still mixes with a CPU generator; the
    meta device stands in for the GPU here (a draw made there has no value to read)."""
    images, labels = _black_and_white(), torch.tensor([0, 1])
    kwargs = {"num_classes": 3, "mixup_alpha": 0.8}
    expected, _ = mix_batch(images, labels, generator=torch.Generator().manual_seed(1), **kwargs)
    g = torch.Generator().manual_seed(1)
    with torch.device("meta"):
        mixed, targets = mix_batch(images, labels, generator=g, **kwargs)
    assert torch.equal(mixed, expected) and targets.shape == (2, 3)


def test_crop_and_flip_draw_on_the_generator_device_whatever_the_default_device() -> None:
    """A script that calls torch.set_default_device("cuda") still crops and flips CPU images with
    a CPU generator; the meta device stands in for the GPU (a draw there has no value to read)."""
    images = _images(8, 8, 8)
    expected = random_hflip(
        random_crop(images, generator=torch.Generator().manual_seed(1)),
        generator=torch.Generator().manual_seed(2),
    )
    with torch.device("meta"):
        out = random_hflip(
            random_crop(images, generator=torch.Generator().manual_seed(1)),
            generator=torch.Generator().manual_seed(2),
        )
    assert torch.equal(out, expected)


@pytest.mark.parametrize("augment", [random_crop, random_hflip])
def test_a_cpu_generator_drives_a_batch_on_another_device(augment: Callable) -> None:
    """Images on another device (meta stands in for a GPU) take their draws from the CPU
    generator, so a run augments alike on any device and its generator state resumes."""
    on_cpu, on_meta = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    augment(_images(8, 8, 8), generator=on_cpu)
    out = augment(_images(8, 8, 8).to("meta"), generator=on_meta)
    assert out.device.type == "meta" and out.shape == (8, 3, 8, 8)
    assert torch.equal(on_meta.get_state(), on_cpu.get_state())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"padding": -1},
            "TrainAugment padding must be an int >= 0, got -1; use 0 to turn cropping off.",
        ),
        (
            {"padding": 2.0},
            "TrainAugment padding must be an int >= 0, got 2.0; use 0 to turn cropping off.",
        ),
        ({"rand_ops": -1}, "rand_augment_ops must be an int >= 0 (0: off), got -1."),
        (
            {"rand_ops": 2, "rand_magnitude": 31},
            "rand_augment_magnitude must be an int bin in [0, 30], got 31 (9 is timm's rand-m9).",
        ),
        (
            {"rand_ops": 2, "rand_magnitude": -1},
            "rand_augment_magnitude must be an int bin in [0, 30], got -1 (9 is timm's rand-m9).",
        ),
        (
            {"trivial": True, "rand_ops": 1},
            "trivial_augment and rand_augment_ops > 0 are two policies for the same place: "
            "choose one (set trivial_augment: false or rand_augment_ops: 0).",
        ),
    ],
)
def test_train_augment_refuses_each_bad_setting_with_its_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        TrainAugment(**kwargs)


def test_train_augment_takes_the_edge_settings() -> None:
    """Padding 0, no RandAugment ops, and both ends of the magnitude bins are all valid."""
    assert TrainAugment(padding=0, rand_ops=0).padding == 0
    for magnitude in (0, 30):
        assert TrainAugment(rand_ops=1, rand_magnitude=magnitude).rand_magnitude == magnitude


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(padding=0),
        dict(hflip=False),
        dict(trivial=True),
        dict(rand_ops=2),
        dict(rand_ops=1, erase_prob=0.5),
    ],
)
def test_train_augment_is_its_draws_then_an_apply_that_draws_nothing(kwargs: dict) -> None:
    """forward = draw (every random choice, on the host, in forward's order) then apply (no
    randomness of its own): apply gives forward's images for the same draws, grouped or not,
    as often as it is called, and leaves the global RNG alone."""
    augment, images = TrainAugment(**kwargs), _images(16, 24, 20)
    out = augment(images, generator=torch.Generator().manual_seed(4))
    draws = augment.draw(16, generator=torch.Generator().manual_seed(4), size=(24, 20))
    rng = torch.get_rng_state()
    assert torch.equal(augment.apply(images, draws), out)
    assert torch.equal(augment.apply(images, draws, grouped=False), out)
    assert torch.equal(augment.apply(images, draws), out)
    assert torch.equal(torch.get_rng_state(), rng)
    assert ("crop" in draws) == (augment.padding > 0) and ("flip" in draws) == augment.hflip
    assert len(draws["ops"]) == (1 if augment.trivial else augment.rand_ops)


def test_the_draws_are_windows_in_the_padding_flips_and_one_op_per_image_and_round() -> None:
    augment = TrainAugment(padding=3, rand_ops=3)
    draws = augment.draw(500, generator=torch.Generator().manual_seed(0))
    crop = draws["crop"]
    assert crop.shape == (2, 500) and set(crop.flatten().tolist()) == set(range(7))
    assert draws["flip"].dtype == torch.bool and 0.4 < draws["flip"].float().mean() < 0.6
    assert [tuple(m.shape) for _, m in draws["ops"]] == [(14, 500)] * 3
    rounds = [op.tolist() for op, _ in draws["ops"]]
    assert rounds[0] != rounds[1] != rounds[2]  # each round draws its own ops


def test_a_compiled_train_augment_says_so() -> None:
    assert "compiled=True" in repr(TrainAugment(compiled=True))
    assert "compiled" not in repr(TrainAugment())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_compiled_augmentation_on_a_gpu_waits_for_nothing_and_gives_the_cpus_images() -> None:
    """compile_augment on a GPU: once compiled, a step's augmentation (host draws, their copies,
    one graph) queues without a host sync, and gives the CPU's eager images (a pixel may round
    one level apart: grid_sample and the blends on the two devices)."""
    images = _images(64)
    compiled = TrainAugment(trivial=True, compiled=True)
    compiled(images.cuda(), generator=torch.Generator().manual_seed(0))  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_gpu = compiled(images.cuda(), generator=torch.Generator().manual_seed(1))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    on_cpu = TrainAugment(trivial=True)(images, generator=torch.Generator().manual_seed(1))
    assert (on_gpu.cpu().int() - on_cpu.int()).abs().max() <= 1
    assert (on_gpu.cpu() == on_cpu).float().mean() > 0.999


def test_a_compiled_train_augment_compiles_apply_once_whole_and_static(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compiled=True: apply is compiled once (fullgraph, static shapes, every op on the whole
    batch: no host sync inside), fed draws already on the images' device, and gives the eager
    images. torch.compile is stood in for here; tests/test_compile.py runs the real one."""
    import vit.data.augment as augment_module

    calls: list[dict] = []

    def fake_compile(fn, **kwargs):  # noqa: ANN001, ANN202
        calls.append(kwargs | {"grouped": fn.keywords["grouped"]})

        def run(images: torch.Tensor, draws: dict) -> torch.Tensor:
            tensors = [draws[k] for k in draws if k != "ops"] + [t for r in draws["ops"] for t in r]
            assert {t.device for t in tensors} == {images.device}
            return fn(images, draws)

        return run

    monkeypatch.setattr(augment_module.torch, "compile", fake_compile)
    compiled, eager = TrainAugment(trivial=True, compiled=True), TrainAugment(trivial=True)
    images = _images(16)
    for seed in (1, 2):
        out = compiled(images, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(out, eager(images, generator=torch.Generator().manual_seed(seed)))
    assert calls == [{"fullgraph": True, "dynamic": False, "grouped": False}]


def test_draws_go_to_a_device_whole() -> None:
    """_draws_to moves every draw, each round's op indices and magnitudes included."""
    from vit.data.augment import _draws_to

    augment = TrainAugment(rand_ops=2)
    draws = augment.draw(4, generator=torch.Generator().manual_seed(0))
    moved = _draws_to(draws, torch.device("meta"))
    assert moved.keys() == draws.keys() and len(moved["ops"]) == 2
    for key in ("crop", "flip"):
        assert moved[key].device.type == "meta" and moved[key].shape == draws[key].shape
    for (op, m), (op0, m0) in zip(moved["ops"], draws["ops"], strict=True):
        assert (op.device.type, m.device.type) == ("meta", "meta")
        assert (op.shape, m.shape, m.dtype) == (op0.shape, m0.shape, m0.dtype)


AUGMENTS = {
    "crop-flip": {},
    "trivial": {"trivial": True},
    "rand": {"rand_ops": 2, "rand_magnitude": 5},
    "erasing": {"erase_prob": 0.5},
}


@pytest.mark.parametrize("kwargs", AUGMENTS.values(), ids=AUGMENTS.keys())
def test_train_augment_draws_where_told_whatever_the_default_device(kwargs: dict) -> None:
    """TrainAugment.draw draws every choice (crop, flip, ops) on the device it names, and forward
    on its generator's: a script's torch.set_default_device("cuda") changes no draw. Meta stands
    in for the GPU: images there take a CPU generator's draws, as a CPU batch would."""
    augment = TrainAugment(**kwargs)
    expected = augment.draw(8, generator=torch.Generator().manual_seed(1), device="cpu")
    with torch.device("meta"):
        got = augment.draw(8, generator=torch.Generator().manual_seed(1), device="cpu")
    flat = lambda d: [d.get("crop"), d.get("flip"), *(t for r in d["ops"] for t in r)]  # noqa: E731
    for a, b in zip(flat(expected), flat(got), strict=True):
        assert (a is None and b is None) or (b.device.type == "cpu" and torch.equal(a, b))
    on_cpu, for_meta = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    augment(_images(8, 16, 16), generator=on_cpu)
    with torch.device("meta"):
        out = augment(_images(8, 16, 16).to("meta"), generator=for_meta)
    assert out.device.type == "meta" and out.shape == (8, 3, 16, 16)
    assert torch.equal(for_meta.get_state(), on_cpu.get_state())


def test_bad_batches_are_refused_by_the_name_the_caller_knows() -> None:
    """A float batch for TrivialAugment and a single image are refused in words that name the
    function that checked them (the class for TrainAugment, the op for trivial_augment)."""
    floats = _images(2, 8, 8).float()
    for run in (lambda x: TrainAugment(trivial=True)(x), trivial_augment):
        with pytest.raises(ValueError, match=r"^trivial_augment expects uint8 images, got dtype"):
            run(floats)
    with pytest.raises(ValueError, match=r"^TrainAugment expects a batch of images shaped"):
        TrainAugment()(_images(1, 8, 8)[0])
    assert repr(TrainAugment(compiled=True)).endswith("trivial=False, compiled=True)")


def test_train_augment_draws_on_the_device_and_for_the_size_it_is_given() -> None:
    """TrainAugment.draw makes each draw on `device` (meta stands in for a GPU) and RandAugment's
    magnitudes for the images' `size` (its translations are a share of the side)."""
    for kwargs in AUGMENTS.values():
        draws = TrainAugment(**kwargs).draw(4, device="meta")
        for t in (draws.get("crop"), draws.get("flip"), *(t for r in draws["ops"] for t in r)):
            assert t is None or t.device.type == "meta"
    augment = TrainAugment(padding=0, hflip=False, rand_ops=1, rand_magnitude=9)
    drawn = augment.draw(16, generator=torch.Generator().manual_seed(3), size=(16, 24))
    ((op_index, magnitude),) = draw_rand(
        16, num_ops=1, magnitude=9, generator=torch.Generator().manual_seed(3), size=(16, 24)
    )
    ((ops_32, magnitude_32),) = augment.draw(16, generator=torch.Generator().manual_seed(3))["ops"]
    assert torch.equal(drawn["ops"][0][0], op_index) and torch.equal(drawn["ops"][0][1], magnitude)
    assert torch.equal(ops_32, op_index) and not torch.equal(magnitude_32, magnitude)


@pytest.mark.parametrize(
    "augment",
    [TrainAugment(), TrainAugment(trivial=True, erase_prob=0.5), partial(random_erasing, p=0.5)],
    ids=["crop-flip", "trivial-erasing", "random_erasing"],
)
def test_without_a_generator_a_batch_elsewhere_draws_on_its_own_device(augment: Callable) -> None:
    """With no generator, the draws are made where the batch is (meta stands in for a GPU: its
    own random state, no copy from the host): the CPU's random state is left as it was."""
    state = torch.get_rng_state()
    out = augment(_images(4).to("meta"))
    assert out.device.type == "meta" and out.shape == (4, 3, 32, 32)
    assert torch.equal(torch.get_rng_state(), state)
