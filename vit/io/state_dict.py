"""State dicts into a VisionTransformer: wrapper prefixes stripped, the position table resized
to the model's grid, and mismatches named."""

from __future__ import annotations

import inspect
from typing import Any

from torch import Tensor, nn

from vit.model.embed import resize_pos_embed
from vit.model.vision_transformer import VisionTransformer

PREFIXES = ("model.", "module.", "_orig_mod.")  # Lightning, DDP, torch.compile


MODEL_ARGS = set(inspect.signature(VisionTransformer.__init__).parameters) - {"self"}


_SHOWN = 6  # list at most this many problems of each kind in an error message


def strip_prefixes(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Model weights from a Lightning/DDP/compiled state dict: drop wrapper prefixes and metrics."""
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


def fit_state_dict(model: VisionTransformer, state_dict: dict[str, Any], *, source: str) -> None:
    """Strip prefixes, adapt the position table to the model's grid, check, then load strictly."""
    state = strip_prefixes(state_dict)
    if "pos_embed" in state:
        state["pos_embed"] = _adapt_pos_embed(model, state["pos_embed"], source=source)
    problems = state_dict_mismatches(model.state_dict(), state)
    if problems:
        raise ValueError(
            f"weights in {source!r} do not fit the model: {'; '.join(problems)}. Build the model "
            f"with the checkpoint's configuration (load_model reads it from a vit-train .ckpt), or "
            f"override only img_size."
        )
    model.load_state_dict(state)


def state_dict_mismatches(
    expected: dict[str, Any], given: dict[str, Any], *, given_name: str = "checkpoint"
) -> list[str]:
    """Readable differences: "head.weight: checkpoint (3, 32) vs model (10, 32)", missing, extra."""
    shapes = [
        f"{k}: {given_name} {_shape(given[k])} vs model {_shape(v)}"
        for k, v in expected.items()
        if k in given and _shape(given[k]) != _shape(v)
    ]
    missing = [k for k in expected if k not in given]
    extra = [k for k in given if k not in expected]
    problems = _first(shapes)
    if missing:
        problems.append(f"missing from the {given_name}: {', '.join(_first(missing))}")
    if extra:
        problems.append(f"not in the model: {', '.join(_first(extra))}")
    return problems


def _adapt_pos_embed(model: VisionTransformer, table: Tensor, *, source: str) -> Tensor:
    """The checkpoint's position table, made to fit the model's patch grid."""
    if not isinstance(model.pos_embed, nn.Parameter):  # fixed sin-cos table: the model's own fits
        return model.pos_embed.detach().clone()
    if table.ndim != 3 or table.shape[1] == model.pos_embed.shape[1]:
        return table  # same size (or a shape problem that the mismatch report will name)
    if table.shape[2] != model.pos_embed.shape[2]:
        return table  # another width: the mismatch report names it
    try:
        return resize_pos_embed(
            table,
            new_grid=model.patch_embed.grid_size,
            num_prefix_tokens=model.num_prefix_tokens,
        )
    except ValueError as err:
        raise ValueError(f"cannot resize pos_embed from {source!r}: {err}") from None


def _check_overrides(overrides: dict[str, Any]) -> None:
    unknown = sorted(set(overrides) - MODEL_ARGS)
    if unknown:
        raise ValueError(
            f"unknown model argument(s) {unknown}; overrides must be VisionTransformer arguments: "
            f"{sorted(MODEL_ARGS)}."
        )


def _shape(value: Any) -> tuple[int, ...] | str:
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


def _first(items: list[str]) -> list[str]:
    return items[:_SHOWN] + ([f"... and {len(items) - _SHOWN} more"] if len(items) > _SHOWN else [])
