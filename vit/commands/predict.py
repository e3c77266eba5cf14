"""`vit-predict`: what a model thinks of your own images: the top-k classes with their
probabilities for each image, as a table on the terminal and as CSV or JSON.

Images of any size and mode are converted to RGB and resized to the model's input side exactly
as the folder source resized its training images (squashed to a square, antialiased, no crop),
then normalised with the model's mean and std (CIFAR-10's unless its weights record their own;
vit/data/datasets.py's preprocess). An image
that cannot be read is reported by name and skipped; the others are still predicted, and the
command then exits with status 1 (2: a usage error, nothing predicted).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.data.datasets import (
    CIFAR10_NORMALIZATION,
    Normalization,
    preprocess,
    recorded_normalization,
)
from vit.data.folder_source import IMAGE_EXTENSIONS, decode_square
from vit.io.checkpoint import CHECKPOINT_HELP, WEIGHTS, WEIGHTS_HELP
from vit.io.load import load_model
from vit.model.vision_transformer import VisionTransformer
from vit.system.errors import exit_on_user_error
from vit.system.hardware import resolve_device

log = logging.getLogger(__name__)

OUTPUTS = (".csv", ".json")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vit-predict",
        description="The top-k classes of each image with their probabilities: a table on the "
        "terminal, and CSV or JSON with --output. Exit status 1 when some images could not be "
        "read (the others are predicted), 2 on a usage error.",
    )
    p.add_argument("weights", help=CHECKPOINT_HELP)
    p.add_argument(
        "images",
        type=Path,
        nargs="+",
        help="image files, or folders searched recursively for "
        + ", ".join(sorted(IMAGE_EXTENSIONS)),
    )
    p.add_argument("--top-k", type=int, default=3, help="classes shown per image (default: 3)")
    p.add_argument(
        "--batch-size", type=int, default=64, help="images per forward pass (default: 64)"
    )
    p.add_argument(
        "--device",
        default="auto",
        help="auto (a CUDA GPU when one is visible, else the CPU), cpu, cuda or cuda:N",
    )
    p.add_argument("--weights", dest="which", choices=WEIGHTS, default=None, help=WEIGHTS_HELP)
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="also write the predictions to this .csv or .json file (replaced if it exists)",
    )
    return p


def find_images(inputs: list[Path]) -> list[Path]:
    """The image files named or found under the folders named, in order, each once."""
    found: dict[Path, None] = {}
    for item in inputs:
        if item.is_dir():
            inside = sorted(
                p
                for p in item.rglob("*")
                if p.is_file()
                and p.suffix.lower() in IMAGE_EXTENSIONS
                and not any(part.startswith(".") for part in p.relative_to(item).parts)
            )
            if not inside:
                raise ValueError(
                    f"folder {str(item)!r} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))}"
                    f", searched recursively); point at the folder that has them."
                )
            found.update(dict.fromkeys(inside))
        elif item.is_file():
            found[item] = None  # named explicitly: read whatever its suffix
        elif item.exists():  # a pipe, a device: there, but no image to read
            raise ValueError(
                f"{str(item)!r} is neither an image file nor a folder; pass image files or "
                "folders of them."
            )
        else:
            raise FileNotFoundError(f"image or folder {str(item)!r} does not exist.")
    return list(found)


def read_image(path: Path, *, side: int) -> tuple[Tensor, tuple[int, int]]:
    """(3, side, side) uint8 RGB, resized as the training images were, and the (width, height)
    it had; ValueError naming the file when it cannot be read or decoded."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"cannot read {path} ({err.strerror or err})") from None
    image, (height, width) = decode_square(data, name=str(path), side=side)
    return image, (width, height)


