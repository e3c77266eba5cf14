"""`vit-inspect`: a model as a whole, as the ViT paper's Fig. 7 looks at it (attention distance
by depth, the patch filters, the positions), or one run's checkpoints over training.

The numbers come from vit/maps/inspection.py, the pictures from vit/maps/inspect_plots.py.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.commands.visualize import add_image_arguments, model_and_images
from vit.data.datasets import preprocess
from vit.io.checkpoint import CHECKPOINT_HELP, WEIGHTS, WEIGHTS_HELP
from vit.io.hub_folder import is_hub_folder
from vit.io.load import load_model
from vit.io.timm_interop import config_of
from vit.maps.capture import attention_maps, fuse_heads, patch_grid, query_map
from vit.maps.inspection import (
    filter_components,
    mean_attention_distance,
    patch_distances,
    position_similarity,
)
from vit.maps.rollout import rollout_map
from vit.model.vision_transformer import VisionTransformer
from vit.system.errors import exit_on_user_error

log = logging.getLogger(__name__)
DECIMALS = 6  # the JSON's numbers: enough for any figure, short enough to read


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vit-inspect",
        description="Look at a model as a whole, as the ViT paper does (Fig. 7): each head's mean "
        "attention distance by depth, the patch projection's principal filters and the position "
        "vectors' similarity (three PNGs and inspect.json). Given a run folder or several "
        "checkpoints: how attention forms during training, the same images at each checkpoint.",
    )
    p.add_argument(
        "weights",
        nargs="+",
        help=f"{CHECKPOINT_HELP}; or a run folder (e.g. runs/quick/version_0), or several "
        f".ckpt files of one run, for the attention-over-training strip",
    )
    p.add_argument(
        "--num-images",
        type=int,
        default=128,
        help="dataset images the attention distance averages over (default: 128, as the paper)",
    )
    add_image_arguments(p, nargs="+", otherwise=", instead of the split's")
    p.add_argument("--seed", type=int, default=0, help="which dataset images are drawn")
    p.add_argument("--data-dir", default=None, help="data folder or archive (default: as trained)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--components", type=int, default=28, help="filter components (default: 28)")
    p.add_argument(
        "--strip-images", type=int, default=3, help="images in the training strip (default: 3)"
    )
    p.add_argument("--weights", dest="which", choices=WEIGHTS, default=None, help=WEIGHTS_HELP)
    p.add_argument("--output-dir", type=Path, default=Path("inspect"))
    p.add_argument("--overwrite", action="store_true", help="replace existing files")
    return p


def run_inspect(argv: list[str] | None = None) -> list[Path]:
    """What `vit-inspect` does; returns the paths it wrote."""
    ns = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("num_images", "components", "strip_images"):
        if getattr(ns, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(ns, name)} must be at least 1.")
    checkpoints = run_checkpoints(ns.weights)
    if checkpoints is None:
        figures, numbers = inspect_one(ns, ns.weights[0])
    else:
        figures, numbers = inspect_run(ns, checkpoints)
    return write_outputs(ns.output_dir, figures, numbers, overwrite=ns.overwrite)


def inspect_one(ns: argparse.Namespace, weights: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three figures of one model and their numbers."""
    from vit.maps.inspect_plots import (
        plot_attention_distance,
        plot_filter_components,
        plot_position_similarity,
    )

    model, images, _, _, norm = model_and_images(ns, weights, weights=ns.which)
    distance = mean_attention_distance(model, preprocess(images, norm))
    components, ratio = filter_components(model, k=ns.components)
    similarity = position_similarity(model)
    grid = patch_grid(model)
    name = Path(str(weights)).name
    figures = {
        "attention_distance": plot_attention_distance(
            distance, title=f"How far each head looks: {name}"
        ),
        "filters": plot_filter_components(
            components, ratio, title=f"What the patch projection looks for: {name}"
        ),
        "positions": plot_position_similarity(
            similarity, grid, title=f"What the position vectors learned: {name}"
        ),
    }
    numbers = {
        "weights": str(weights),
        "images": distance.images,
        "grid": list(grid),
        "patch_size": distance.patch_size,
        "attention_distance": {
            "pixels": _round(distance.pixels),
            "patches": _round(distance.patches),
            "cls_share": _round(distance.cls_share),
            "uniform_pixels": round(distance.uniform * distance.patch_size, DECIMALS),
            "layers_by_heads": "rows are layers (first to last), columns heads",
        },
        "filters": {
            "explained_variance_ratio": _round(ratio),
            "shape": "components x shifts x channels x rows x columns",
            "components": _round(components),
        },
        "positions": {
            "cosine_similarity": _round(similarity),
            "order": "row-major positions on the patch grid, the CLS token left out",
        },
    }
    return figures, numbers


def run_checkpoints(specs: list[str]) -> list[Path] | None:
    """The checkpoints of a run (a folder of .ckpt files, or several files), or None for one model."""
    if len(specs) > 1:
        paths = [Path(s) for s in specs]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"checkpoint(s) {missing} do not exist; with several WEIGHTS, each must be a "
                f".ckpt file of one run."
            )
        return paths
    folder = Path(specs[0])
    if not folder.is_dir() or is_hub_folder(folder):
        return None
    found = sorted(folder.rglob("*.ckpt"))
    if not found:
        raise FileNotFoundError(
            f"{str(folder)!r} holds no .ckpt files and is no save_pretrained folder; pass a run "
            f"folder (runs/NAME/version_N), checkpoint files, or a model."
        )
    runs = sorted({str(p.parent) for p in found})
    if len(runs) > 1:
        raise ValueError(
            f"{str(folder)!r} holds the checkpoints of {len(runs)} runs ({', '.join(runs[:3])}"
            f"{', ...' if len(runs) > 3 else ''}); pass one run's folder, e.g. {runs[0]!r}."
        )
    return found


