"""A trained model without Lightning: load_model and load_weights for checkpoints, .safetensors
files, save_pretrained folders and shipped names; export_safetensors to share one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vit.io.checkpoint import WEIGHTS, load_checkpoint
from vit.io.hub_folder import hub_folder_model, resolve_weights
from vit.io.safetensors_file import (
    SAFETENSORS_FORMAT,
    _read_safetensors,
    _safetensors_model,
    data_split_metadata,
    recorded_mean_std,
    safetensors_info,
)
from vit.io.state_dict import _check_overrides, fit_state_dict
from vit.model.config import NetworkConfig
from vit.model.vision_transformer import VisionTransformer


def model_kwargs(ckpt: dict[str, Any]) -> dict[str, Any]:
    """VisionTransformer arguments recorded in a vit-train checkpoint's hyper_parameters."""
    network = (ckpt.get("hyper_parameters") or {}).get("network")
    if not isinstance(network, dict) or "preset" not in network:
        raise ValueError(
            "the checkpoint has no 'hyper_parameters' with a network preset, so the model shape "
            "is unknown; build VisionTransformer yourself and call load_weights(model, path)."
        )
    return NetworkConfig(**network).model_kwargs()


def load_model(
    path: str | Path, *, weights: str | None = None, **overrides: Any
) -> tuple[VisionTransformer, dict[str, Any]]:
    """A plain VisionTransformer in eval mode (no Lightning needed), and the checkpoint dict
    (vit.load_model, vit/io/hub_model.py, gives the same model with the Hub's methods).

    `path`: a vit-train .ckpt, a .safetensors from export_safetensors, a save_pretrained folder
    (or `hf-hub:owner/name`, downloaded), or the name of shipped weights (vit/io/pretrained.py).
    For the last three the dict is shaped like the parts of a checkpoint the commands read
    (safetensors_info). `weights` picks which weights of a
    checkpoint trained with vit.train.callbacks.EMA load: "average" (its `state_dict`) or "live" (the
    trained weights themselves); None loads `state_dict`, whichever that holds. `overrides`
    replace constructor arguments; `img_size=48` loads a 32x32 model at 48x48, with the learned
    position table resized on the patch grid.
    """
    _check_overrides(overrides)
    path = resolve_weights(path)
    if path.suffix == ".safetensors" or path.is_dir():
        if weights is not None:
            raise ValueError(
                f"{str(path)!r} holds one set of plain weights ({weights!r} asked for); leave "
                f"out the weights choice for a .safetensors file or save_pretrained folder."
            )
        if path.is_dir():
            model, metadata = hub_folder_model(path, overrides)
        else:
            model, metadata = _safetensors_model(path, overrides)
        return model, safetensors_info(metadata)
    ckpt = load_checkpoint(path)
    try:
        kwargs = model_kwargs(ckpt)
        state = select_weights(ckpt, weights)
    except ValueError as err:
        raise ValueError(f"{str(path)!r}: {err}") from None
    model = VisionTransformer(**{**kwargs, **overrides})
    fit_state_dict(model, state, source=str(path))
    return model.eval(), ckpt


def made_how(ckpt: dict[str, Any]) -> dict[str, str]:
    """What a vit-train checkpoint says of how its weights were made, as model-card metadata:
    which weights, the weights a fine-tune started from, where the data was, the mean and std
    its inputs are normalized with (JSON lists) and its split settings (data_split_metadata)
    where it records them."""
    known = {"weights": weights_kind(ckpt)}
    hparams = ckpt.get("hyper_parameters") or {}
    start = hparams.get("init_from")
    if start:
        known["init_from"] = str(start)
    known |= mean_std_metadata(hparams)
    data = ckpt.get("datamodule_hyper_parameters") or {}
    if data.get("source") == "cifar100":  # found in the cache, perhaps: named either way
        where = f", from {data['data_dir']}" if data.get("data_dir") else ""
        known["data"] = f"CIFAR-100, {data.get('cifar100_labels', 'fine')} labels{where}"
    elif data.get("data_dir"):
        known["data"] = f"{data.get('source', 'auto')} source at {data['data_dir']}"
    return known | data_split_metadata(data)


