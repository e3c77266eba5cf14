"""Safe checkpoint loading: weights-only unpickling, plain-model loading, clear errors. Torch only."""

from __future__ import annotations

import inspect
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.model import VisionTransformer, model_config

PREFIXES = ("model.", "module.", "_orig_mod.")  # Lightning, DDP, torch.compile
MODEL_ARGS = set(inspect.signature(VisionTransformer.__init__).parameters) - {"self"}


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint with weights-only unpickling; never runs code stored in the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist. Pass the path of a .ckpt that vit-train "
            f"wrote, e.g. runs/quick/version_0/checkpoints/last.ckpt."
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"refusing to load {str(path)!r}: it holds Python objects beyond tensors and plain "
            f"values, and unpickling them could run code. Only load checkpoints you trust the "
            f"origin of; re-save the weights alone (a state_dict) to share them. Details: {err}"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        raise ValueError(
            f"{str(path)!r} is not a readable PyTorch checkpoint (truncated or corrupt?): {err}"
        ) from None
    if not isinstance(ckpt, dict):
        raise ValueError(f"{str(path)!r} holds a {type(ckpt).__name__}, not a checkpoint dict.")
    return ckpt


def strip_prefixes(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Model weights from a Lightning/DDP/compiled state dict: drop wrappers' prefixes and metrics."""
    out = {}
    for key, value in state_dict.items():
        if key.startswith("metrics."):
            continue
        changed = True
        while changed:
            changed = False
            for prefix in PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix) :], True
        out[key] = value
    return out


def model_kwargs(ckpt: dict[str, Any]) -> dict[str, Any]:
    """VisionTransformer arguments recorded in a vit-train checkpoint's hyper_parameters."""
    hp = dict(ckpt.get("hyper_parameters") or {})
    if "preset" not in hp:
        raise ValueError(
            "the checkpoint has no 'hyper_parameters' with a model preset, so the model shape is "
            "unknown; build VisionTransformer yourself and call load_state_dict(strip_prefixes(...))."
        )
    return model_config(hp.pop("preset"), **{k: v for k, v in hp.items() if k in MODEL_ARGS})


def load_model(path: str | Path, **overrides: Any) -> tuple[VisionTransformer, dict[str, Any]]:
    """A plain VisionTransformer in eval mode (no Lightning needed), and the checkpoint dict."""
    ckpt = load_checkpoint(path)
    model = VisionTransformer(**{**model_kwargs(ckpt), **overrides})
    state = strip_prefixes(ckpt.get("state_dict", ckpt))
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(
            f"weights in {str(path)!r} do not fit the model they describe: {err}"
        ) from None
    model.eval()
    return model, ckpt
