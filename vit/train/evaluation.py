"""Score a model on a data loader: top-1, top-5, per-class accuracy and the confusion matrix. Torch only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn


def flip_averaged_logits(model: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """Test-time flip: the mean of the float logits of each image and of its mirror image."""
    return (model(x).float() + model(x.flip(-1)).float()) / 2


@torch.inference_mode()
def evaluate_loader(
    model: nn.Module,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    preprocess: Callable[[Tensor], Tensor],
    classes: list[str],
    dtype: torch.dtype | None = None,
    flip: bool = False,
) -> dict[str, Any]:
    """Run `model` over (uint8 images, labels) batches; return plain-Python metrics.

    `flip` scores the mean of the logits of each image and its mirror image (test-time flip).
    """
    model.eval()
    device = next(model.parameters()).device
    num_classes = len(classes)
    confusion = torch.zeros(
        num_classes, num_classes, dtype=torch.long
    )  # rows: true, cols: predicted
    top5_hits, total = 0, 0
    k = min(5, num_classes)
    for images, labels in loader:
        x = preprocess(images.to(device))
        autocast = (
            torch.autocast(device.type, dtype=dtype)
            if dtype is not None
            else contextlib.nullcontext()
        )
        with autocast:
            logits = (flip_averaged_logits(model, x) if flip else model(x).float()).cpu()
        pred = logits.argmax(dim=-1)
        confusion += torch.bincount(
            labels * num_classes + pred, minlength=num_classes * num_classes
        ).reshape(num_classes, num_classes)
        top5_hits += (logits.topk(k, dim=-1).indices == labels[:, None]).any(dim=-1).sum().item()
        total += labels.numel()
    if total == 0:
        raise ValueError("the data loader yielded no images; check the split and data_dir.")
    per_class = confusion.diag() / confusion.sum(dim=1).clamp(min=1)
    return {
        "num_images": total,
        "top1": confusion.diag().sum().item() / total,
        f"top{k}": top5_hits / total,
        "per_class": {name: acc for name, acc in zip(classes, per_class.tolist(), strict=True)},
        "confusion_matrix": confusion.tolist(),
    }