def mean_std_metadata(hparams: dict[str, Any]) -> dict[str, str]:
    """The mean and std a checkpoint's hyper_parameters record, as safetensors metadata (JSON
    lists); nothing where they record none (those weights take CIFAR-10's)."""
    recorded = recorded_mean_std(hparams)
    if recorded is None:
        return {}
    return {
        k: json.dumps([float(v) for v in vs])
        for k, vs in zip(("mean", "std"), recorded, strict=True)
    }


def weights_kind(ckpt: dict[str, Any]) -> str:
    """What a checkpoint's `state_dict` holds: "average" when trained with an EMA (Lightning's
    WeightAveraging keeps the live weights apart, as `current_model_state`), else "live"; for a
    .safetensors (load_model's dict), what export_safetensors recorded."""
    recorded = (ckpt.get("safetensors_metadata") or {}).get("weights")
    if recorded in WEIGHTS:
        return recorded
    return "average" if isinstance(ckpt.get("current_model_state"), dict) else "live"


def select_weights(ckpt: dict[str, Any], weights: str | None) -> dict[str, Any]:
    """The state dict of the requested `weights` ("average", "live" or None for state_dict)."""
    if weights is not None and weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: expected 'average', 'live' or None.")
    state = ckpt.get("state_dict", ckpt)
    if weights is None or weights == weights_kind(ckpt):
        return state
    if weights == "live":
        return ckpt["current_model_state"]
    raise ValueError(
        "asked for the averaged (EMA) weights, but the checkpoint was trained without "
        "vit.train.callbacks.EMA: its state_dict holds the live weights only. Leave out the weights "
        "choice (or ask for 'live')."
    )


def load_weights(model: VisionTransformer, path: str | Path) -> VisionTransformer:
    """Load the weights of a checkpoint (.ckpt, state_dict or .safetensors) into `model`.

    Lightning/DDP/compile prefixes are stripped and the position table is resized to the model's
    image size; any other mismatch raises a ValueError listing names and shapes. Returns `model`.
    """
    if Path(path).suffix == ".safetensors":
        state, _ = _read_safetensors(path)
    else:
        ckpt = load_checkpoint(path)
        state = ckpt.get("state_dict", ckpt)
    fit_state_dict(model, state, source=str(path))
    return model


def export_safetensors(
    ckpt_path: str | Path, out_path: str | Path, *, metadata: dict[str, str] | None = None
) -> Path:
    """Write a checkpoint's model weights as safetensors, with the model config as metadata.

    Metadata (str -> str): `format`, `config` (JSON constructor arguments), `weights` (average or
    live) and, when the checkpoint records them, `class_names`, `mean` and `std` (JSON lists;
    the mean and std the inputs are normalized with) and `data_split` (a JSON object: the data
    settings that decide the held-out images, data_split_metadata); `metadata` adds keys
    of your own (how the weights were made: recipe, test_top1, ...). Read back with
    load_safetensors or load_model.
    """
    from safetensors.torch import save_file

    model, ckpt = load_model(ckpt_path)
    ours = {
        "format": SAFETENSORS_FORMAT,
        "config": json.dumps(model_kwargs(ckpt)),
        "weights": weights_kind(ckpt),
    }
    class_names = (ckpt.get("hyper_parameters") or {}).get("class_names")
    if class_names is not None:
        ours["class_names"] = json.dumps(list(class_names))
    ours |= mean_std_metadata(ckpt.get("hyper_parameters") or {})
    ours |= data_split_metadata(ckpt.get("datamodule_hyper_parameters") or {})
    extra = dict(metadata or {})
    bad = sorted(k for k, v in extra.items() if k in ours or not isinstance(v, str))
    if bad:
        raise ValueError(
            f"metadata keys {bad}: each must be a str -> str entry other than the ones written "
            f"here ({sorted(ours)}); convert values with str() or json.dumps."
        )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out_path), metadata={**extra, **ours})
    return out_path
