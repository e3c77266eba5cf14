"""Random erasing (Zhong et al. 2017, https://arxiv.org/abs/1708.04896) on uint8 batches: with
probability p an image gets one rectangle of random pixels, so the model cannot lean on any one
part of the object. The box's rules are torchvision's RandomErasing (and timm's `--reprob`): an
area of 2% to 33% of the image, an aspect ratio log-uniform in [0.3, 3.3], up to 10 tries for a
box that fits, else the image stays whole. The fill is the paper's: uniform random values."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vit.data.trivial_augment import to_device

SCALE = (0.02, 0.33)  # the box's share of the image's area
RATIO = (0.3, 3.3)  # the box's height / width
ATTEMPTS = 10


def check_erase_prob(p: float) -> None:
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
        raise ValueError(
            f"random_erasing must be a probability in [0, 1], got {p!r}; 0 turns it off "
            "(0.25 is DeiT's and timm's --reprob)."
        )


def draw_erasing(
    batch: int,
    *,
    p: float,
    size: tuple[int, int],
    channels: int = 3,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor]:
    """random_erasing's draws for `batch` images of `size` (H, W): each image's box as (4, B)
    int64 rows top, left, height, width (height 0: not erased), and the fill, (B, C, H, W)
    uint8. All tries are drawn at once; an image takes its first box that fits."""
    h, w = size
    kw = dict(generator=generator, device=device)
    erase = torch.rand(batch, **kw) < p
    area = h * w * (SCALE[0] + (SCALE[1] - SCALE[0]) * torch.rand(ATTEMPTS, batch, **kw))
    log_ratio = math.log(RATIO[0]) + math.log(RATIO[1] / RATIO[0]) * torch.rand(
        ATTEMPTS, batch, **kw
    )
    heights = (area * log_ratio.exp()).sqrt().round().long()
    widths = (area / log_ratio.exp()).sqrt().round().long()
    fits = (heights < h) & (widths < w)  # torchvision's test: strictly inside
    first = fits.int().argmax(0)  # the first try that fits (0 when none does: masked below)
    keep = erase & fits.any(0)
    height = heights.gather(0, first[None])[0] * keep
    width = widths.gather(0, first[None])[0] * keep
    corner = torch.rand(2, batch, **kw)
    top = (corner[0] * (h - height + 1)).long()
    left = (corner[1] * (w - width + 1)).long()
    noise = torch.randint(0, 256, (batch, channels, h, w), dtype=torch.uint8, **kw)
    return torch.stack([top, left, height, width]), noise


def erase_at(images: Tensor, boxes: Tensor, noise: Tensor) -> Tensor:
    """Fill each image's drawn box (`boxes`: (4, B) top, left, height, width) with its `noise`.
    No draw and no host sync: torch.compile takes it whole."""
    _, _, h, w = images.shape
    top, left, height, width = to_device(boxes, images.device)[:, :, None, None]  # each (B, 1, 1)
    rows = torch.arange(h, device=images.device)[:, None]  # (H, 1)
    cols = torch.arange(w, device=images.device)  # (W,)
    inside = (rows >= top) & (rows < top + height) & (cols >= left) & (cols < left + width)
    return torch.where(inside[:, None], to_device(noise, images.device), images)
