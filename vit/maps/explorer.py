"""`vit-explore`: one self-contained HTML page for looking inside a model's attention.

Every number comes from vit.maps here (attention_maps, fuse_heads, query_map, rollout_map,
grad_rollout); the page's script (vit/maps/assets/) only selects and draws. Attention weights are
stored as integers of 1/SCALE (rounded once, here), zlib-compressed and base64-embedded, so 16
CIFAR images of a depth-4 model fit in well under 2 MB and a test can compare values exactly.
"""

from __future__ import annotations

import base64
import io
import json
import re
import zlib
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor

from vit.data.datasets import CIFAR10_NORMALIZATION, Normalization, preprocess
from vit.maps.capture import attention_maps, fuse_heads, patch_grid, query_map
from vit.maps.inspection import filter_components, mean_attention_distance, position_similarity
from vit.maps.rollout import grad_rollout, rollout_map
from vit.model.vision_transformer import VisionTransformer

SCALE = 10_000  # values are stored as round(value * SCALE): 4 decimals, exact to read back


TEMPLATE_DIR = Path(__file__).resolve().parent / "assets"


def quantize(values: Tensor) -> Tensor:
    """round(values * SCALE) as int64: how the page stores every number it shows."""
    return torch.round(values.double() * SCALE).long()


def rounded(values: Tensor) -> list[Any]:
    """Nested lists of floats with 4 decimals (quantize / SCALE), for the page's JSON."""
    return (quantize(values).double() / SCALE).tolist()


def png_data_uri(image: Tensor) -> str:
    """(3, H, W) uint8 -> a data: URI of its PNG, embedded rather than fetched."""
    buffer = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).cpu().numpy()).save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def attention_with_mean(maps: list[Tensor]) -> Tensor:
    """(B, L, H + 1, N, N): each layer's heads and, as head H, their mean (fuse_heads)."""
    return torch.stack([torch.cat([w, fuse_heads(w, "mean")[:, None]], 1) for w in maps], 1)


def explorer_data(
    model: VisionTransformer,
    images: Tensor,
    classes: list[str],
    *,
    labels: Tensor | None = None,
    normalization: Normalization = CIFAR10_NORMALIZATION,
) -> tuple[dict[str, Any], Tensor]:
    """What the page embeds for uint8 images (B, 3, H, W): JSON-ready values, and the attention
    as integers (B, L, H + 1, N, N), flat; for a model without a class token, followed by the
    pooled output's query map (B, L, H + 1, P) (the CLS row's counterpart, vit.maps.query_map)."""
    if len(classes) != model.num_classes:
        raise ValueError(
            f"{len(classes)} class names for a model of {model.num_classes} classes; pass one "
            f"name per output."
        )
    was_training = model.training
    model.eval()  # no dropout in what the page shows
    x = preprocess(images.to(next(model.parameters()).device), normalization)
    grid, prefix = patch_grid(model), model.num_prefix_tokens
    try:
        with torch.inference_mode():
            logits, maps = attention_maps(model, x)
        grad = torch.stack(
            [grad_rollout(model, x, target=c)[1].flatten(1) for c in range(len(classes))], 1
        ).cpu()  # (B, C, P): gradient rollout for every class
    finally:
        model.train(was_training)
    maps = [w.float().cpu() for w in maps]
    attention = attention_with_mean(maps)
    stored = [quantize(attention).flatten()]
    if prefix == 0:  # no CLS row: what the mean-pooled output looks at, per layer and head
        stored.append(quantize(query_map(attention, grid=grid, num_prefix_tokens=0)).flatten())
    roll = rollout_map(maps, grid=grid, num_prefix_tokens=prefix).flatten(1)  # (B, P)
    whole = whole_model_data(model, x)
    probs = logits.float().cpu().softmax(dim=-1)
    meta = {
        "classes": list(classes),
        "grid": list(grid),
        "prefix": prefix,
        "depth": attention.shape[1],
        "heads": attention.shape[2] - 1,
        "tokens": attention.shape[-1],
        "scale": SCALE,
        "whole": whole,
        "images": [
            {
                "src": png_data_uri(images[i]),
                "label": None if labels is None else int(labels[i]),
                "pred": int(probs[i].argmax()),
                "probs": rounded(probs[i]),
                "rollout": rounded(roll[i]),
                "grad": rounded(grad[i]),
            }
            for i in range(images.shape[0])
        ],
    }
    return meta, torch.cat(stored)


