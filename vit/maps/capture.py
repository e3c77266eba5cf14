"""Attention weights from a model: per layer, per query, heads fused."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Literal

import torch
from torch import Tensor, nn

HeadFusion = Literal["mean", "max", "min"]


def attention_maps(
    model: nn.Module, images: Tensor, *, grad: bool = False
) -> tuple[Tensor, list[Tensor]]:
    """Logits and every layer's attention weights (B, H, N, N), after softmax, in one forward.

    Batched, per call, whatever kernel the model's forward uses: the model's
    `forward_with_attention` runs the explicit path, whose logits equal forward's (tested).
    By default no autograd graph is built: plain tensors, ready for numpy and matplotlib, and no
    activations kept. `grad=True` keeps the graph (where gradients are enabled), for gradients
    with respect to the maps, as grad_rollout takes them.
    """
    if not hasattr(model, "forward_with_attention"):
        raise ValueError(
            f"{type(model).__name__} has no forward_with_attention(); pass a "
            f"vit.model.VisionTransformer (vit.io.load.load_model reads one from a checkpoint)."
        )
    with nullcontext() if grad else torch.no_grad():
        return model.forward_with_attention(images)


def patch_grid(model: nn.Module) -> tuple[int, int]:
    """(rows, cols) of the model's patch grid."""
    g = model.patch_embed.grid_size
    return (g, g)


def query_map(weights: Tensor, *, grid: tuple[int, int], num_prefix_tokens: int = 1) -> Tensor:
    """What the model's pooled output looks at, per head, on the patch grid: (..., g_h, g_w).

    With a CLS token: the CLS query's row over the patch keys. Without one (mean pooling), the
    output is the mean of all patch tokens, so the map is the mean over the patch query rows of
    their attention to each patch. Input: (..., N, N) weights, e.g. (B, H, N, N).
    """
    keys = weights[..., num_prefix_tokens:]  # (..., N, P)
    if keys.shape[-1] != grid[0] * grid[1]:
        raise ValueError(
            f"weights have {keys.shape[-1]} patch keys, grid {grid} needs {grid[0] * grid[1]}. "
            f"With num_prefix_tokens={num_prefix_tokens}; pass the model's own "
            f"(model.num_prefix_tokens: 1 with a CLS token, 0 without, as with mean pooling)."
        )
    row = (
        keys[..., 0, :] if num_prefix_tokens > 0 else keys[..., num_prefix_tokens:, :].mean(dim=-2)
    )
    return row.reshape(*row.shape[:-1], *grid)


def fuse_heads(weights: Tensor, mode: HeadFusion = "mean") -> Tensor:
    """(B, H, N, N) -> (B, N, N) by mean, max or min over heads."""
    if mode == "mean":
        return weights.mean(dim=1)
    if mode == "max":
        return weights.amax(dim=1)
    if mode == "min":
        return weights.amin(dim=1)
    raise ValueError(f"head_fusion={mode!r} must be 'mean', 'max' or 'min'.")
