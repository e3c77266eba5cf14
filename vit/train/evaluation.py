"""Score a model on a data loader: top-1, top-5, per-class accuracy, the confusion matrix, and
how well its confidence matches its accuracy (calibration). Torch only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# confidence bins of the expected calibration error: 15, as Guo et al. 2017 ("On Calibration of
# Modern Neural Networks", https://arxiv.org/abs/1706.04599) and torchmetrics' default
CALIBRATION_BINS = 15


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
    Beside the accuracies: `nll`, the mean negative log-likelihood of the true class; `ece`, the
    expected calibration error (`calibration_bins`); `calibration`, its bins, for a reliability
    diagram.
    """
    model.eval()
    device = next(model.parameters()).device
    num_classes = len(classes)
    confusion = torch.zeros(
        num_classes, num_classes, dtype=torch.long
    )  # rows: true, cols: predicted
    top5_hits, total, nll = 0, 0, 0.0
    bins = torch.zeros(3, CALIBRATION_BINS, dtype=torch.float64)  # images, confidence, correct
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
        nll += F.cross_entropy(logits, labels, reduction="sum").item()
        bins += calibration_bins(logits, pred, labels)
        total += labels.numel()
    if total == 0:
        raise ValueError("the data loader yielded no images; check the split and data_dir.")
    per_class = confusion.diag() / confusion.sum(dim=1).clamp(min=1)
    return {
        "num_images": total,
        "top1": confusion.diag().sum().item() / total,
        f"top{k}": top5_hits / total,
        "per_class": {name: acc for name, acc in zip(classes, per_class.tolist(), strict=True)},
        "nll": nll / total,
        **calibration_summary(bins),
        "confusion_matrix": confusion.tolist(),
    }


def calibration_bins(logits: Tensor, pred: Tensor, labels: Tensor) -> Tensor:
    """(3, CALIBRATION_BINS) float64 sums over a batch: images, confidence and correct answers
    per bin of the confidence, the softmax probability of the predicted class `pred` (the
    logits' argmax, as top-1 counts it). Bin m holds confidences in (m/M, (m+1)/M], as Guo et al.
    define them."""
    confidence = logits.double().softmax(dim=-1).gather(-1, pred[:, None])[:, 0]
    index = (confidence * CALIBRATION_BINS).ceil().long().sub(1).clamp(0, CALIBRATION_BINS - 1)
    parts = torch.stack([torch.ones_like(confidence), confidence, (pred == labels).double()])
    return torch.zeros(3, CALIBRATION_BINS, dtype=torch.float64).index_add_(1, index, parts)


def calibration_summary(bins: Tensor) -> dict[str, Any]:
    """The expected calibration error of calibration_bins' sums (the mean gap between confidence
    and accuracy, bins weighted by their images), and each bin's images, mean confidence and
    accuracy (None where a bin is empty)."""
    count, confidence, correct = bins
    gap = (confidence - correct).abs()  # count * |mean confidence - accuracy|; 0 where empty
    images = count.tolist()
    per_bin = {
        name: [s / n if n else None for s, n in zip(sums.tolist(), images, strict=True)]
        for name, sums in (("confidence", confidence), ("accuracy", correct))
    }
    return {
        "ece": (gap.sum() / count.sum()).item(),
        "calibration": {"bins": CALIBRATION_BINS, "images": [int(n) for n in images], **per_bin},
    }
