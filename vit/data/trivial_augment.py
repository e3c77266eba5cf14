"""TrivialAugment (https://arxiv.org/abs/2103.10158) and RandAugment
(https://arxiv.org/abs/1909.13719) on whole uint8 batches, each op drawn per image.

The ops, magnitudes and pixel arithmetic are torchvision's TrivialAugmentWide and RandAugment (v2,
nearest interpolation, black fill); tests hold each op to torchvision's per-image result and each
magnitude table to torchvision's. torchvision
applies one op to a whole batch, so per-image draws would mean a Python loop over images; here
every op runs once on the images that drew it, with a magnitude per image, so the cost is that
of one pass over the batch. On a GPU every op runs on the whole batch instead and each image keeps
the result of its own op: more arithmetic, which a GPU does not notice, and no host sync (picking
the images that drew an op needs their count on the host, a sync per op). What each way costs:
experiments/record/benchmarks/NOTES.md and the GPU runs of experiments/record/RESULTS.md.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

OPS = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
)
SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"}
SIGNED |= {"Brightness", "Color", "Contrast", "Sharpness"}


def to_device(draws: Tensor, device: torch.device) -> Tensor:
    """Random draws made on the CPU, onto `device`. To a GPU through pinned memory, queued without
    waiting: a copy from pageable memory blocks the host until the GPU's queue has drained."""
    if draws.device == device:
        return draws
    if torch.compiler.is_compiling():  # inside a graph the copy is the graph's own
        return draws.to(device)
    if device.type == "cuda" and draws.device.type == "cpu":
        return draws.pin_memory().to(device, non_blocking=True)
    return draws.to(device)


def draw_device(images: Tensor, generator: torch.Generator | None) -> torch.device:
    """Where draws for `images` are made: on the generator's device (a CPU generator may drive a
    GPU batch), else on the images'."""
    return generator.device if generator is not None else images.device


def magnitudes(op: str, num_bins: int = 31) -> Tensor | None:
    """TrivialAugmentWide's magnitude of each bin for `op` (None: the op takes none)."""
    if op in ("ShearX", "ShearY", "Brightness", "Color", "Contrast", "Sharpness"):
        return torch.linspace(0.0, 0.99, num_bins)
    if op in ("TranslateX", "TranslateY"):
        return torch.linspace(0.0, 32.0, num_bins)
    if op == "Rotate":
        return torch.linspace(0.0, 135.0, num_bins)
    if op == "Posterize":
        return (8 - (torch.arange(num_bins) / ((num_bins - 1) / 6))).round()
    if op == "Solarize":
        return torch.linspace(1.0, 0.0, num_bins)
    return None


def rand_magnitudes(
    op: str, num_bins: int = 31, *, height: int = 32, width: int = 32
) -> Tensor | None:
    """RandAugment's magnitude of each bin for `op` (None: the op takes none): milder than
    TrivialAugmentWide's, and translations scale with the image."""
    if op in ("ShearX", "ShearY"):
        return torch.linspace(0.0, 0.3, num_bins)
    if op == "TranslateX":
        return torch.linspace(0.0, 150.0 / 331.0 * width, num_bins)
    if op == "TranslateY":
        return torch.linspace(0.0, 150.0 / 331.0 * height, num_bins)
    if op == "Rotate":
        return torch.linspace(0.0, 30.0, num_bins)
    if op in ("Brightness", "Color", "Contrast", "Sharpness"):
        return torch.linspace(0.0, 0.9, num_bins)
    if op == "Posterize":
        return (8 - (torch.arange(num_bins) / ((num_bins - 1) / 4))).round()
    if op == "Solarize":
        return torch.linspace(1.0, 0.0, num_bins)
    return None


def _per_image(values: Tensor) -> Tensor:
    return values.view(-1, 1, 1, 1)


