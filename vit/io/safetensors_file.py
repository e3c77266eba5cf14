"""Plain weights as safetensors (a format that cannot hold code), with the model config in the
file's metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from vit.io.checkpoint import _existing_file
from vit.io.state_dict import _check_overrides, fit_state_dict
from vit.model.vision_transformer import VisionTransformer

SAFETENSORS_FORMAT = "vit.VisionTransformer"  # the `format` entry of exported files' metadata


def load_safetensors(path: str | Path, **overrides: Any) -> VisionTransformer:
    """Rebuild a VisionTransformer (eval mode) from a file written by export_safetensors.

    `overrides` replace constructor arguments, as in load_model (e.g. `img_size=48`).
    """
    _check_overrides(overrides)
    return _safetensors_model(path, overrides)[0]


def _safetensors_model(
    path: str | Path, overrides: dict[str, Any]
) -> tuple[VisionTransformer, dict[str, str]]:
    """The model of an export_safetensors file (eval mode), and the file's metadata."""
    state, metadata = _read_safetensors(path)
    if metadata.get("format") != SAFETENSORS_FORMAT or "config" not in metadata:
        raise ValueError(
            f"{str(path)!r} has no vit model config in its metadata (found keys "
            f"{sorted(metadata)}); it was not written by export_safetensors. Build the model "
            f"yourself and call load_weights(model, path)."
        )
    return model_from_metadata(state, metadata, overrides, source=str(path)), metadata


def model_from_metadata(
    state: dict[str, Tensor], metadata: dict[str, str], overrides: dict[str, Any], *, source: str
) -> VisionTransformer:
    """The model `metadata`'s config describes (with `overrides`), `state` loaded, in eval mode:
    for an export_safetensors file and a save_pretrained folder alike."""
    model = VisionTransformer(**{**json.loads(metadata["config"]), **overrides})
    fit_state_dict(model, state, source=source)
    return model.eval()


def _read_safetensors(path: str | Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file (a format that cannot hold code)."""
    from safetensors import SafetensorError, safe_open

    path = _existing_file(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(
            f"{str(path)!r} is not a readable safetensors file (truncated, corrupt or another "
            f"format?): {err}"
        ) from None


def recorded_mean_std(hparams: dict[str, Any]) -> tuple[Any, Any] | None:
    """(mean, std) as a checkpoint's hyper_parameters record them, or None where they do not
    (vit.data.datasets.recorded_normalization checks the values)."""
    if hparams.get("mean") is None and hparams.get("std") is None:
        return None
    return hparams.get("mean"), hparams.get("std")


# the data settings that decide which dataset and which of its training images the weights
# held out: export_safetensors records them (`data_split`, JSON), so that vit-evaluate --split val
# scores the images the weights never trained on, or refuses weights that held none out
SPLIT_KEYS = ("source", "cifar100_labels", "val_size", "seed", "split_seed", "train_subset")


def data_split_metadata(data: dict[str, Any]) -> dict[str, str]:
    """A checkpoint's data settings (`datamodule_hyper_parameters`) of SPLIT_KEYS, as metadata:
    {"data_split": JSON}, or nothing where it records none. The source only for CIFAR-100:
    elsewhere the search (`auto`) finds CIFAR-10 in whichever copy the machine has, or the
    folder a user names."""
    kept = {k: data[k] for k in SPLIT_KEYS if k in data}
    if kept.get("source") != "cifar100":
        kept.pop("source", None)
    return {"data_split": json.dumps(kept)} if kept else {}


def split_settings(metadata: dict[str, str]) -> dict[str, Any]:
    """The data settings a file's `data_split` records (data_split_metadata); none before it."""
    if "data_split" not in metadata:
        return {}
    try:
        settings = json.loads(metadata["data_split"])
    except json.JSONDecodeError:
        settings = None
    if not isinstance(settings, dict) or set(settings) - set(SPLIT_KEYS):
        raise ValueError(
            f"the weights' metadata data_split={metadata['data_split']!r} is not a JSON object "
            f"of the data settings {list(SPLIT_KEYS)}; re-export the weights with "
            "export_safetensors, or remove the entry (the default split is then assumed)."
        )
    return settings


def safetensors_info(metadata: dict[str, str]) -> dict[str, Any]:
    """What load_model returns beside a .safetensors model, in a checkpoint's shape, so the
    commands read both alike: `hyper_parameters` (metadata_hparams, test_flip off),
    `datamodule_hyper_parameters` (the image size it was trained at and the split settings it
    records, split_settings; every other data setting takes CIFAR10DataModule's default) and
    `safetensors_metadata` (the file's metadata as is)."""
    image_size = json.loads(metadata["config"])["img_size"]
    return {
        "hyper_parameters": {**metadata_hparams(metadata), "test_flip": False},
        "datamodule_hyper_parameters": {"image_size": image_size, **split_settings(metadata)},
        "safetensors_metadata": dict(metadata),
    }


def metadata_hparams(metadata: dict[str, str]) -> dict[str, Any]:
    """The class names and, where recorded, the mean and std the inputs are normalized with,
    from a .safetensors file's metadata (JSON lists), as a checkpoint's hyper_parameters."""
    names = metadata.get("class_names")
    hparams: dict[str, Any] = {"class_names": json.loads(names) if names else None}
    for key in ("mean", "std"):
        if key in metadata:
            try:
                hparams[key] = json.loads(metadata[key])
            except json.JSONDecodeError:
                raise ValueError(
                    f"the weights' metadata {key}={metadata[key]!r} is not JSON; expected a "
                    f"list of three numbers, e.g. [0.5071, 0.4865, 0.4409]."
                ) from None
    return hparams
