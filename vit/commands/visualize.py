"""`vit-visualize`: attention pictures from a checkpoint, for dataset images or image files."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import torch
from torch import Tensor

from vit.commands.predict import find_images, read_image
from vit.commands.whole_split import refuse_whole_split
from vit.data.datasets import Normalization, recorded_normalization
from vit.data.folder_source import IMAGE_EXTENSIONS
from vit.io.checkpoint import CHECKPOINT_HELP, WEIGHTS, WEIGHTS_HELP
from vit.io.load import load_model
from vit.maps.plots import render
from vit.model.vision_transformer import VisionTransformer
from vit.system.errors import exit_on_user_error
from vit.train.datamodule import CIFAR10DataModule

log = logging.getLogger(__name__)
IMAGES_HELP = "image files, or folders searched recursively for " + ", ".join(
    sorted(IMAGE_EXTENSIONS)
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vit-visualize",
        description="Write PNGs of attention rollout overlays, per-head maps of one layer's "
        "pooled query (the CLS token, or the mean of the patch queries without one), "
        "and a layers x heads grid, for N dataset images or the image files given.",
    )
    p.add_argument("checkpoint", type=Path, help=CHECKPOINT_HELP)
    add_image_arguments(p, nargs="*", otherwise=" (default: images from the data split)")
    p.add_argument("--num-images", type=int, default=6)
    p.add_argument("--seed", type=int, default=0, help="which dataset images are drawn")
    p.add_argument("--data-dir", default=None, help="data folder or archive (default: as trained)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--layer", type=int, default=-1, help="layer of the per-head grid (-1: last)")
    p.add_argument("--head-fusion", choices=("mean", "max", "min"), default="mean")
    p.add_argument("--discard-ratio", type=float, default=0.0)
    p.add_argument("--start-layer", type=int, default=0)
    p.add_argument("--weights", choices=WEIGHTS, default=None, help=WEIGHTS_HELP)
    p.add_argument("--output-dir", type=Path, default=Path("attention"))
    p.add_argument("--overwrite", action="store_true", help="replace existing PNGs")
    return p


def add_image_arguments(p: argparse.ArgumentParser, *, nargs: str, otherwise: str) -> None:
    """--images (files or folders; `otherwise`: what is shown without them) and --split."""
    p.add_argument("--images", type=Path, nargs=nargs, default=None, help=IMAGES_HELP + otherwise)
    p.add_argument("--split", choices=("test", "val"), default="test")


def image_files(inputs: list[Path]) -> list[Path]:
    """The image files named and those in the folders named, found as vit-predict finds them."""
    for item in inputs:
        if item.exists() and not item.is_file() and not item.is_dir():  # a device, a pipe
            raise ValueError(_not_an_image(item))
    return find_images(inputs)


def load_image_files(paths: list[Path], *, size: int) -> Tensor:
    """Image files (image_files' list) -> (B, 3, size, size) uint8, converted to RGB and resized
    if needed."""
    images = []
    for path in paths:
        try:
            image, (width, height) = read_image(path, side=size)
        except ValueError:
            if path.suffix.lower() in IMAGE_EXTENSIONS or not os.access(path, os.R_OK):
                raise  # a broken image or an unreadable file: read_image's message says which
            raise ValueError(_not_an_image(path)) from None
        if (width, height) != (size, size):
            log.info("resizing %s from %dx%d to %dx%d", path, width, height, size, size)
        images.append(image)
    return torch.stack(images)


def _not_an_image(path: Path) -> str:
    return (
        f"{str(path)!r} is neither an image nor a folder of images; --images takes image files "
        f"or folders holding {', '.join(sorted(IMAGE_EXTENSIONS))} files."
    )


def dataset_images(
    ckpt: dict,
    *,
    split: str = "test",
    num_images: int = 6,
    seed: int = 0,
    data_dir: str | None = None,
    cache_dir: str | None = None,
    name: str | Path = "these weights",
) -> tuple[Tensor, Tensor]:
    """`num_images` uint8 images and their labels, drawn by `seed` from the split of the data the
    checkpoint (or load_model's dict for a .safetensors) was trained with; `name` names it in the
    refusal of a val split it trained on."""
    dm = CIFAR10DataModule.from_checkpoint(ckpt, data_dir=data_dir, cache_dir=cache_dir)
    if split == "val":  # weights that trained on every image have no held-out images to show
        refuse_whole_split(name, ckpt, dm.hparams.val_size)
    dm.setup("test" if split == "test" else "validate")
    data = dm.test_dataset if split == "test" else dm.val_dataset
    pick = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    return data.__getitems__(pick[:num_images].tolist())


def visualize_main(argv: list[str] | None = None) -> None:
    """`vit-visualize CHECKPOINT [...]`: see --help."""
    exit_on_user_error(lambda: run_visualize(argv))


def model_and_images(
    ns: argparse.Namespace, checkpoint: str | Path, *, weights: str | None = None
) -> tuple[VisionTransformer, Tensor, Tensor | None, list[str], Normalization]:
    """A command's model (checkpoint, .safetensors or shipped name) and the images to look at:
    the user's files (`ns.images`), or a seeded draw from a split of the data it was trained on;
    with their labels (None for files), the class names and the model's normalization."""
    files = image_files(ns.images) if ns.images else []  # a wrong path fails before loading
    model, ckpt = load_model(checkpoint, weights=weights)
    classes = list((ckpt.get("hyper_parameters") or {}).get("class_names") or [])
    classes = classes or [str(i) for i in range(model.num_classes)]
    norm = recorded_normalization(ckpt)
    if files:
        images = load_image_files(files, size=model.patch_embed.img_size)
        return model, images, None, classes, norm
    images, labels = dataset_images(
        ckpt,
        split=ns.split,
        num_images=ns.num_images,
        seed=ns.seed,
        data_dir=ns.data_dir,
        cache_dir=ns.cache_dir,
        name=checkpoint,
    )
    return model, images, labels, classes, norm


def run_visualize(argv: list[str] | None = None) -> list[Path]:
    """What `vit-visualize` does; returns the paths of the PNGs it wrote."""
    ns = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if ns.num_images < 1:
        raise ValueError(f"--num-images={ns.num_images} must be at least 1.")
    model, images, labels, classes, norm = model_and_images(ns, ns.checkpoint, weights=ns.weights)
    figures = render(
        model,
        images,
        classes=classes,
        labels=labels,
        normalization=norm,
        layer=ns.layer,
        head_fusion=ns.head_fusion,
        discard_ratio=ns.discard_ratio,
        start_layer=ns.start_layer,
        names=[p.name for p in image_files(ns.images)] if ns.images else None,
    )
    paths = [ns.output_dir / f"{name}.png" for name in figures]
    existing = [str(p) for p in paths if p.exists()]
    if existing and not ns.overwrite:
        raise FileExistsError(
            f"{len(existing)} file(s) would be overwritten, e.g. {existing[0]}; pass --overwrite "
            f"or choose another --output-dir."
        )
    from vit.maps.plots import save_figure

    ns.output_dir.mkdir(parents=True, exist_ok=True)
    for path, fig in zip(paths, figures.values(), strict=True):
        save_figure(fig, path, dpi=100)  # no bbox cropping: pixel size = figsize x dpi
    print(f"wrote {len(paths)} PNGs to {ns.output_dir}")
    return paths