def _blend(images: Tensor, other: Tensor, ratio: Tensor) -> Tensor:
    """ratio * images + (1 - ratio) * other per image, clamped to [0, 255], truncated to uint8."""
    r = _per_image(ratio.double())
    out = images.float().mul(r.float()).add_(other.float().mul((1.0 - r).float()))
    return out.clamp_(0, 255).to(torch.uint8)


def _grayscale(images: Tensor) -> Tensor:
    """(B, 1, H, W) float luma, floored, as torchvision computes it for uint8 images."""
    r, g, b = images.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3).floor_()


def _sharpen(images: Tensor, factor: Tensor) -> Tensor:
    """Blend with the 3x3-smoothed image (1s around a 5, over 13), borders untouched."""
    c = images.shape[1]
    a, b = 1.0 / 13.0, 5.0 / 13.0
    kernel = to_device(torch.tensor([[a, a, a], [a, b, a], [a, a, a]]), images.device)
    out = images.float()
    blurred = F.conv2d(out, kernel.expand(c, 1, 3, 3), groups=c).round_()
    inner = out[..., 1:-1, 1:-1]
    inner.add_(blurred.sub_(inner).mul_(_per_image(1.0 - factor.double()).float()))
    return out.clamp_(0, 255).to(torch.uint8)


def _inverse_affine(angle: Tensor, shear_x: Tensor, shear_y: Tensor, tx: Tensor, ty: Tensor,
                    cx: float, cy: float) -> Tensor:  # fmt: skip
    """(B, 2, 3) inverse maps, torchvision's _get_inverse_affine_matrix (degrees, scale 1)."""
    rot, sx, sy = torch.deg2rad(angle), torch.deg2rad(shear_x), torch.deg2rad(shear_y)
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -torch.cos(rot - sy) * torch.tan(sx) / torch.cos(sy) - torch.sin(rot)
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = -torch.sin(rot - sy) * torch.tan(sx) / torch.cos(sy) + torch.cos(rot)
    m = torch.stack([d, -b, torch.zeros_like(a), -c, a, torch.zeros_like(a)], dim=1)
    m[:, 2] += m[:, 0] * (-cx - tx) + m[:, 1] * (-cy - ty) + cx
    m[:, 5] += m[:, 3] * (-cx - tx) + m[:, 4] * (-cy - ty) + cy
    return m.view(-1, 2, 3)


def _warp(images: Tensor, theta: Tensor) -> Tensor:
    """Nearest-neighbour warp by per-image inverse maps, zeros outside (torchvision's grid)."""
    b, c, h, w = images.shape
    xs = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=images.device)
    ys = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=images.device)
    base = torch.stack(
        [xs.expand(h, w), ys[:, None].expand(h, w), torch.ones(h, w, device=images.device)], -1
    )  # (H, W, 3): pixel centres relative to the image centre, and 1
    scale = to_device(torch.tensor([0.5 * w, 0.5 * h]), images.device)
    rescaled = theta.float().transpose(1, 2).div(scale)  # (B, 3, 2)
    grid = base.view(1, h * w, 3).expand(b, -1, -1).bmm(rescaled).view(b, h, w, 2)
    out = F.grid_sample(
        images.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False
    )
    return out.round_().to(torch.uint8)


def _autocontrast(images: Tensor) -> Tensor:
    """Stretch each channel of each image to the full 0-255 range (torchvision's arithmetic)."""
    lo = images.amin(dim=(-2, -1), keepdim=True).float()
    hi = images.amax(dim=(-2, -1), keepdim=True).float()
    flat = hi == lo
    inv_scale = torch.where(flat, 1.0, (hi - lo).mul_(1.0 / 255))
    lo = torch.where(flat, 0.0, lo)
    return images.float().sub_(lo).div_(inv_scale).clamp_(0, 255).to(torch.uint8)