def whole_model_data(model: VisionTransformer, x: Tensor, *, components: int = 16) -> dict:
    """The page's panel on the model as a whole (vit.maps.inspection): each head's mean attention
    distance over the page's images `x` (normalised), the position vectors' similarity, and the
    leading filter components as PNGs (vit.maps.inspect_plots.filter_mosaic)."""
    from vit.maps.inspect_plots import filter_mosaic

    distance = mean_attention_distance(model, x)
    comps, ratio = filter_components(model, k=components)
    mosaic = (filter_mosaic(comps) * 255).round().to(torch.uint8).permute(0, 3, 1, 2)
    if mosaic.shape[1] == 1:
        mosaic = mosaic.expand(-1, 3, -1, -1)  # one channel: grey
    return {
        "distance": {
            "pixels": rounded(distance.pixels),
            "cls_share": rounded(distance.cls_share),
            "uniform": round(distance.uniform * distance.patch_size, 4),
            "images": distance.images,
            "patch_size": distance.patch_size,
        },
        "positions": rounded(position_similarity(model)),
        "filters": [
            {"src": png_data_uri(m), "ratio": round(float(r), 4)}
            for m, r in zip(mosaic, ratio, strict=True)
        ],
        "shifts": comps.shape[1],
    }


def render_html(meta: dict[str, Any], stored: Tensor, *, title: str) -> str:
    """The page: template, style and script inlined; the integers as uint16 split into a plane
    of low bytes and one of high bytes, zlib-compressed, base64."""
    assert 0 <= int(stored.min()) and int(stored.max()) <= SCALE < 2**16  # weights lie in [0, 1]
    planes = stored.numpy().astype("<u2").view("u1").reshape(-1, 2).T  # low bytes, high bytes
    packed = zlib.compress(planes.tobytes(), 9)  # apart, the mostly-zero high bytes pack tightly
    parts = {
        "title": title.replace("&", "&amp;").replace("<", "&lt;"),
        "style": (TEMPLATE_DIR / "explorer.css").read_text(),
        "script": (TEMPLATE_DIR / "explorer.js").read_text(),
        "data": json.dumps(meta, separators=(",", ":")).replace("<", "\\u003c"),
        "attention": base64.b64encode(packed).decode("ascii"),
    }
    template = (TEMPLATE_DIR / "explorer.html").read_text()
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m[1]], template)  # one pass: no re-expansion


def write_explorer(
    model: VisionTransformer,
    images: Tensor,
    classes: list[str],
    path: str | Path,
    *,
    labels: Tensor | None = None,
    normalization: Normalization = CIFAR10_NORMALIZATION,
    title: str = "Attention explorer",
    overwrite: bool = False,
) -> Path:
    """Write the explorer page for uint8 images (B, 3, H, W), normalized with the model's
    `normalization`, to `path`; returns the path."""
    path = Path(path)
    _check_output(path, overwrite=overwrite)
    meta, stored = explorer_data(model, images, classes, labels=labels, normalization=normalization)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(meta, stored, title=title), encoding="utf-8")
    return path


def _check_output(path: Path, *, overwrite: bool) -> None:
    if path.is_dir():
        raise IsADirectoryError(f"--output {str(path)!r} is a directory; name an .html file.")
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"{str(path)!r} exists and was kept; pass --overwrite to replace it, or choose "
            f"another --output."
        )
