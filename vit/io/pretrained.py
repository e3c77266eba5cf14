"""Trained weights shipped inside the package, by name: look inside a model without training one.

Standard library only, so vit.io can resolve a name before it loads anything. Each file is
plain safetensors written by vit.io.load.export_safetensors: weights, the model config, the
class names, and how the weights were made (recipe, test_top1, data, trained_on, command).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"  # shipped as package data
PRETRAINED: dict[str, str] = {
    "vit-tiny-d4-cifar10-cpu60": "vit-tiny-d4-cifar10-cpu60.safetensors",
}


# how a `trained_on` note says no training image was held out: the shipped weights' "all 50,000
# training images", or a fit's own setting (data.val_size 0)
WHOLE_SPLIT = re.compile(
    r"\ball [\d,]+ training images\b|\bwhole training split\b|\bval_size[ :=]+0(?![\d.])",
    re.IGNORECASE,
)


class WeightsNotFoundError(FileNotFoundError, ValueError):
    """Neither a file nor a shipped name: a missing file to callers that catch FileNotFoundError,
    a bad value to those that catch ValueError."""


def available() -> str:
    """The shipped names, for error messages."""
    return ", ".join(sorted(PRETRAINED))


def resolve(name_or_path: str | Path) -> Path:
    """The file behind a shipped weights name, or `name_or_path` itself when it exists.

    A name wins over a local file of the same name. Anything else raises WeightsNotFoundError
    naming the path and listing the names available.
    """
    key = str(name_or_path)
    if key in PRETRAINED:
        path = WEIGHTS_DIR / PRETRAINED[key]
        if not path.is_file():
            raise WeightsNotFoundError(
                f"the shipped weights {key!r} are missing from this install (expected "
                f"{str(path)!r}); reinstall the package (pip install -e .) from a complete clone."
            )
        return path
    path = Path(name_or_path)
    if path.exists():
        return path
    raise WeightsNotFoundError(
        f"checkpoint {key!r} does not exist, and it is not the name of shipped weights either. "
        f"Pass a .ckpt written by vit-train, a .safetensors file from export_safetensors, a "
        f"folder save_pretrained wrote, hf-hub:owner/name, or one of the names available: "
        f"{available()}."
    )


def trained_on_whole_split(metadata: Mapping[str, str]) -> bool:
    """Whether weights' metadata (load_model's `safetensors_metadata`) says they were trained on
    every image of the training split, as a fit with data.val_size 0 is: for files without a
    `data_split` entry (the shipped weights, files exported before it), the only word on what
    was held out."""
    return bool(WHOLE_SPLIT.search(metadata.get("trained_on") or ""))