def inspect_run(ns: argparse.Namespace, paths: list[Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The strip per image and the distance over training, from checkpoints in step order."""
    from vit.maps.inspect_plots import plot_distance_over_training, plot_training_strip

    loaded = _by_step(paths, which=ns.which)
    if len(loaded) < 2:
        raise ValueError(
            f"found 1 distinct checkpoint ({paths[0]}); a strip needs at least 2. Keep "
            f"snapshots during training with a ModelCheckpoint of save_top_k: -1 and "
            f"every_n_train_steps (experiments/quick.yaml does)."
        )
    strip_ns = argparse.Namespace(**{**vars(ns), "num_images": max(ns.num_images, ns.strip_images)})
    _, images, _, _, norm = model_and_images(strip_ns, loaded[0][1], weights=ns.which)
    x = preprocess(images, norm)  # one run: its checkpoints share the training data's
    rollouts, layers, distances = [], [], []
    for *_, model in loaded:
        roll, per_layer = _strip_maps(model, x[: ns.strip_images])
        rollouts.append(roll)
        layers.append(per_layer)
        distances.append(mean_attention_distance(model, x[: ns.num_images]).patches)
    rollouts, layers = torch.stack(rollouts, 1), torch.stack(layers, 1)  # (B, K, ...)
    steps = [step for step, _, _ in loaded]
    labels = [f"step {s}" for s in steps]
    patch, prefix = loaded[0][2].patch_embed.patch_size, loaded[0][2].num_prefix_tokens
    figures: dict[str, Any] = {
        f"strip_{i}": plot_training_strip(
            images[i], rollouts[i], layers[i], labels=labels, num_prefix_tokens=prefix
        )
        for i in range(min(ns.strip_images, len(images)))
    }
    uniform = float(patch_distances(patch_grid(loaded[0][2])).mean())
    figures["distance_over_training"] = plot_distance_over_training(
        steps, torch.stack(distances), patch_size=patch, uniform=uniform
    )
    numbers = {
        "checkpoints": [{"path": str(p), "step": s} for s, p, _ in loaded],
        "images": min(ns.num_images, len(images)),
        "attention_distance_pixels": [_round(d * patch) for d in distances],
        "uniform_pixels": round(uniform * patch, DECIMALS),
    }
    return figures, numbers


def _by_step(paths: list[Path], *, which: str | None) -> list[tuple[int, Path, VisionTransformer]]:
    """(global step, path, model) per distinct step, in step order; the first path of a step.
    All must be one architecture: the strip stacks their maps, image by image."""
    seen: dict[int, tuple[int, Path, VisionTransformer]] = {}
    first: tuple[Path, dict[str, Any]] | None = None
    for path in paths:
        model, ckpt = load_model(path, weights=which)
        step = ckpt.get("global_step")
        if not isinstance(step, int):
            raise ValueError(
                f"{path} records no training step; the strip takes vit-train .ckpt files."
            )
        network = (path, config_of(model))
        first = first or network
        _check_same_network(first, network)
        seen.setdefault(step, (step, path, model))
    return [seen[s] for s in sorted(seen)]


def _check_same_network(a: tuple[Path, dict[str, Any]], b: tuple[Path, dict[str, Any]]) -> None:
    """Refuse checkpoints of two architectures, naming both and what differs."""
    differ = [f"{k} {a[1][k]} vs {b[1][k]}" for k in a[1] if a[1][k] != b[1].get(k)]
    if differ:
        raise ValueError(
            f"{a[0]} and {b[0]} are not checkpoints of one run: their networks differ "
            f"({', '.join(differ)}). The strip compares one run's checkpoints; pass that run's "
            f"folder (runs/NAME/version_N) or its .ckpt files."
        )


def _strip_maps(model: VisionTransformer, x: Tensor) -> tuple[Tensor, Tensor]:
    """Rollout (B, g, g) and each layer's head-averaged pooled-query map (B, L, g, g): the CLS
    row, or the mean of the patch rows without a CLS token."""
    grid, prefix = patch_grid(model), model.num_prefix_tokens
    with torch.inference_mode():
        maps = attention_maps(model, x)[1]
    roll = rollout_map(maps, grid=grid, num_prefix_tokens=prefix)
    per_layer = [query_map(fuse_heads(w), grid=grid, num_prefix_tokens=prefix) for w in maps]
    return roll, torch.stack(per_layer, 1)


def _round(values: Tensor) -> Any:
    return torch.round(values.double(), decimals=DECIMALS).tolist()


def write_outputs(
    folder: Path, figures: dict[str, Any], numbers: dict[str, Any], *, overwrite: bool
) -> list[Path]:
    """The PNGs and inspect.json in `folder`, refusing to replace files unless `overwrite`."""
    paths = [folder / f"{name}.png" for name in figures] + [folder / "inspect.json"]
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{len(existing)} file(s) would be overwritten, e.g. {existing[0]}; pass --overwrite "
            f"or choose another --output-dir."
        )
    from vit.maps.plots import save_figure

    folder.mkdir(parents=True, exist_ok=True)
    for path, fig in zip(paths, figures.values(), strict=False):
        save_figure(fig, path, dpi=110)
    paths[-1].write_text(json.dumps(numbers, indent=1) + "\n")
    print(f"wrote {len(paths)} files to {folder}: {', '.join(p.name for p in paths)}")
    return paths


def inspect_main(argv: list[str] | None = None) -> None:
    """`vit-inspect WEIGHTS [...]`: see --help."""
    exit_on_user_error(lambda: run_inspect(argv))
