"""A model as a whole, as the ViT paper looks at it (https://arxiv.org/abs/2010.11929, Fig. 7):
how far each head attends, the patch projection's principal filters, the position vectors'
similarity. Torch only; the figures are in vit/maps/inspect_plots.py.

Shapes: L layers, H heads, N = prefix + P tokens, P = g_h * g_w patches of p x p pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.maps.capture import attention_maps, patch_grid

TINY = torch.finfo(torch.float64).tiny  # a row with no weight on patches gives distance 0


def patch_distances(grid: tuple[int, int]) -> Tensor:
    """(P, P) float64: the Euclidean distance between patch centres, in patches, row-major."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=-1).double()  # (P, 2)
    return (centres[:, None] - centres[None]).pow(2).sum(-1).sqrt()


def attention_distance(
    maps: list[Tensor], *, grid: tuple[int, int], num_prefix_tokens: int = 1
) -> Tensor:
    """(L, H) float64: each head's mean attention distance in patches, over images and patch queries.

    For a patch query, the distance is the attention-weighted mean distance to the patches it
    attends to; its weights on the prefix (CLS) keys are left out and the rest renormalised, as
    those keys have no place on the image (`cls_share` says how much weight that is).
    """
    distances = patch_distances(grid)
    p = num_prefix_tokens
    out = []
    for w in maps:  # (B, H, N, N)
        a = w[..., p:, p:].double()  # (B, H, P, P): patch queries, patch keys
        _check_grid(a.shape[-1], grid)
        a = a / a.sum(dim=-1, keepdim=True).clamp(min=TINY)
        out.append((a * distances.to(a.device)).sum(dim=-1).mean(dim=(0, 2)).cpu())  # (H,)
    return torch.stack(out)


def cls_share(maps: list[Tensor], *, num_prefix_tokens: int = 1) -> Tensor:
    """(L, H) float64: the mean weight patch queries give to the prefix (CLS) keys; 0 without."""
    p = num_prefix_tokens
    return torch.stack([w[..., p:, :p].double().sum(dim=-1).mean(dim=(0, 2)).cpu() for w in maps])


@dataclass(frozen=True)
class AttentionDistance:
    """Mean attention distance of every head, averaged over `images` images."""

    patches: Tensor  # (L, H) in patches
    cls_share: Tensor  # (L, H): patch queries' weight on the CLS key, left out of `patches`
    patch_size: int  # pixels per patch side: pixels = patches * patch_size
    uniform: float  # in patches: a head attending evenly to all patches (the grid's mean distance)
    images: int
    num_prefix_tokens: int = 1  # keys left out: 1 for a CLS token, 0 for a mean-pooled model

    @property
    def pixels(self) -> Tensor:
        return self.patches * self.patch_size


def mean_attention_distance(
    model: nn.Module, images: Tensor, *, batch_size: int = 128
) -> AttentionDistance:
    """Mean attention distance of each head of `model` over normalised images (B, 3, H, W), in
    batches of `batch_size`; the model is put in eval mode for it (no dropout) and back."""
    if images.ndim != 4 or images.shape[0] == 0:
        raise ValueError(f"expected a non-empty batch (B, C, H, W), got {tuple(images.shape)}.")
    grid, prefix = patch_grid(model), model.num_prefix_tokens
    was_training = model.training
    model.eval()
    total = share = None
    try:
        with torch.inference_mode():
            for chunk in images.split(batch_size):
                maps = attention_maps(model, chunk)[1]
                n = chunk.shape[0]  # weight each batch's mean by its size
                d = attention_distance(maps, grid=grid, num_prefix_tokens=prefix) * n
                s = cls_share(maps, num_prefix_tokens=prefix) * n
                total, share = (d, s) if total is None else (total + d, share + s)
    finally:
        model.train(was_training)
    b = images.shape[0]
    return AttentionDistance(
        patches=total / b,
        cls_share=share / b,
        patch_size=model.patch_embed.patch_size,
        uniform=float(patch_distances(grid).mean()),
        images=b,
        num_prefix_tokens=prefix,
    )


def patch_filters(model: nn.Module) -> Tensor:
    """(D, S, C, p, p) float64: the patch projection's filters, one per output feature; S = 1, or
    the 5 shifted copies (vit.model.embed.SPT_SHIFTS) with shifted patch tokenization."""
    embed = model.patch_embed
    w = embed.proj.weight.detach().double()  # Conv2d: (D, C, p, p); Linear (spt): (D, 5*C*p*p)
    if embed.spt:
        # LayerNorm's per-input scale multiplies what the projection sees: fold it into the filter
        w = w * embed.norm.weight.detach().double()
    p = embed.patch_size
    return w.reshape(w.shape[0], -1, embed.in_chans, p, p)


def filter_components(model: nn.Module, *, k: int = 28) -> tuple[Tensor, Tensor]:
    """The leading `k` principal components of the patch filters, (k, S, C, p, p), and the share
    of the filters' variance each explains, (k,); float64.

    PCA of the D filters as points in S*C*p*p space: centred, then the SVD's right singular
    vectors. A component's sign is arbitrary; each is flipped so its largest entry is positive.
    """
    filters = patch_filters(model)
    if k < 1:
        raise ValueError(f"k={k} components: ask for at least 1.")
    flat = filters.flatten(1)
    centred = flat - flat.mean(dim=0)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    k = min(k, vh.shape[0])
    var = s.pow(2)
    comps = vh[:k]
    peak = comps.gather(1, comps.abs().argmax(dim=1, keepdim=True))  # (k, 1)
    comps = comps * torch.where(peak < 0, -1.0, 1.0)
    return comps.reshape(k, *filters.shape[1:]), var[:k] / var.sum().clamp(min=TINY)


def position_similarity(model: nn.Module) -> Tensor:
    """(P, P) float64: the cosine similarity of each patch position's vector with every other's
    (row i: position i against all, row-major on the grid); the CLS position is left out."""
    pos = model.pos_embed.detach()[0, model.num_prefix_tokens :].double()  # (P, D)
    _check_grid(pos.shape[0], patch_grid(model))
    unit = F.normalize(pos, dim=-1)
    return unit @ unit.T


def _check_grid(patches: int, grid: tuple[int, int]) -> None:
    if patches != grid[0] * grid[1]:
        raise ValueError(f"{patches} patch tokens, but grid {grid} has {grid[0] * grid[1]}.")
