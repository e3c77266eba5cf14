"""Batched augmentation on uint8 image tensors (B, C, H, W): crop, flip, erase, normalize."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.data.erasing import check_erase_prob, draw_erasing, erase_at
from vit.data.trivial_augment import (
    apply_ops,
    draw_device,
    draw_rand,
    draw_trivial,
    to_device,
    trivial_augment_batch,
)


def _check_batch(images: Tensor, *, name: str) -> None:
    if not isinstance(images, Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(
            f"{name} expects a batch of images shaped (B, C, H, W), got {shape}; "
            "add a batch dimension with images.unsqueeze(0) for a single image."
        )


def _check_uint8(images: Tensor, *, name: str) -> None:
    if images.dtype != torch.uint8:
        raise ValueError(f"{name} expects uint8 images, got dtype {images.dtype}.")


def _expand_channels(index: Tensor, *, channels: int) -> Tensor:
    """(B, H, W) plane indices -> (B, C, H*W), the same for every channel."""
    b = index.shape[0]
    return index.reshape(b, 1, -1).expand(b, channels, -1)


def random_crop(
    images: Tensor, *, padding: int = 4, generator: torch.Generator | None = None
) -> Tensor:
    """Zero-pad each image by `padding` on every side, then cut a random H x W window per image.

    Every image gets its own offsets; the crop is one gather, with no Python loop over images.
    """
    _check_batch(images, name="random_crop")
    if padding < 0:
        raise ValueError(f"random_crop padding must be >= 0, got {padding}; use 0 to disable it.")
    if padding == 0:
        return images
    offsets = crop_offsets(images.shape[0], padding, generator, draw_device(images, generator))
    return crop_at(images, offsets, padding=padding)


def crop_offsets(
    batch: int, padding: int, generator: torch.Generator | None, device: torch.device | str
) -> Tensor:
    """random_crop's draw: each image's window corner (top, left) in [0, 2 * padding], (2, B)."""
    return torch.randint(0, 2 * padding + 1, (2, batch), generator=generator, device=device)


def crop_at(images: Tensor, offsets: Tensor, *, padding: int) -> Tensor:
    """random_crop's window for drawn `offsets` (2, B): each image's top and left corner in the
    zero-padded image, in [0, 2 * padding]. No draw: torch.compile takes it whole."""
    b, c, h, w = images.shape
    hp, wp = h + 2 * padding, w + 2 * padding
    padded = F.pad(images, (padding, padding, padding, padding))  # (B, C, Hp, Wp)
    top, left = to_device(offsets, images.device)  # (B,), (B,)
    rows = top[:, None] + torch.arange(h, device=images.device)  # (B, H)
    cols = left[:, None] + torch.arange(w, device=images.device)  # (B, W)
    # flat index of each window pixel in the (Hp * Wp) plane: one gather, cheaper on a CPU than
    # 4-D advanced indexing
    flat = _expand_channels(rows[:, :, None] * wp + cols[:, None, :], channels=c)  # (B, C, H*W)
    out = padded.reshape(b, c, hp * wp).gather(2, flat)
    return out.view(b, c, h, w)


def random_hflip(
    images: Tensor, *, p: float = 0.5, generator: torch.Generator | None = None
) -> Tensor:
    """Mirror each image left-right with probability `p`, drawn independently per image."""
    _check_batch(images, name="random_hflip")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"random_hflip p must be a probability in [0, 1], got {p}.")
    device = draw_device(images, generator)
    return flip_at(images, torch.rand(images.shape[0], generator=generator, device=device) < p)


def flip_at(images: Tensor, flip: Tensor) -> Tensor:
    """Mirror the images where the drawn (B,) bool `flip` is True. No draw: torch.compile takes it
    whole."""
    b, c, h, w = images.shape
    flip = to_device(flip, images.device)
    j = torch.arange(w, device=images.device)
    cols = torch.where(flip[:, None], w - 1 - j, j)  # (B, W): source column of each output column
    # a gather keeps it free of host syncs on GPU (unlike boolean indexing) and beats torch.where
    # over two full batches on CPU
    return images.gather(3, cols[:, None, None, :].expand(b, c, h, w))


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """uint8 images -> float32 in [0, 1] -> (x - mean) / std per channel."""
    _check_batch(images, name="normalize")
    if images.dtype != torch.uint8:
        raise ValueError(
            f"normalize expects uint8 images (0-255), got dtype {images.dtype}; "
            "pass the raw uint8 batch, it divides by 255 itself."
        )
    channels = images.shape[1]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(
            f"normalize got {len(mean)} means and {len(std)} stds for {channels} channels; "
            "give one mean and one std per channel."
        )
    if any(s <= 0 for s in std):
        raise ValueError(f"normalize std values must all be > 0, got {tuple(std)}.")
    mean_t = to_device(torch.tensor(mean, dtype=torch.float32), images.device).view(1, -1, 1, 1)
    std_t = to_device(torch.tensor(std, dtype=torch.float32), images.device).view(1, -1, 1, 1)
    return images.float().div_(255.0).sub_(mean_t).div_(std_t)


def trivial_augment(images: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
    """TrivialAugment (https://arxiv.org/abs/2103.10158), one op and strength drawn per image.

    torchvision's ops and magnitudes, run batched per op (vit/data/trivial_augment.py); the draws come
    from `generator` alone, so a resumed run augments alike and the global RNG is untouched.
    """
    _check_batch(images, name="trivial_augment")
    _check_uint8(images, name="trivial_augment")
    return trivial_augment_batch(images, generator=generator)


def random_erasing(
    images: Tensor, *, p: float = 0.25, generator: torch.Generator | None = None
) -> Tensor:
    """Random erasing (vit/data/erasing.py): with probability `p` per image, one box of uniform
    random pixels, torchvision's box rules, in a uint8 batch."""
    _check_batch(images, name="random_erasing")
    _check_uint8(images, name="random_erasing")
    check_erase_prob(p)
    b, c, h, w = images.shape
    device = draw_device(images, generator)
    boxes, fill = draw_erasing(b, p=p, size=(h, w), channels=c, generator=generator, device=device)
    return erase_at(images, boxes, fill)


def check_mix_args(mixup_alpha: float, cutmix_alpha: float, prob: float) -> None:
    """Raise, with the fix, unless both alphas are >= 0 and the mixing probability is in [0, 1]."""
    if mixup_alpha < 0 or cutmix_alpha < 0 or not 0 <= prob <= 1:
        raise ValueError(
            f"mixup_alpha={mixup_alpha} and cutmix_alpha={cutmix_alpha} must be >= 0 (0 turns "
            f"each off; 0.8 and 1.0 are DeiT's) and mix_prob={prob} in [0, 1]."
        )


def mix_batch(
    images: Tensor,
    labels: Tensor,
    *,
    num_classes: int,
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    prob: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Mixup (https://arxiv.org/abs/1710.09412) or CutMix (https://arxiv.org/abs/1905.04899).

    Each image is mixed with the batch's mirror order (image i with image B-1-i), one lambda per
    batch drawn from Beta(alpha, alpha); with both alphas set, each batch picks one at even odds.
    Returns the images and (B, num_classes) soft targets whose weights match what each image shows
    (for CutMix, the pasted area). With probability 1 - prob, or both alphas 0, only one-hot.
    """
    _check_batch(images, name="mix_batch")
    check_mix_args(mixup_alpha, cutmix_alpha, prob)
    targets = F.one_hot(labels, num_classes).to(torch.float32)
    # drawn on the CPU unless the generator is elsewhere: reading GPU draws would wait for the GPU
    draws = torch.rand(3, generator=generator, device=generator.device if generator else None)
    draws = draws.tolist()
    if (mixup_alpha == 0 and cutmix_alpha == 0) or draws[0] >= prob:
        return images, targets
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha == 0 or draws[1] < 0.5)
    alpha = cutmix_alpha if use_cutmix else mixup_alpha
    seed = int(draws[2] * 2**53)
    lam = float(np.random.default_rng(seed).beta(alpha, alpha))  # torch's Beta takes no generator
    other = images.flip(0)
    if use_cutmix:  # paste a box of area ~(1 - lam) from the other image, centred anywhere
        h, w = images.shape[-2:]
        rng = np.random.default_rng(seed + 1)
        ch, cw = int(h * (1 - lam) ** 0.5), int(w * (1 - lam) ** 0.5)
        cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
        top, bottom = max(cy - ch // 2, 0), min(cy + ch - ch // 2, h)
        left, right = max(cx - cw // 2, 0), min(cx + cw - cw // 2, w)
        images = images.clone()
        images[..., top:bottom, left:right] = other[..., top:bottom, left:right]
        lam = 1 - (bottom - top) * (right - left) / (h * w)  # what is really shown
    else:
        images = images * lam + other * (1 - lam)
    return images, targets * lam + targets.flip(0) * (1 - lam)


class TrainAugment(nn.Module):
    """The CIFAR-10 training augmentation: random crop with zero padding, random flip,
    (optional) TrivialAugment or RandAugment (`rand_ops` ops at bin `rand_magnitude`), and last
    (optional) random erasing of one box per image with probability `erase_prob`.

    `compiled`: draw on the host, then run the whole batch's pixel work (every op on every image,
    each image keeping its own) as one torch.compile graph: a few fused kernels on a GPU instead
    of hundreds of launches. The same images as eager (tests/test_compile.py).
    """

    def __init__(
        self,
        *,
        padding: int = 4,
        hflip: bool = True,
        trivial: bool = False,
        rand_ops: int = 0,
        rand_magnitude: int = 9,
        erase_prob: float = 0.0,
        compiled: bool = False,
    ) -> None:
        super().__init__()
        check_erase_prob(erase_prob)
        if not isinstance(padding, int) or padding < 0:
            raise ValueError(
                f"TrainAugment padding must be an int >= 0, got {padding!r}; "
                "use 0 to turn cropping off."
            )
        if not isinstance(rand_ops, int) or rand_ops < 0:
            raise ValueError(f"rand_augment_ops must be an int >= 0 (0: off), got {rand_ops!r}.")
        if not isinstance(rand_magnitude, int) or not 0 <= rand_magnitude <= 30:
            raise ValueError(
                f"rand_augment_magnitude must be an int bin in [0, 30], got {rand_magnitude!r} "
                "(9 is timm's rand-m9)."
            )
        if trivial and rand_ops:
            raise ValueError(
                "trivial_augment and rand_augment_ops > 0 are two policies for the same place: "
                "choose one (set trivial_augment: false or rand_augment_ops: 0)."
            )
        self.padding = padding
        self.hflip = bool(hflip)
        self.trivial = bool(trivial)
        self.rand_ops, self.rand_magnitude = rand_ops, rand_magnitude
        self.erase_prob = float(erase_prob)
        self.compiled = bool(compiled)
        self._compiled_apply: Callable[..., Tensor] | None = None  # built on first use

    def forward(self, images: Tensor, *, generator: torch.Generator | None = None) -> Tensor:
        """(B, C, H, W) uint8 -> (B, C, H, W) uint8, augmented per image."""
        _check_batch(images, name="TrainAugment")
        if self.trivial:
            _check_uint8(images, name="trivial_augment")
        if self.erase_prob:
            _check_uint8(images, name="random_erasing")
        device = draw_device(images, generator)
        b, c, h, w = images.shape
        draws = self.draw(b, generator=generator, device=device, size=(h, w), channels=c)
        if not self.compiled:
            return self.apply(images, draws)
        if self._compiled_apply is None:
            apply = functools.partial(self.apply, grouped=False)
            self._compiled_apply = torch.compile(apply, fullgraph=True, dynamic=False)
        # the draws' copies to the device are queued here, outside the graph
        return self._compiled_apply(images, _draws_to(draws, images.device))

    def draw(
        self,
        batch: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
        size: tuple[int, int] = (32, 32),
        channels: int = 3,
    ) -> dict[str, Any]:
        """Every random choice for `batch` images of `size` (H, W), in the order forward makes
        them: "crop" offsets (2, B), "flip" (B,) bool, "ops", one (op index, magnitudes) pair
        per TrivialAugment or RandAugment round, and random erasing's "erase" boxes (4, B) and
        "erase_fill" (B, `channels`, H, W), drawn after the others (off: as without it). Drawn on
        the host, they leave `apply` free of draws: torch.compile takes it as one graph (a draw
        from a generator breaks a graph)."""
        draws: dict[str, Any] = {"ops": []}
        if self.padding:
            draws["crop"] = crop_offsets(batch, self.padding, generator, device)
        if self.hflip:
            draws["flip"] = torch.rand(batch, generator=generator, device=device) < 0.5
        if self.trivial:
            draws["ops"] = [draw_trivial(batch, generator=generator, device=device)]
        if self.rand_ops:
            draws["ops"] = draw_rand(
                batch,
                num_ops=self.rand_ops,
                magnitude=self.rand_magnitude,
                generator=generator,
                device=device,
                size=size,
            )
        if self.erase_prob:
            draws["erase"], draws["erase_fill"] = draw_erasing(
                batch,
                p=self.erase_prob,
                size=size,
                channels=channels,
                generator=generator,
                device=device,
            )
        return draws

    def apply(
        self, images: Tensor, draws: dict[str, Any], *, grouped: bool | None = None
    ) -> Tensor:
        """The augmentation for `draws` (from `draw`): no randomness of its own. `grouped` as in
        apply_ops (False: every op on the whole batch, one graph for torch.compile)."""
        if "crop" in draws:
            images = crop_at(images, draws["crop"], padding=self.padding)
        if "flip" in draws:
            images = flip_at(images, draws["flip"])
        for op_index, magnitude in draws["ops"]:
            images = apply_ops(images, op_index, magnitude, grouped=grouped)
        if "erase" in draws:
            images = erase_at(images, draws["erase"], draws["erase_fill"])
        return images

    def extra_repr(self) -> str:
        rand = f", rand_ops={self.rand_ops}, rand_magnitude={self.rand_magnitude}"
        return (
            f"padding={self.padding}, hflip={self.hflip}, trivial={self.trivial}"
            + (rand if self.rand_ops else "")
            + (f", erase_prob={self.erase_prob}" if self.erase_prob else "")
            + (", compiled=True" if self.compiled else "")
        )


def _draws_to(draws: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """TrainAugment's draws onto `device` (to_device: queued, without waiting for the GPU)."""
    moved = {k: to_device(v, device) for k, v in draws.items() if k != "ops"}
    moved["ops"] = [(to_device(i, device), to_device(m, device)) for i, m in draws["ops"]]
    return moved