def apply_op(op: str, images: Tensor, magnitude: Tensor) -> Tensor:
    """One TrivialAugment op on (B, C, H, W) uint8 images, with one magnitude per image (B,)."""
    h, w = images.shape[-2:]
    zero = torch.zeros_like(magnitude, dtype=torch.float64)
    m = magnitude.double()
    if op == "Identity":
        return images
    if op in ("ShearX", "ShearY"):
        shear = torch.rad2deg(torch.atan(m))  # torchvision takes the shear angle in degrees
        sx, sy = (shear, zero) if op == "ShearX" else (zero, shear)
        return _warp(images, _inverse_affine(zero, sx, sy, zero, zero, -w * 0.5, -h * 0.5))
    if op in ("TranslateX", "TranslateY"):
        t = m.trunc()  # torchvision passes int(magnitude) pixels
        tx, ty = (t, zero) if op == "TranslateX" else (zero, t)
        return _warp(images, _inverse_affine(zero, zero, zero, tx, ty, 0.0, 0.0))
    if op == "Rotate":  # counter-clockwise, about the centre
        return _warp(images, _inverse_affine(-m, zero, zero, zero, zero, 0.0, 0.0))
    if op == "Brightness":
        return _blend(images, torch.zeros_like(images), 1.0 + m)
    if op == "Color":
        return _blend(images, _grayscale(images), 1.0 + m)
    if op == "Contrast":
        mean = _grayscale(images).mean(dim=(-3, -2, -1), keepdim=True)
        return _blend(images, mean, 1.0 + m)
    if op == "Sharpness":
        return _sharpen(images, 1.0 + m) if h > 2 and w > 2 else images
    if op == "Posterize":  # keep the top `bits` bits
        mask = (255 << (8 - magnitude.long())) & 255
        return images & _per_image(mask).to(torch.uint8)
    if op == "Solarize":
        threshold = _per_image(255.0 * m).float()  # torchvision compares in float32
        return torch.where(images.float() >= threshold, 255 - images, images)
    if op == "AutoContrast":
        return _autocontrast(images)
    if op == "Equalize":
        from torchvision.transforms.v2.functional import equalize  # per image and channel

        return equalize(images)
    raise ValueError(f"unknown TrivialAugment op {op!r}; choose one of {OPS}.")


def trivial_augment_batch(
    images: Tensor,
    *,
    generator: torch.Generator | None = None,
    num_bins: int = 31,
    grouped: bool | None = None,
) -> Tensor:
    """One op, magnitude bin and sign drawn per image (all from `generator`), ops run batched.

    `grouped` (the default on a CPU) runs each op on only the images that drew it; ungrouped (the
    default elsewhere) runs every op on the whole batch and keeps each image's own result. The
    two give the same images."""
    op_index, magnitude = draw_trivial(
        images.shape[0],
        generator=generator,
        device=draw_device(images, generator),
        num_bins=num_bins,
    )
    return apply_ops(images, op_index, magnitude, grouped=grouped)


def rand_augment_batch(
    images: Tensor,
    *,
    num_ops: int = 2,
    magnitude: int = 9,
    generator: torch.Generator | None = None,
    num_bins: int = 31,
    grouped: bool | None = None,
) -> Tensor:
    """RandAugment: `num_ops` rounds, each drawing an op and a sign per image, all ops at the one
    `magnitude` bin; each round runs batched as trivial_augment_batch does."""
    rounds = draw_rand(
        images.shape[0],
        num_ops=num_ops,
        magnitude=magnitude,
        generator=generator,
        device=draw_device(images, generator),
        num_bins=num_bins,
        size=images.shape[-2:],
    )
    for op_index, magnitudes_drawn in rounds:
        images = apply_ops(images, op_index, magnitudes_drawn, grouped=grouped)
    return images


def draw_trivial(
    batch: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    num_bins: int = 31,
) -> tuple[Tensor, Tensor]:
    """TrivialAugment's draws for `batch` images, in its order (op, bin, sign): each image's op
    index (B,) and every op's signed magnitude for it (len(OPS), B), for apply_ops."""
    op_index = torch.randint(0, len(OPS), (batch,), generator=generator, device=device)
    bins = torch.randint(0, num_bins, (batch,), generator=generator, device=device)
    negative = torch.rand(batch, generator=generator, device=device) <= 0.5
    return op_index, _signed_magnitudes(bins, negative, _table("trivial", num_bins))


