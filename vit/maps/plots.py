"""Figures: confusion matrix, reliability diagram, attention overlays and map grids. Matplotlib
(headless) and torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from vit.data.datasets import CIFAR10_NORMALIZATION, Normalization, preprocess
from vit.maps.capture import attention_maps, patch_grid, query_map
from vit.maps.rollout import rollout_map
from vit.model.vision_transformer import VisionTransformer


def _subplots(*grid: int, figsize: tuple[float, float], **kwargs) -> tuple[Figure, Axes]:
    """A Figure of its own, outside pyplot: no backend is chosen for the caller (a notebook keeps
    its inline pictures), and nothing stays open once the figure is dropped."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kwargs)


def save_figure(fig: Figure, path, **savefig_kwargs) -> None:
    """Write a figure to a file (PNG through Agg, whatever backend pyplot uses)."""
    fig.savefig(path, **savefig_kwargs)


# beyond this many classes the cells go unannotated and the figure stops growing: 100 classes
# at the small matrix's 0.6 inch a class made a 7,320-pixel square with 10,000 texts, about 40 s
# of drawing (CIFAR-100), its numbers unreadable at any zoom a screen shows whole
ANNOTATED_CLASSES = 20
LARGEST_SIDE_INCHES = 12.0


def plot_confusion_matrix(confusion: Tensor, *, classes: list[str], title: str = "") -> Figure:
    """Row-normalised confusion matrix (rows: true class, columns: predicted). Up to
    ANNOTATED_CLASSES classes each cell shows its count; with more, a colour bar reads the rates,
    the tick labels shrink and the figure keeps to LARGEST_SIDE_INCHES (the counts stay in
    vit-evaluate's JSON)."""
    counts = confusion.float()
    rates = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    n = len(classes)
    annotated = n <= ANNOTATED_CLASSES
    cell = 0.6 if annotated else min(0.6, LARGEST_SIDE_INCHES / n)
    fig, ax = _subplots(figsize=(1.0 + cell * n + (0 if annotated else 1.0), 0.8 + cell * n))
    shown = ax.imshow(rates.numpy(), cmap="Blues", vmin=0, vmax=1)
    if annotated:
        ax.set_xticks(range(n), classes, rotation=45, ha="right")
        ax.set_yticks(range(n), classes)
        for i in range(n):
            for j in range(n):
                color = "white" if rates[i, j] > 0.5 else "black"
                ax.text(j, i, f"{int(counts[i, j])}", ha="center", va="center", fontsize=7,
                        color=color)  # fmt: skip
    else:  # a label's font fits its cell (72 points an inch): about 7 points at 100 classes
        size = max(2.0, 72 * cell * 0.8)
        ax.set_xticks(range(n), classes, rotation=90, fontsize=size)
        ax.set_yticks(range(n), classes, fontsize=size)
        fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.02).set_label("share of the true class")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_reliability(calibration: dict, *, ece: float, title: str = "") -> Figure:
    """Reliability diagram of evaluate_loader's `calibration`: per confidence bin, the accuracy
    (bars) and the mean confidence (red); a calibrated model's bars end on their red line, on the
    diagonal. Below, the share of images per bin: ECE weighs each bin's gap by it."""
    n = calibration["bins"]
    images = torch.tensor(calibration["images"], dtype=torch.float64)
    filled = [i for i in range(n) if images[i] > 0]
    fig, (top, bottom) = _subplots(
        2, 1, figsize=(4.2, 5.0), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    accuracy = [calibration["accuracy"][i] for i in filled]
    confidence = [calibration["confidence"][i] for i in filled]
    x = [i / n for i in filled]  # each bin's left edge
    top.bar(x, accuracy, width=1 / n, align="edge", color="tab:blue", edgecolor="white",
            label="accuracy")  # fmt: skip
    right = [v + 1 / n for v in x]
    top.hlines(confidence, x, right, colors="tab:red", linewidth=2, label="mean confidence")
    top.plot([0, 1], [0, 1], "k--", linewidth=1, label="calibrated")
    top.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy", title=title or f"ECE {ece:.2%}")
    top.legend(loc="upper left", fontsize=8)
    bottom.bar(x, (images[filled] / images.sum()).tolist(), width=1 / n, align="edge",
               color="tab:gray", edgecolor="white")  # fmt: skip
    bottom.set(xlabel="confidence (softmax of the predicted class)", ylabel="share of images")
    fig.tight_layout()
    return fig


def _show_image(ax: Axes, image: Tensor) -> None:
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
    """A row per image: the image, and the image with the map overlaid (upsampled smoothly),
    with a colour bar: each map is scaled to its own maximum, so the bar reads 0 to 1 of it."""
    heat = upsample(maps, tuple(images.shape[-2:]))
    fig, axes = _subplots(len(images), 2, figsize=(4.8, 2.1 * len(images)), squeeze=False)
    for row, (image, h, title) in enumerate(zip(images, heat, titles, strict=True)):
        _show_image(axes[row, 0], image)
        axes[row, 0].set_title(title, fontsize=8)
        _show_image(axes[row, 1], image)
        shown = axes[row, 1].imshow(h.cpu().numpy(), cmap=cmap, alpha=alpha, vmin=0, vmax=1)
        axes[row, 1].set_title("rollout", fontsize=8)
        bar = fig.colorbar(shown, ax=axes[row, 1], fraction=0.046, pad=0.04)
        bar.set_label("share of the map's max", fontsize=7)
        bar.ax.tick_params(labelsize=6)
    fig.tight_layout()
    return fig


def plot_map_grid(
    image: Tensor, maps: Tensor, *, title: str, row_labels: list[str], col_labels: list[str]
) -> Figure:
    """The image, then a grid of patch maps (rows x cols x g_h x g_w), each scaled to its own max."""
    rows, cols = maps.shape[:2]
    fig, axes = _subplots(rows, cols + 1, figsize=(1.5 * (cols + 1), 1.5 * rows), squeeze=False)
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
    fig, ax = _subplots(figsize=(6, 4))
    for label, (minutes, values) in curves.items():
        ax.plot(minutes, values, marker="o", markersize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def render(
    model: VisionTransformer,
    images: Tensor,
    *,
    classes: list[str],
    labels: Tensor | None,
    layer: int = -1,
    normalization: Normalization = CIFAR10_NORMALIZATION,
    names: list[str] | None = None,
    **rollout_kwargs,
) -> dict[str, object]:
    """Figures for uint8 images, normalized with the model's `normalization`:
    {"rollout": fig, "heads_layerL_i": fig, "layers_heads_i": fig}, each titled by its
    prediction (and label), after the image's name in `names` (its file's) where given."""
    from vit.maps.plots import plot_map_grid, plot_overlays  # matplotlib only when drawing

    was_training = model.training
    model.eval()  # no dropout in the pictures
    with torch.inference_mode():
        logits, maps = attention_maps(model, preprocess(images, normalization))
    model.train(was_training)
    grid, prefix = patch_grid(model), model.num_prefix_tokens
    pred = logits.argmax(dim=-1)
    titles = [
        f"pred: {classes[p]}" + (f" / true: {classes[t]}" if labels is not None else "")
        for p, t in zip(
            pred.tolist(), (labels if labels is not None else pred).tolist(), strict=True
        )
    ]
    rows = titles  # the rollout figure's, one line each unless named
    if names is not None:
        if len(names) != len(images):
            raise ValueError(f"{len(names)} names for {len(images)} images: give one per image.")
        rows = [f"{name}\n{title}" for name, title in zip(names, titles, strict=True)]
        titles = [f"{name}: {title}" for name, title in zip(names, titles, strict=True)]
    roll = rollout_map(maps, grid=grid, num_prefix_tokens=prefix, **rollout_kwargs)
    per_layer = torch.stack([query_map(w, grid=grid, num_prefix_tokens=prefix) for w in maps], 1)
    depth, heads = per_layer.shape[1:3]  # per_layer: (B, layers, heads, g, g)
    layer = layer % depth
    figures: dict[str, object] = {"rollout": plot_overlays(images, roll, titles=rows)}
    head_labels = [f"head {h}" for h in range(heads)]
    for i, title in enumerate(titles):
        figures[f"heads_layer{layer}_{i}"] = plot_map_grid(
            images[i],
            per_layer[i, layer : layer + 1],
            title=f"{title} (layer {layer})",
            row_labels=[f"layer {layer}"],
            col_labels=head_labels,
        )
        figures[f"layers_heads_{i}"] = plot_map_grid(
            images[i],
            per_layer[i],
            title=title,
            row_labels=[f"layer {j}" for j in range(depth)],
            col_labels=head_labels,
        )
    return figures