@torch.inference_mode()
def predict_files(
    model: VisionTransformer,
    paths: list[Path],
    *,
    classes: list[str],
    top_k: int,
    batch_size: int = 64,
    device: torch.device | None = None,
    progress: bool = True,
    normalization: Normalization = CIFAR10_NORMALIZATION,
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Predictions ({path, width, height, top: [{class, probability}]}) for the files that read,
    and errors ({path, error}) for those that did not, in the order given; the images are
    normalized with the model's `normalization`."""
    from tqdm import tqdm

    side = _side(model.patch_embed.img_size)
    device = device or next(model.parameters()).device
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    bar = tqdm(total=len(paths), unit="img", file=sys.stderr, disable=None if progress else True)
    for start in range(0, len(paths), batch_size):
        images, kept = [], []
        for path in paths[start : start + batch_size]:
            try:
                image, size = read_image(path, side=side)
            except ValueError as err:
                errors.append({"path": str(path), "error": str(err)})
                bar.write(f"skipped: {err}", file=sys.stderr)
                continue
            images.append(image)
            kept.append((path, size))
        if images:
            x = preprocess(torch.stack(images).to(device), normalization)
            probs = model(x).float().softmax(dim=-1)
            values, indices = probs.topk(top_k, dim=-1)
            for (path, (w, h)), p, i in zip(kept, values.tolist(), indices.tolist(), strict=True):
                top = [{"class": classes[c], "probability": v} for c, v in zip(i, p, strict=True)]
                rows.append({"path": str(path), "width": w, "height": h, "top": top})
        bar.update(len(paths[start : start + batch_size]))
    bar.close()
    return rows, errors


def run_predict(argv: list[str] | None = None) -> dict[str, Any]:
    """What `vit-predict` does; returns what it printed and wrote (predictions and errors)."""
    ns = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if ns.top_k < 1:
        raise ValueError(f"--top-k={ns.top_k} must be at least 1.")
    if ns.batch_size < 1:
        raise ValueError(f"--batch-size={ns.batch_size} must be at least 1.")
    if ns.output is not None and ns.output.suffix.lower() not in OUTPUTS:
        raise ValueError(f"--output {str(ns.output)!r}: name a .csv or .json file.")
    device = resolve_device(ns.device)  # before anything loads: a typo fails at once
    paths = find_images(ns.images)
    model, ckpt = load_model(ns.weights, weights=ns.which)
    model.to(device)
    names = (ckpt.get("hyper_parameters") or {}).get("class_names")
    classes = list(names) if names else [str(i) for i in range(model.num_classes)]
    top_k = min(ns.top_k, len(classes))
    normalization = recorded_normalization(ckpt)
    rows, errors = predict_files(
        model,
        paths,
        classes=classes,
        top_k=top_k,
        batch_size=ns.batch_size,
        device=device,
        normalization=normalization,
    )
    whose = (
        "the CIFAR-10"
        if normalization == CIFAR10_NORMALIZATION
        else f"the training data's ({list(normalization.mean)}, {list(normalization.std)})"
    )
    side = _side(model.patch_embed.img_size)
    result = {
        "weights": ns.weights,
        "classes": classes,
        "preprocess": f"converted to RGB, resized to {side}x{side} as in training (squashed, "
        f"antialiased, no crop), normalised with {whose} mean and std",
        "top_k": top_k,
        "predictions": rows,
        "errors": errors,
    }
    print(table(rows, top_k))
    print(summary(result, side=side, asked_k=ns.top_k))
    if ns.output is not None:
        write_output(result, ns.output)
        print(f"wrote {ns.output}")
    if errors:
        print(
            f"{len(errors)} of {len(paths)} images could not be read (exit status 1): "
            + "; ".join(e["error"] for e in errors[:5])
            + (f"; ... and {len(errors) - 5} more" if len(errors) > 5 else ""),
            file=sys.stderr,
        )
    return result


def table(rows: list[dict[str, Any]], top_k: int) -> str:
    """One line per image: its path, its size, then the top-k classes with percentages."""
    heads = ["image", "size", *(f"top-{r + 1}" for r in range(top_k))]
    cells = [
        [r["path"], f"{r['width']}x{r['height']}"]
        + [f"{t['class']} {t['probability']:.1%}" for t in r["top"]]
        for r in rows
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(heads, *cells, strict=True)]
    lines = [heads, *cells]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(ln, widths, strict=True)).rstrip() for ln in lines
    )


def summary(result: dict[str, Any], *, side: int, asked_k: int) -> str:
    """How the images were prepared: which sizes were resized to the model's input."""
    rows = result["predictions"]
    other = [
        f"{r['width']}x{r['height']}" for r in rows if (r["width"], r["height"]) != (side, side)
    ]
    sizes = sorted(set(other))
    if other:
        shown = ", ".join(sizes[:3]) + (", ..." if len(sizes) > 3 else "")
        how = f"{len(other)} resized ({shown}) -> {side}x{side} as in training (squashed, no crop)"
    else:
        how = f"all already {side}x{side}"
    text = (
        f"{len(rows)} image{'' if len(rows) == 1 else 's'} predicted by {result['weights']} "
        f"({len(result['classes'])} classes): {how}; normalised with the CIFAR-10 mean and std."
    )
    if asked_k > result["top_k"]:
        text += f" --top-k {asked_k}: the model has {result['top_k']} classes, all shown."
    return text


def write_output(result: dict[str, Any], path: Path) -> None:
    """JSON as returned, or CSV: path, width, height, class_i, probability_i, ..., error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(result, indent=2) + "\n")
        return
    k = result["top_k"]
    ranks = [f"{name}_{i}" for i in range(1, k + 1) for name in ("class", "probability")]
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["path", "width", "height", *ranks, "error"])
        for r in result["predictions"]:
            top = [v for t in r["top"] for v in (t["class"], f"{t['probability']:.6f}")]
            out.writerow([r["path"], r["width"], r["height"], *top, ""])
        for e in result["errors"]:
            out.writerow([e["path"], "", "", *[""] * (2 * k), e["error"]])


def predict_main(argv: list[str] | None = None) -> None:
    """`vit-predict WEIGHTS IMAGES_OR_FOLDERS... [...]`: see --help."""
    result: dict[str, Any] = {}
    exit_on_user_error(lambda: result.update(run_predict(argv)))
    if result.get("errors"):
        raise SystemExit(1)


def _side(size: int | tuple[int, int]) -> int:
    return size[0] if isinstance(size, (tuple, list)) else size