def draw_rand(
    batch: int,
    *,
    num_ops: int = 2,
    magnitude: int = 9,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    num_bins: int = 31,
    size: tuple[int, int] = (32, 32),
) -> list[tuple[Tensor, Tensor]]:
    """RandAugment's draws for `batch` images of `size` (H, W): per round, each image's op index
    and every op's signed magnitude at the one bin (draw_trivial's layout)."""
    if not isinstance(num_ops, int) or num_ops < 0:
        raise ValueError(f"RandAugment num_ops must be an int >= 0, got {num_ops!r} (e.g. 2).")
    if not isinstance(magnitude, int) or not 0 <= magnitude < num_bins:
        raise ValueError(
            f"RandAugment magnitude must be an int bin in [0, {num_bins - 1}], got {magnitude!r} "
            "(e.g. 9, as timm's rand-m9)."
        )
    table = _table("rand", num_bins, *size)
    bins = torch.full((batch,), magnitude, device=device)
    rounds = []
    for _ in range(num_ops):
        op_index = torch.randint(0, len(OPS), (batch,), generator=generator, device=device)
        negative = torch.rand(batch, generator=generator, device=device) <= 0.5
        rounds.append((op_index, _signed_magnitudes(bins, negative, table)))
    return rounds


@functools.lru_cache(maxsize=16)
def _table(policy: str, num_bins: int, height: int = 32, width: int = 32) -> Tensor:
    """(len(OPS), num_bins): TrivialAugment's ("trivial") or RandAugment's ("rand") magnitude of
    each op at each bin, 0 for ops that take none. Cached: every batch's draws read it."""
    row = {  # a KeyError for any other policy
        "trivial": lambda op: magnitudes(op, num_bins),
        "rand": lambda op: rand_magnitudes(op, num_bins, height=height, width=width),
    }[policy]
    rows = [row(op) for op in OPS]
    return torch.stack([torch.zeros(num_bins) if r is None else r for r in rows])


def _signed_magnitudes(bins: Tensor, negative: Tensor, table: Tensor) -> Tensor:
    """(len(OPS), B): each op's magnitude at each image's bin, negated where the image drew a
    minus sign (signed ops only). A few ops for the whole table."""
    m = table.to(bins.device)[:, bins]
    signed = torch.tensor([op in SIGNED for op in OPS], device=bins.device)
    return torch.where(signed[:, None] & negative, -m, m)


def apply_ops(
    images: Tensor, op_index: Tensor, magnitude: Tensor, *, grouped: bool | None = None
) -> Tensor:
    """Each image's drawn op (op_index, (B,)) at its magnitude (magnitude[op], (len(OPS), B)), as
    draw_trivial and draw_rand give them. `grouped` (default: on a CPU) runs each op on only the
    images that drew it; ungrouped runs every op on the whole batch, with no host sync, and
    torch.compile takes it whole."""
    if grouped is None:
        grouped = images.device.type == "cpu"
    if not grouped:
        return _ungrouped(images, op_index, magnitude)
    op_index, magnitude = op_index.cpu(), magnitude.cpu()
    out = images.clone()
    for i, op in enumerate(OPS):
        chosen = (op_index == i).nonzero().flatten()
        if op == "Identity" or len(chosen) == 0:
            continue
        idx = chosen.to(images.device)
        out[idx] = apply_op(op, images[idx], magnitude[i, chosen].to(images.device))
    return out


def _ungrouped(images: Tensor, op_index: Tensor, magnitude: Tensor) -> Tensor:
    """Every op on the whole batch; each image keeps its own op's result."""
    op_index, magnitude = to_device(op_index, images.device), to_device(magnitude, images.device)
    out = images
    for i, op in enumerate(OPS):
        if op != "Identity":
            out = torch.where(_per_image(op_index == i), apply_op(op, images, magnitude[i]), out)
    return out
