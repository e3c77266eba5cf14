"""Figures: the confusion matrix (attention figures join later). Matplotlib, headless."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display needed; figures are written to files
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from torch import Tensor  # noqa: E402


def plot_confusion_matrix(confusion: Tensor, *, classes: list[str], title: str = "") -> Figure:
    """Row-normalised confusion matrix (rows: true class, columns: predicted), counts annotated."""
    counts = confusion.float()
    rates = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    n = len(classes)
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * n, 0.8 + 0.6 * n))
    ax.imshow(rates.numpy(), cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(n), classes, rotation=45, ha="right")
    ax.set_yticks(range(n), classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for i in range(n):
        for j in range(n):
            color = "white" if rates[i, j] > 0.5 else "black"
            ax.text(j, i, f"{int(counts[i, j])}", ha="center", va="center", fontsize=7, color=color)
    ax.set_title(title)
    fig.tight_layout()
    return fig
