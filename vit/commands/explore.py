"""`vit-explore`: one self-contained HTML page for looking inside a model's attention
(the page itself: vit/maps/explorer.py)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from vit.commands.visualize import IMAGES_HELP, model_and_images
from vit.io.checkpoint import CHECKPOINT_HELP
from vit.maps.explorer import _check_output, write_explorer
from vit.system.errors import exit_on_user_error

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vit-explore",
        description="Write one self-contained HTML page (no server, nothing fetched) to explore "
        "a model's attention: per layer and head, for any query patch or the pooled query (the "
        "CLS token, or the mean of the patch queries without one), with "
        "attention rollout, gradient rollout and the class probabilities.",
    )
    p.add_argument("weights", type=Path, help=CHECKPOINT_HELP)
    p.add_argument(
        "--images", type=Path, nargs="+", default=None, help=IMAGES_HELP + " (default: the split's)"
    )
    p.add_argument(
        "--num-images", type=int, default=16, help="dataset images to show (default: 16)"
    )
    p.add_argument(
        "--split", choices=("test", "val"), default="test", help="their split (default: test)"
    )
    p.add_argument("--seed", type=int, default=0, help="which dataset images are drawn")
    p.add_argument("--data-dir", default=None, help="data folder or archive (default: as trained)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument(
        "--output",
        type=Path,
        default=Path("explorer.html"),
        help="the page to write (default: explorer.html)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    return p


def run_explore(argv: list[str] | None = None) -> Path:
    """What `vit-explore` does; returns the page's path."""
    ns = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if ns.num_images < 1:
        raise ValueError(f"--num-images={ns.num_images} must be at least 1.")
    _check_output(ns.output, overwrite=ns.overwrite)  # before any work
    model, images, labels, classes, norm = model_and_images(ns, ns.weights)
    path = write_explorer(
        model,
        images,
        classes,
        ns.output,
        labels=labels,
        normalization=norm,
        title=f"Attention explorer: {ns.weights}",
        overwrite=ns.overwrite,
    )
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB): open it in a browser")
    return path


def explore_main(argv: list[str] | None = None) -> None:
    """`vit-explore WEIGHTS [...]`: see --help."""
    exit_on_user_error(lambda: run_explore(argv))
