"""Figures of a model as a whole (vit/maps/inspection.py's numbers): attention distance by depth,
the patch filters' principal components, the positions' similarity, attention over training.

Each figure has labelled axes with units and a caption; colour maps are viridis (its lightness
rises steadily, so a greyscale print keeps the order) and heads differ by marker, not colour.
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure
from torch import Tensor

from vit.maps.inspection import AttentionDistance
from vit.maps.plots import _show_image, _subplots, upsample
from vit.model.embed import SPT_SHIFTS

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
CMAP = "viridis"
SHIFT_NAMES = ("image", "right-down", "left-down", "right-up", "left-up")  # SPT_SHIFTS' order
assert len(SHIFT_NAMES) == len(SPT_SHIFTS)


def _caption(fig: Figure, text: str, *, height: float = 0.16) -> None:
    """A caption under the axes, wrapped to the figure's width."""
    fig.tight_layout(rect=(0, height, 1, 1))
    fig.text(0.02, height - 0.02, text, ha="left", va="top", fontsize=7.5, wrap=True)


def plot_attention_distance(result: AttentionDistance, *, title: str = "") -> Figure:
    """Each head's mean attention distance (pixels; patches on the right axis) against its layer."""
    pixels = result.pixels
    depth, heads = pixels.shape
    fig, ax = _subplots(figsize=(6.0, 4.6))
    offsets = torch.linspace(-0.18, 0.18, heads) if heads > 1 else torch.zeros(1)
    for h in range(heads):
        ax.scatter(
            torch.arange(depth) + offsets[h],  # layers from 0, as every other figure names them
            pixels[:, h],
            marker=MARKERS[h % len(MARKERS)],
            facecolors="none" if h % 2 else "black",
            edgecolors="black",
            s=36,
            label=f"head {h}",
        )
    uniform = result.uniform * result.patch_size
    ax.axhline(uniform, color="0.4", linestyle="--", linewidth=1)
    ax.text(depth - 0.55, uniform, "uniform\nattention", fontsize=7, va="center", color="0.3")
    ax.set_xlim(-0.5, depth + 0.2)
    ax.set_ylim(0, max(float(pixels.max()), uniform) * 1.12)
    ax.set_xticks(range(depth))
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    p = result.patch_size
    right = ax.secondary_yaxis("right", functions=(lambda y: y / p, lambda y: y * p))
    right.set_ylabel(f"(patches of {p} px)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncols=min(heads, 4))
    ax.set_title(title or "How far each head looks", fontsize=10)
    keys = "weight on the CLS token left out" if result.num_prefix_tokens else "no CLS token"
    _caption(
        fig,
        f"Each marker is one head: the distance between a patch and the patches it attends to, "
        f"weighted by attention and averaged over all patch queries of {result.images} images "
        f"({keys}). 0 means a head looks only at its own patch; the "
        f"dashed line is a head that looks at every patch equally. After Dosovitskiy et al. "
        f"2020, Fig. 7 (right).",
    )
    return fig


def filter_mosaic(components: Tensor) -> Tensor:
    """(k, S, C, p, p) components -> (k, p, S*(p+1)-1, C) images in [0, 1]: each component's S
    copies side by side with a 1-pixel white gap, scaled together to their own range."""
    k, s, _, p, _ = components.shape
    low = components.flatten(1).amin(dim=1)[:, None, None, None, None]
    high = components.flatten(1).amax(dim=1)[:, None, None, None, None]
    scaled = (components - low) / (high - low).clamp(min=1e-12)
    out = torch.ones(k, p, s * (p + 1) - 1, components.shape[2], dtype=scaled.dtype)
    for i in range(s):
        out[:, :, i * (p + 1) : i * (p + 1) + p] = scaled[:, i].permute(0, 2, 3, 1)
    return out


def plot_filter_components(components: Tensor, ratio: Tensor, *, title: str = "") -> Figure:
    """The patch projection's leading principal components as RGB patches, 7 to a row."""
    k, shifts = components.shape[:2]
    cols = min(k, 7 if shifts == 1 else 4)  # a shifted-token cell is 5 patches wide
    rows = math.ceil(k / cols)
    mosaic = filter_mosaic(components).float()
    if mosaic.shape[-1] == 1:
        mosaic = mosaic.expand(-1, -1, -1, 3)  # one channel: grey
    cell = 1.1 if shifts == 1 else 2.0
    fig, axes = _subplots(
        rows,
        cols,
        figsize=(cell * cols, (1.1 if shifts == 1 else 0.75) * rows + 1.6),
        squeeze=False,
    )
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < k:
            ax.imshow(mosaic[i].numpy(), interpolation="nearest")
            ax.set_title(f"PC{i + 1}: {float(ratio[i]):.1%}", fontsize=7)
    fig.suptitle(title or "What the patch projection looks for", fontsize=10)
    shift_text = (
        f" Each cell shows the component on the image, then on its 4 copies shifted by half a "
        f"patch ({', '.join(SHIFT_NAMES[1:])}): shifted patch tokenization."
        if shifts > 1
        else ""
    )
    _caption(
        fig,
        f"The principal components of the {components.shape[-1]}x{components.shape[-1]}-pixel "
        f"filters that turn a patch into a token, with the share of the filters' variance each "
        f"explains; each is scaled to its own range (grey = 0 when the range is symmetric)."
        f"{shift_text} After Dosovitskiy et al. 2020, Fig. 7 (left).",
        height=0.22,
    )
    return fig


def similarity_mosaic(similarity: Tensor, grid: tuple[int, int]) -> Tensor:
    """(P, P) -> one (g_h*(g_h+1)-1, g_w*(g_w+1)-1) image: position (i, j)'s map at block (i, j),
    blocks apart by a NaN line (drawn blank)."""
    gh, gw = grid
    out = torch.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), float("nan"), dtype=torch.float64)
    maps = similarity.reshape(gh, gw, gh, gw)
    for i in range(gh):
        for j in range(gw):
            out[i * (gh + 1) : i * (gh + 1) + gh, j * (gw + 1) : j * (gw + 1) + gw] = maps[i, j]
    return out


