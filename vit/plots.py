"""Figures: confusion matrix, attention overlays and map grids. Matplotlib (headless) and torch."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display needed; figures are written to files
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from torch import Tensor  # noqa: E402


def save_figure(fig: Figure, path, **savefig_kwargs) -> None:
    """Write a figure to a file and close it, so that a script writing many keeps none open."""
    try:
        fig.savefig(path, **savefig_kwargs)
    finally:
        plt.close(fig)


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


def _show_image(ax: plt.Axes, image: Tensor) -> None:
    """Draw a (3, H, W) uint8 or [0, 1] float image."""
    img = image.detach().cpu()
    img = img.float() / 255 if img.dtype == torch.uint8 else img.float().clamp(0, 1)
    ax.imshow(img.permute(1, 2, 0).numpy(), interpolation="nearest")
    ax.axis("off")


def upsample(maps: Tensor, size: tuple[int, int]) -> Tensor:
    """(B, g_h, g_w) patch maps -> (B, H, W), bilinear (smooth) to the image size."""
    return F.interpolate(maps[:, None].float(), size=size, mode="bilinear", align_corners=False)[
        :, 0
    ]


def plot_overlays(
    images: Tensor, maps: Tensor, *, titles: list[str], alpha: float = 0.5, cmap: str = "jet"
) -> Figure:
    """A row per image: the image, and the image with the map overlaid (upsampled smoothly)."""
    heat = upsample(maps, tuple(images.shape[-2:]))
    fig, axes = plt.subplots(len(images), 2, figsize=(4.2, 2.1 * len(images)), squeeze=False)
    for row, (image, h, title) in enumerate(zip(images, heat, titles, strict=True)):
        _show_image(axes[row, 0], image)
        axes[row, 0].set_title(title, fontsize=8)
        _show_image(axes[row, 1], image)
        axes[row, 1].imshow(h.cpu().numpy(), cmap=cmap, alpha=alpha, vmin=0, vmax=1)
        axes[row, 1].set_title("rollout", fontsize=8)
    fig.tight_layout()
    return fig


def plot_map_grid(
    image: Tensor, maps: Tensor, *, title: str, row_labels: list[str], col_labels: list[str]
) -> Figure:
    """The image, then a grid of patch maps (rows x cols x g_h x g_w), each scaled to its own max."""
    rows, cols = maps.shape[:2]
    fig, axes = plt.subplots(rows, cols + 1, figsize=(1.5 * (cols + 1), 1.5 * rows), squeeze=False)
    for r in range(rows):
        if r == 0:
            _show_image(axes[0, 0], image)
        else:
            axes[r, 0].axis("off")
        for c in range(cols):
            ax = axes[r, c + 1]
            m = maps[r, c].float().cpu()
            ax.imshow(
                (m / m.max().clamp(min=1e-12)).numpy(), cmap="viridis", interpolation="nearest"
            )
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(col_labels[c], fontsize=7)
            if c == 0:
                ax.set_ylabel(row_labels[r], fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_learning_curves(
    curves: dict[str, tuple[list[float], list[float]]],
    *,
    title: str = "",
    ylabel: str = "val/acc",
    xlabel: str = "wall-clock minutes of training",
) -> Figure:
    """One line per run: y (e.g. validation accuracy) against wall-clock minutes (or steps)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (minutes, values) in curves.items():
        ax.plot(minutes, values, marker="o", markersize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig
