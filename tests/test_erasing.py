"""Tests for vit.data.erasing: random erasing's boxes, fill and draws, against torchvision's rules."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.transforms import RandomErasing

from tests.test_augment import _images
from vit.data.augment import TrainAugment, _draws_to, random_erasing
from vit.data.erasing import draw_erasing, erase_at

# torchvision's defaults, the rules the boxes follow (not the module's own constants)
SCALE, RATIO = RandomErasing().scale, RandomErasing().ratio


def _draw(b: int, p: float = 1.0, size: tuple[int, int] = (32, 32), seed: int = 0):
    return draw_erasing(b, p=p, size=size, generator=torch.Generator().manual_seed(seed))


def test_each_erased_image_holds_its_fill_inside_its_box_and_itself_outside() -> None:
    images = _images(64, 24, 20)
    boxes, fill = _draw(64, p=0.5, size=(24, 20))
    out = erase_at(images, boxes, fill)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    for i, (top, left, height, width) in enumerate(boxes.T.tolist()):
        inside = torch.zeros(24, 20, dtype=torch.bool)
        inside[top : top + height, left : left + width] = True
        assert torch.equal(out[i][:, inside], fill[i][:, inside])
        assert torch.equal(out[i][:, ~inside], images[i][:, ~inside])
    assert 0 < (boxes[2] > 0).sum() < 64  # some erased, some whole


def test_the_boxes_follow_torchvisions_rules_of_area_ratio_and_place() -> None:
    """Every box lies strictly inside the image, with torchvision's area share (2% to 33%) and
    aspect ratio (0.3 to 3.3), each side rounded to whole pixels."""
    h, w = 32, 32
    top, left, height, width = _draw(2000)[0]
    assert (height > 0).all() and (height < h).all() and (width < w).all()
    assert (top >= 0).all() and (top + height <= h).all()
    assert (left >= 0).all() and (left + width <= w).all()
    # each side rounds by at most half a pixel: h * w moves by at most sqrt(a) * k / 2 + 1 / 4,
    # k = sqrt(r) + 1 / sqrt(r) at the ratio range's ends
    k = max(math.sqrt(r) + 1 / math.sqrt(r) for r in RATIO)
    area = height * width
    a_lo, a_hi = SCALE[0] * h * w, SCALE[1] * h * w
    assert (area >= a_lo - math.sqrt(a_lo) * k / 2).all()
    assert (area <= a_hi + math.sqrt(a_hi) * k / 2 + 0.25).all()
    ratio, a = height / width, SCALE[0] * h * w  # the smallest area rounds its ratio most
    assert (ratio >= (math.sqrt(a * RATIO[0]) - 0.5) / (math.sqrt(a / RATIO[0]) + 0.5)).all()
    assert (ratio <= (math.sqrt(a * RATIO[1]) + 0.5) / (math.sqrt(a / RATIO[1]) - 0.5)).all()
    assert ratio.min() < 0.6 and ratio.max() > 1.8  # both wide and tall boxes are drawn
    # each corner is uniform over the places the box fits: the first and the last both occur
    assert (top == 0).any() and (top + height == h).any()
    assert (left == 0).any() and (left + width == w).any()


def test_the_boxes_are_distributed_as_torchvisions() -> None:
    """The same rules as torchvision.transforms.RandomErasing: the mean area share and mean log
    aspect ratio of 4,000 boxes each agree within five standard errors of their difference."""
    n, h, w = 4000, 32, 32
    torch.manual_seed(0)
    image = torch.zeros(3, h, w)
    theirs = torch.tensor(
        [RandomErasing.get_params(image, SCALE, RATIO, value=[0.0])[:4] for _ in range(n)]
    ).T.float()
    ours = _draw(n)[0].float()
    for stat in (
        lambda b: b[2] * b[3] / (h * w),  # area share
        lambda b: (b[2] / b[3]).log(),  # log aspect ratio
        lambda b: b[0] + b[2] / 2,  # the box's centre row
    ):
        a, b = stat(ours), stat(theirs)
        se = math.sqrt(a.var() / n + b.var() / n)
        assert abs(a.mean() - b.mean()) < 5 * se, (a.mean(), b.mean(), se)


def test_the_corner_draws_top_and_left_independently() -> None:
    """Each box's row and column offsets come from two uniforms: where every square box could sit
    anywhere, top and left (as shares of the room the box leaves) are uncorrelated."""
    top, left, height, width = _draw(4000)[0].double()
    across, down = top / (32 - height + 1), left / (32 - width + 1)
    corr = torch.corrcoef(torch.stack([across, down]))[0, 1].item()
    assert abs(corr) < 5 / math.sqrt(4000), corr  # five standard errors of a zero correlation


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_the_draws_take_the_generator_in_a_fixed_order(p: float) -> None:
    """One uniform per image for erase-or-not, ten areas and ten ratios per image, two corner
    uniforms per image, then the fill: a seed gives the same boxes and fill from one version to
    the next, and the draws after them are the same whatever p is."""
    b, (h, w), g = 8, (32, 32), torch.Generator().manual_seed(7)
    boxes, fill = draw_erasing(b, p=p, size=(h, w), generator=g)
    replay = torch.Generator().manual_seed(7)
    torch.rand(b + 2 * 10 * b + 2 * b, generator=replay)
    assert torch.equal(
        fill, torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8, generator=replay)
    )
    assert torch.equal(g.get_state(), replay.get_state())


@pytest.mark.parametrize("size", [(32, 2), (3, 24)])
def test_where_no_box_fits_in_ten_tries_the_image_stays_whole_as_in_torchvision(size) -> None:
    """On a thin image most tries do not fit: the share left whole (torchvision: a box of the
    whole image filled with itself) agrees with torchvision's within five standard errors, and
    every box drawn fits."""
    n, (h, w) = 4000, size
    torch.manual_seed(1)
    image = torch.zeros(3, h, w)
    theirs = [RandomErasing.get_params(image, SCALE, RATIO, value=[0.0])[2] for _ in range(n)]
    their_share = sum(height == h for height in theirs) / n
    top, left, height, width = _draw(n, size=size)[0]
    our_share = (height == 0).float().mean().item()
    assert 0.02 < their_share < 0.95  # the case occurs
    se = math.sqrt(2 * their_share * (1 - their_share) / n)
    assert abs(our_share - their_share) < 5 * se, (our_share, their_share)
    assert (height < h).all() and (width < w).all() and (top + height <= h).all()
    assert (left >= 0).all() and (left + width <= w).all()


def test_the_share_erased_is_p_and_the_fill_is_uniform_bytes() -> None:
    boxes, fill = _draw(4000, p=0.25)
    share = (boxes[2] > 0).float().mean().item()
    assert abs(share - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 4000)
    assert (boxes[2] > 0).eq(boxes[3] > 0).all()  # a box has both sides or neither
    assert fill.dtype == torch.uint8 and fill.shape == (4000, 3, 32, 32)
    assert fill.min() == 0 and fill.max() == 255
    assert abs(fill.float().mean().item() - 127.5) < 1.0
    assert (_draw(100, p=0.0)[0][2] == 0).all()


def test_random_erasing_is_its_draws_then_erase_at_and_keeps_the_global_rng() -> None:
    images = _images(16)
    rng = torch.get_rng_state()
    out = random_erasing(images, p=0.5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), rng)
    boxes, fill = _draw(16, p=0.5, seed=3)
    assert torch.equal(out, erase_at(images, boxes, fill))
    assert not torch.equal(out, images)
    assert torch.equal(random_erasing(images, p=0.0), images)


@pytest.mark.parametrize("p", [-0.1, 1.5, True, "0.25", None])
def test_a_probability_outside_zero_to_one_is_refused_with_the_fix(p: object) -> None:
    message = r"^random_erasing must be a probability in \[0, 1\], got .*; 0 turns it off"
    with pytest.raises(ValueError, match=message):
        TrainAugment(erase_prob=p)
    with pytest.raises(ValueError, match=message):
        random_erasing(_images(2), p=p)


def test_train_augment_erases_last_and_draws_nothing_more_when_off() -> None:
    """erase_prob: the other draws are unchanged and come first, the box is drawn after them, and
    apply erases after crop, flip and the policy; off, the draws are exactly as without it."""
    images = _images(32)
    plain, erasing = TrainAugment(trivial=True), TrainAugment(trivial=True, erase_prob=1.0)
    g_plain, g_erasing = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    drawn, drawn_erasing = plain.draw(32, generator=g_plain), erasing.draw(32, generator=g_erasing)
    assert "erase" not in drawn and "erase_fill" not in drawn
    for key in ("crop", "flip"):
        assert torch.equal(drawn[key], drawn_erasing[key])
    out = erasing.apply(images, drawn_erasing)
    expected = erase_at(
        plain.apply(images, drawn), drawn_erasing["erase"], drawn_erasing["erase_fill"]
    )
    assert torch.equal(out, expected)
    assert torch.equal(erasing(images, generator=torch.Generator().manual_seed(5)), out)
    assert (drawn_erasing["erase"][2] > 0).all()
    assert TrainAugment(erase_prob=0.0).draw(4).keys() == TrainAugment().draw(4).keys()


def test_the_fill_has_the_images_channels_and_moves_with_the_draws() -> None:
    augment = TrainAugment(erase_prob=0.5)
    gray = augment(_images(4)[:, :1], generator=torch.Generator().manual_seed(0))
    assert gray.shape == (4, 1, 32, 32)
    draws = augment.draw(4, size=(16, 24), channels=1)
    assert draws["erase"].shape == (4, 4) and draws["erase_fill"].shape == (4, 1, 16, 24)
    moved = _draws_to(draws, torch.device("meta"))
    assert {moved[k].device.type for k in ("erase", "erase_fill")} == {"meta"}
    meta = augment.draw(4, device="meta")
    assert {meta[k].device.type for k in ("erase", "erase_fill")} == {"meta"}


def test_a_single_image_or_a_float_batch_is_refused_in_words() -> None:
    with pytest.raises(ValueError, match=r"^random_erasing expects a batch of images shaped"):
        random_erasing(_images(1)[0])
    for erase in (lambda x: random_erasing(x), lambda x: TrainAugment(erase_prob=0.5)(x)):
        with pytest.raises(ValueError, match=r"^random_erasing expects uint8 images, got dtype"):
            erase(_images(2).float())
    assert TrainAugment()(_images(2).float()).dtype == torch.float32  # crop and flip take floats


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_a_cpu_generator_drives_erasing_on_another_device(p: float) -> None:
    on_cpu, on_meta = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    random_erasing(_images(8, 8, 8), p=p, generator=on_cpu)
    out = random_erasing(_images(8, 8, 8).to("meta"), p=p, generator=on_meta)
    assert out.device.type == "meta" and out.shape == (8, 3, 8, 8)
    assert torch.equal(on_meta.get_state(), on_cpu.get_state())


def test_train_augment_names_its_erasing() -> None:
    assert repr(TrainAugment(erase_prob=0.25)).endswith("trivial=False, erase_prob=0.25)")
    assert "erase" not in repr(TrainAugment())


def test_random_erasing_draws_on_the_generator_device_whatever_the_default_device() -> None:
    """A script's torch.set_default_device("cuda") still erases CPU images with a CPU generator;
    the meta device stands in for the GPU (a draw there has no value to read)."""
    images = _images(8, 8, 8)
    expected = random_erasing(images, p=0.5, generator=torch.Generator().manual_seed(6))
    with torch.device("meta"):
        out = random_erasing(images, p=0.5, generator=torch.Generator().manual_seed(6))
    assert out.device.type == "cpu" and torch.equal(out, expected)


def test_random_erasing_keeps_a_gray_batch_gray_and_erases_a_quarter_by_default() -> None:
    """The fill takes the batch's channels; p defaults to DeiT's and timm's 0.25."""
    gray = _images(4)[:, :1]
    assert random_erasing(gray, p=1.0).shape == (4, 1, 32, 32)
    n = 4000
    images = torch.full((n, 1, 8, 8), 7, dtype=torch.uint8)  # any erased pixel of 7 is noise
    share = (random_erasing(images) != 7).flatten(1).any(1).float().mean().item()
    # a box of k pixels of noise is all 7 with odds 256**-k <= 1/256: a bias far inside the bound
    assert abs(share - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n), share