def plot_position_similarity(similarity: Tensor, grid: tuple[int, int], *, title="") -> Figure:
    """For each patch position, its vector's cosine similarity with every position's, on the grid."""
    gh, gw = grid
    fig, ax = _subplots(figsize=(5.6, 5.9))
    low = min(float(similarity.min()), 0.99)  # the data's range: tables often share a direction
    image = ax.imshow(similarity_mosaic(similarity, grid).numpy(), cmap=CMAP, vmin=low, vmax=1)
    ax.set_xticks([j * (gw + 1) + (gw - 1) / 2 for j in range(gw)], [str(j) for j in range(gw)])
    ax.set_yticks([i * (gh + 1) + (gh - 1) / 2 for i in range(gh)], [str(i) for i in range(gh)])
    ax.tick_params(length=0, labelsize=7)
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    fig.colorbar(image, ax=ax, shrink=0.8, label="cosine similarity")
    ax.set_title(title or "What the position vectors learned", fontsize=10)
    _caption(
        fig,
        "The small map at row i, column j compares the position vector of the patch at (i, j) "
        "with every patch's: bright where they are alike (colours span the lowest similarity to 1, "
        "the same direction). A grid that learned its geometry shows "
        "a bright spot at each map's own place, fading with distance. After Dosovitskiy et al. "
        "2020, Fig. 7 (centre).",
    )
    return fig


def plot_training_strip(
    image: Tensor,
    rollouts: Tensor,
    layers: Tensor,
    *,
    labels: list[str],
    title: str = "",
    num_prefix_tokens: int = 1,
) -> Figure:
    """One image's attention across checkpoints: rollout overlaid on it (top row), then each
    layer's pooled-query map (heads averaged: the CLS row, or with `num_prefix_tokens=0` the mean
    of the patch rows); a column per checkpoint. rollouts: (K, g, g), layers: (K, L, g, g), both for
    uint8 `image` (3, H, W)."""
    count, depth = layers.shape[:2]
    fig, axes = _subplots(
        depth + 1, count + 1, figsize=(1.35 * (count + 1), 1.35 * (depth + 1) + 0.9), squeeze=False
    )
    heat = upsample(rollouts, tuple(image.shape[-2:]))
    _show_image(axes[0, 0], image)
    axes[0, 0].set_title("image", fontsize=7)
    for r in range(1, depth + 1):
        axes[r, 0].axis("off")
        axes[r, 0].text(0.95, 0.5, f"layer {r - 1}", ha="right", va="center", fontsize=7)
    for c in range(count):
        ax = axes[0, c + 1]
        _show_image(ax, image)
        ax.imshow(heat[c].numpy(), cmap=CMAP, alpha=0.6, vmin=0, vmax=1)
        ax.set_title(labels[c], fontsize=7)
        for r in range(depth):
            m = layers[c, r].float()
            ax = axes[r + 1, c + 1]
            ax.imshow((m / m.max().clamp(min=1e-12)).numpy(), cmap=CMAP, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title or "How attention forms during training", fontsize=10)
    query = "the CLS token" if num_prefix_tokens else "the mean of the patch queries (no CLS token)"
    _caption(
        fig,
        "Columns: checkpoints of one run, in training order. Top: attention rollout over the "
        f"image (bright = attended). Below: what {query} attends to in each layer, heads "
        "averaged, each map scaled to its own maximum.",
        height=0.1,
    )
    return fig


def plot_distance_over_training(
    steps: list[int], distances: Tensor, *, patch_size: int, uniform: float, title: str = ""
) -> Figure:
    """Each layer's mean attention distance (heads averaged) against the checkpoint's step.
    distances: (K, L, H) and `uniform` (a head attending evenly) in patches."""
    per_layer = distances.mean(dim=-1) * patch_size  # (K, L) pixels
    fig, ax = _subplots(figsize=(6.0, 4.2))
    for layer in range(per_layer.shape[1]):
        ax.plot(
            steps,
            per_layer[:, layer],
            marker=MARKERS[layer % len(MARKERS)],
            color=str(0.7 * layer / max(per_layer.shape[1] - 1, 1)),  # greys, dark = first
            label=f"layer {layer}",
        )
    ax.axhline(uniform * patch_size, color="0.4", linestyle="--", linewidth=1, label="uniform")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title or "Attention distance during training", fontsize=10)
    _caption(
        fig,
        "Each line is one layer: its heads' mean attention distance (vit-inspect's "
        "attention_distance.png) at each checkpoint of one run. Dashed: a head that looks at "
        "every patch equally.",
        height=0.1,
    )
    return fig
