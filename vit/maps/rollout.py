"""Look inside: per-layer attention weights, CLS maps, attention rollout (https://arxiv.org/abs/2005.00928)
and gradient-weighted rollout. Torch only; works on any model with `forward_with_attention`.

Shapes: B images, H heads, N = prefix + P tokens, P = g_h * g_w patches.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vit.maps.capture import HeadFusion, attention_maps, fuse_heads, patch_grid, query_map


def discard_lowest(a: Tensor, ratio: float, *, num_prefix_tokens: int = 1) -> Tensor:
    """Zero the lowest `ratio` of each image's (B, N, N) weights, never the prefix (CLS) entries:
    entries in a prefix token's row or column are kept, so the CLS path is never cut."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"discard_ratio={ratio} must be in [0, 1).")
    p = num_prefix_tokens
    body = a[:, p:, p:].flatten(1)  # (B, P*P) patch-to-patch entries; flatten: B may be 0
    k = int(body.shape[1] * ratio)
    if k == 0:  # ratio 0, or too few entries to drop one
        return a
    lowest = body.topk(k, dim=-1, largest=False).indices
    body = body.scatter(-1, lowest, 0.0).reshape(a.shape[0], a.shape[1] - p, a.shape[2] - p)
    out = a.clone()
    out[:, p:, p:] = body
    return out


def rollout(
    maps: list[Tensor],
    *,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    num_prefix_tokens: int = 1,
) -> Tensor:
    """Attention rollout: (B, N, N) joint attention from layer `start_layer` to the last.

    Per layer: fuse heads, drop the lowest weights (optional), add the identity for the residual
    path, renormalise rows to sum to 1; then multiply layer by layer: joint = A_L ... A_start.
    """
    _check_start(start_layer, len(maps))
    fused = [
        discard_lowest(
            fuse_heads(w, head_fusion), discard_ratio, num_prefix_tokens=num_prefix_tokens
        )
        for w in maps[start_layer:]
    ]
    return roll_out(fused)


def roll_out(layers: list[Tensor]) -> Tensor:
    """Multiply per-layer (B, N, N) matrices, each with the identity added and rows renormalised."""
    joint = None
    for a in layers:
        a = a + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)  # the residual path
        a = a / a.sum(dim=-1, keepdim=True)  # keepdim: divide each row by its own sum
        joint = a if joint is None else a @ joint  # later layers act on the result of earlier ones
    return joint


def rollout_map(
    maps: list[Tensor], *, grid: tuple[int, int], num_prefix_tokens: int = 1, **kwargs
) -> Tensor:
    """Rollout read on the patch grid, (B, g_h, g_w), normalised to max 1 per image: the CLS
    token's row of the joint attention, or without prefix tokens (mean pooling,
    num_prefix_tokens=0) the mean of the patch rows, as the pooled output averages them. Pass
    the model's own `model.num_prefix_tokens`; `kwargs` go to `rollout`."""
    joint = rollout(maps, num_prefix_tokens=num_prefix_tokens, **kwargs)
    return _max_one(query_map(joint, grid=grid, num_prefix_tokens=num_prefix_tokens))


def grad_rollout(
    model: nn.Module,
    images: Tensor,
    *,
    target: Tensor | int | None = None,
    start_layer: int = 0,
) -> tuple[Tensor, Tensor]:
    """Gradient-weighted rollout for a class (default: the predicted one): (logits, (B, g, g) map).

    Each layer's weights are multiplied by the positive part of the gradient of the class score
    with respect to those same weights (layer l with grad l), averaged over heads, then rolled out
    like `rollout`. It turns gradients on itself, so it works under torch.no_grad and
    inference_mode too (tested).
    """
    with torch.inference_mode(False), torch.enable_grad():
        # clone: a normal tensor, not an inference one; grad: the graph to the maps
        logits, maps = attention_maps(model, images.clone(), grad=True)
        _check_start(start_layer, len(maps))
        if target is None:
            target = logits.argmax(dim=-1)
        target = torch.as_tensor(target, device=logits.device).expand(logits.shape[0])
        score = logits.gather(1, target[:, None]).sum()
        grads = torch.autograd.grad(score, maps)  # grads[l] pairs with maps[l]
    cams = [(w * g.clamp(min=0)).mean(dim=1).detach() for w, g in zip(maps, grads, strict=True)]
    joint = roll_out(cams[start_layer:])
    m = query_map(joint, grid=patch_grid(model), num_prefix_tokens=model.num_prefix_tokens)
    return logits.detach(), _max_one(m)


def _check_start(start_layer: int, depth: int) -> None:
    if not 0 <= start_layer < depth:
        raise ValueError(
            f"start_layer={start_layer} must be in [0, {depth}) for a {depth}-layer model."
        )


def _max_one(m: Tensor) -> Tensor:
    """Scale each (g_h, g_w) map so that its largest value is 1."""
    return m / m.flatten(1).amax(dim=1).clamp(min=1e-12)[:, None, None]
