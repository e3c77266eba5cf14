"""The accuracy metrics ViTClassifier logs: top-1 and top-5 per stage, as torchmetrics objects."""

from __future__ import annotations

from torch import nn
from torchmetrics.classification import MulticlassAccuracy

STAGES = ("train", "val", "test")


def accuracy_metrics(num_classes: int) -> tuple[list[int], nn.ModuleDict]:
    """The k of each top-k accuracy (1 and 5, or 1 and num_classes where there are fewer), and
    one metric object per stage and k, keyed "{stage}_acc{k}", saved in checkpoints."""
    top_ks = sorted({1, min(5, num_classes)})
    # One object per stage and k, so that states never mix (Lightning's advice).
    # average="micro": the fraction of images right, as vit-evaluate and timm report it
    # (torchmetrics' default, "macro", is the mean of the per-class accuracies).
    metrics = nn.ModuleDict(
        {
            f"{stage}_acc{k}": MulticlassAccuracy(
                num_classes=num_classes,
                top_k=k,
                average="micro",
                # its label check (torch.unique) makes a GPU wait on every step; training
                # labels come from the data module, so only evaluation checks them
                validate_args=stage != "train",
            )
            for stage in STAGES
            for k in top_ks
        }
    )
    for metric in metrics.values():
        metric.persistent(True)  # saved in checkpoints: a mid-epoch resume keeps its counts
    return top_ks, metrics
