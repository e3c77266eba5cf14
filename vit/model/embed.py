"""Patch embedding and positional vectors (https://arxiv.org/abs/2010.11929, https://arxiv.org/abs/1706.03762)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

# Shifted patch tokenization (PatchEmbed spt=True): the image itself, then its copies moved half a
# patch right-down, left-down, right-up and left-up, as (dx, dy) in units of half a patch.
SPT_SHIFTS = ((0, 0), (1, 1), (-1, 1), (1, -1), (-1, -1))


class PatchEmbed(nn.Module):
    """Split an image into non-overlapping p x p patches and project each linearly to `embed_dim`.

    A stride-p convolution with a p x p kernel is exactly "flatten each patch, multiply by one
    matrix": the same linear map, computed in one call (a test holds the two equal).

    `spt=True` is shifted patch tokenization (Lee, Lee & Song 2021, "Vision Transformer for
    Small-Size Datasets", arXiv:2112.13492): the image is stacked with its four copies shifted
    diagonally by half a patch (zeros fill the gap), so each patch vector also carries the pixels
    around its patch; each flattened (5C x p x p) patch is layer-normalised, then projected by
    one linear map (`proj`, an nn.Linear then). Still patches and a linear projection: no
    convolution, and the same number of tokens.
    """

    def __init__(
        self,
        *,
        img_size: int = 32,
        patch_size: int = 4,
        in_chans: int = 3,
        embed_dim: int = 192,
        dynamic_img_size: bool = False,
        spt: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (
            ("img_size", img_size),
            ("patch_size", patch_size),
            ("in_chans", in_chans),
            ("embed_dim", embed_dim),
        ):
            if value < 1:
                raise ValueError(f"{name}={value} must be a positive integer.")
        if img_size % patch_size != 0:
            sizes = [d for d in range(2, img_size) if img_size % d == 0] or [1, img_size]
            raise ValueError(
                f"img_size={img_size} is not divisible by patch_size={patch_size}: the image must "
                f"split into whole patches. Pick a patch_size that divides {img_size}: "
                f"{', '.join(map(str, sizes))}."
            )
        if spt and patch_size < 2:
            raise ValueError(
                "spt=True shifts the image by half a patch, which needs patch_size >= 2; "
                f"got patch_size={patch_size}. Use a larger patch or spt=False."
            )
        self.img_size = img_size
        self.patch_size = patch_size
        self.in_chans = in_chans
        self.dynamic_img_size = dynamic_img_size
        self.grid_size = img_size // patch_size
        self.num_patches = self.grid_size**2
        self.spt = spt
        if spt:
            patch_dim = len(SPT_SHIFTS) * in_chans * patch_size**2
            self.norm = nn.LayerNorm(patch_dim)
            self.proj = nn.Linear(patch_dim, embed_dim)
        else:
            self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor, keep: Tensor | None = None) -> Tensor:
        """(B, C, H, W) images -> (B, grid*grid, embed_dim) patch vectors, row by row.

        With `dynamic_img_size`, any square image whose side is a multiple of the patch is taken
        (the model then resizes its position table to the grid): a low-resolution curriculum.
        `keep`, (B, K) patch indices (keep_index), embeds only those patches of each image:
        (B, K, embed_dim). The embedding treats each patch alone, so with `spt` the dropped
        patches are left out before the norm and the projection and cost nothing there.
        """
        self.grid(x)
        if self.spt:
            patches = self._shifted_patches(x)
            if keep is not None:
                patches = take_patches(patches, keep)
            return self.proj(self.norm(patches))
        tokens = self.proj(x).flatten(2).transpose(1, 2)  # (B, D, g, g) -> (B, g*g, D)
        return tokens if keep is None else take_patches(tokens, keep)

    def grid(self, x: Tensor) -> int:
        """The side of `x`'s patch grid, once `x` is checked to be images this embedding takes."""
        if not x.is_floating_point():  # uint8 pixels would fail deep in a product, unexplained
            raise ValueError(
                f"expected float images, normalised as the model was trained, got {x.dtype}. "
                "Convert uint8 pixels with vit.data.datasets.preprocess(images, normalization) "
                "(the normalization a checkpoint records: vit.data.datasets."
                "recorded_normalization)."
            )
        if x.ndim != 4 or x.shape[1:] != (self.in_chans, self.img_size, self.img_size):
            if not self._takes_dynamic(x):
                raise ValueError(
                    f"expected images of shape (B, {self.in_chans}, {self.img_size}, "
                    f"{self.img_size}), got {tuple(x.shape)}. Resize or convert the input, or "
                    f"build the model with img_size/in_chans matching it (checkpoints can be "
                    f"loaded at another image size)."
                )
        return x.shape[-1] // self.patch_size

    def _shifted_patches(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, g*g, 5*C*p*p): each patch of the image and of its 4 shifted copies.

        F.pad with a negative width crops: (s, -s, s, -s) moves the image s pixels right and
        down. The flattened order within a patch is (channel, row, column), as a convolution's
        weight is laid out.
        """
        p, s = self.patch_size, self.patch_size // 2
        x = torch.cat([F.pad(x, (dx * s, -dx * s, dy * s, -dy * s)) for dx, dy in SPT_SHIFTS], 1)
        return rearrange(x, "b c (gh p1) (gw p2) -> b (gh gw) (c p1 p2)", p1=p, p2=p)

    def _takes_dynamic(self, x: Tensor) -> bool:
        """With dynamic_img_size: a square (B, C, s, s) batch with s a multiple of the patch."""
        return (
            self.dynamic_img_size
            and x.ndim == 4
            and x.shape[1] == self.in_chans
            and x.shape[-2] == x.shape[-1]
            and x.shape[-1] % self.patch_size == 0
        )


def sinusoidal_table(num_positions: int, dim: int, *, base: float = 10000.0) -> Tensor:
    """The fixed table of "Attention is all you need": (num_positions, dim).

    PE[pos, 2i] = sin(pos / base^(2i/dim)),  PE[pos, 2i+1] = cos(pos / base^(2i/dim)).
    """
    if dim % 2 != 0:
        raise ValueError(f"sinusoidal positions need an even width, got embed_dim={dim}.")
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table.float()


def sincos_2d_table(grid: int, dim: int, *, base: float = 10000.0) -> Tensor:
    """A 2-D sine-cosine table for a grid x grid patch grid, row by row: (grid*grid, dim).

    A quarter of the width each for sin(x w), cos(x w), sin(y w), cos(y w), with x the column, y
    the row and w = base^(-k / (dim/4)) for k = 0 .. dim/4 - 1 (MoCo v3, arXiv:2104.02057; "Better
    plain ViT baselines", arXiv:2205.01580). Neighbouring patches get similar vectors in both
    directions, so the table stays smooth when resize_pos_embed interpolates it to another grid.
    """
    if dim % 4 != 0:
        raise ValueError(
            f"2-D sine-cosine positions need a width divisible by 4, got embed_dim={dim}; "
            f"pick a multiple of 4 (e.g. 192) or keep pos_init='trunc_normal'."
        )
    quarter = dim // 4
    freq = base ** (-torch.arange(quarter, dtype=torch.float64) / quarter)  # (dim/4,)
    y, x = torch.meshgrid(
        torch.arange(grid, dtype=torch.float64),
        torch.arange(grid, dtype=torch.float64),
        indexing="ij",
    )
    x_freq = x.reshape(-1, 1) * freq  # (g*g, dim/4)
    y_freq = y.reshape(-1, 1) * freq
    table = torch.cat([x_freq.sin(), x_freq.cos(), y_freq.sin(), y_freq.cos()], dim=1)
    return table.float()


def resize_pos_embed(pos_embed: Tensor, *, new_grid: int, num_prefix_tokens: int = 1) -> Tensor:
    """Resize learned positions (1, prefix + g*g, D) to a new g' x g' patch grid, keeping prefix tokens."""
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    old_grid = int(round(grid.shape[1] ** 0.5))
    if old_grid * old_grid != grid.shape[1]:
        raise ValueError(f"position table has {grid.shape[1]} patch entries, not a square grid.")
    if old_grid == new_grid:
        return pos_embed
    grid = grid.reshape(1, old_grid, old_grid, -1).permute(0, 3, 1, 2)  # (1, D, g, g)
    grid = nn.functional.interpolate(
        grid.float(), size=(new_grid, new_grid), mode="bicubic", align_corners=False
    ).to(pos_embed.dtype)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, -1)
    return torch.cat([prefix, grid], dim=1)


def keep_index(
    batch: int, num_patches: int, rate: float, *, device: torch.device | str | None = None
) -> Tensor | None:
    """Which patches each image keeps under patch dropout: (B, keep) indices, or None when the
    rate drops none.

    Patch dropout (Liu et al. 2022, arXiv:2208.07220; timm's `patch_drop_rate`): a training-time
    cut of the sequence, int(N * (1 - rate)) of the N patches kept (at least one), drawn
    independently per image, on `device` (a GPU draws its own). Each kept patch takes its own
    position vector (take_patches), so it still knows where it came from; attention does not
    depend on token order, so the kept patches are not re-sorted.
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"patch drop rate {rate} must be in [0, 1); it is the fraction dropped.")
    keep = max(1, int(num_patches * (1.0 - rate)))
    if keep == num_patches:  # rate 0, or too few patches to drop one
        return None
    return torch.rand(batch, num_patches, device=device).argsort(dim=1)[:, :keep]


def take_patches(rows: Tensor, keep: Tensor) -> Tensor:
    """(B, N, F) rows per patch (or (1, N, F), shared by the batch) and (B, K) indices from
    keep_index -> (B, K, F): each image's kept rows, in the order of `keep`."""
    rows = rows.expand(keep.shape[0], -1, -1)
    return rows.gather(1, keep.unsqueeze(-1).expand(-1, -1, rows.shape[-1]))
