"""Start a model from trained weights (fine-tuning): every weight that fits is loaded, the head
is made fresh for another class count or other classes, the position table is resized to another
image size, and a report says which was which.

The source is anything load_model takes: a vit-train .ckpt (its state_dict: the EMA average when
trained with one), a .safetensors, a save_pretrained folder, `hf-hub:owner/name`, or a shipped
name. Its recorded architecture must match the model's (width, depth, heads, patch, ...);
dropout, drop-path, the image size and the class count may differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from vit.io.checkpoint import load_checkpoint
from vit.io.hub_folder import WEIGHTS_FILE, read_hub_config, resolve_weights
from vit.io.load import model_kwargs
from vit.io.safetensors_file import _read_safetensors, metadata_hparams, recorded_mean_std
from vit.io.state_dict import _adapt_pos_embed, state_dict_mismatches, strip_prefixes
from vit.io.timm_interop import config_of
from vit.model.config import NetworkConfig
from vit.model.vision_transformer import VisionTransformer

# the options that give weights their shapes or meaning: these must match to load them
ARCHITECTURE = (
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "patch_size",
    "in_chans",
    "qkv_bias",
    "class_token",
    "pos_embed",
    "lsa",
    "spt",
)
HEAD = ("head.weight", "head.bias")


@dataclass
class Source:
    """Trained weights to start from: tensors, and what was recorded beside them."""

    name: str
    state: dict[str, Tensor]
    config: dict[str, Any] | None = None  # VisionTransformer arguments, when recorded
    class_names: list[str] | None = None
    normalization: tuple[Any, Any] | None = None  # (mean, std) as recorded, when recorded


@dataclass
class InitReport:
    """What init_from did: tensors loaded as they were, resized, or left newly initialised."""

    source: str
    loaded: list[str] = field(default_factory=list)
    resized: list[str] = field(default_factory=list)  # "pos_embed: 8x8 -> 4x4 patch grid"
    fresh: list[str] = field(default_factory=list)
    why_fresh: str = ""
    total: int = 0  # tensors in the model's state dict

    def summary(self) -> str:
        lines = [f"init_from {self.source}: loaded {len(self.loaded)} of {self.total} tensors"]
        lines += [f"  resized {r}" for r in self.resized]
        if self.fresh:
            lines.append(f"  newly initialised {', '.join(self.fresh)} ({self.why_fresh})")
        return "\n".join(lines)


def read_source(spec: str | Path) -> Source:
    """The weights, architecture and class names behind `spec` (see the module docstring)."""
    path = resolve_weights(spec)
    if path.is_dir():  # a save_pretrained folder
        read_hub_config(path)
        path = path / WEIGHTS_FILE
    if path.suffix == ".safetensors":
        state, meta = _read_safetensors(path)
        config = json.loads(meta["config"]) if "config" in meta else None
        names = json.loads(meta["class_names"]) if "class_names" in meta else None
        norm = recorded_mean_std(metadata_hparams(meta))
        return Source(str(spec), strip_prefixes(state), config, names, norm)
    ckpt = load_checkpoint(path)
    state = ckpt.get("state_dict", ckpt)
    hparams = ckpt.get("hyper_parameters") or {}
    config = model_kwargs(ckpt) if isinstance(hparams.get("network"), dict) else None
    norm = recorded_mean_std(hparams)
    return Source(str(spec), strip_prefixes(state), config, hparams.get("class_names"), norm)


def check_architecture(source: Source, model_config: dict[str, Any]) -> None:
    """Fail, naming each setting and the fix, when the source was built otherwise."""
    if source.config is None:
        return  # a bare state dict: the shapes are compared when loading
    recorded = {"in_chans": 3, **source.config}
    wanted = {"in_chans": 3, **model_config}
    differ = [k for k in ARCHITECTURE if k in recorded and recorded[k] != wanted.get(k)]
    if differ:
        theirs = ", ".join(f"{k}={recorded[k]!r}" for k in differ)
        ours = ", ".join(f"{k}={wanted.get(k)!r}" for k in differ)
        flags = " ".join(f"--model.network.{k} {_flag(recorded[k])}" for k in differ)
        raise ValueError(
            f"cannot start from {source.name!r}: its network has {theirs} but this model has "
            f"{ours}. Build the model as the weights were built ({flags}, or the same under "
            f"model.network in the YAML; experiments/finetune.yaml matches the shipped weights)."
        )


def check_init_source(spec: str | Path, network: dict[str, Any]) -> None:
    """Before any data is read: `spec` exists, is readable, and fits the configured network
    (NetworkConfig's fields); what init_from will then load is checked again there."""
    check_architecture(read_source(spec), NetworkConfig(**network).model_kwargs())


def init_from(
    model: VisionTransformer, spec: str | Path, *, class_names: list[str] | None = None
) -> InitReport:
    """Load the weights of `spec` into `model` in place, for fine-tuning, and say what was done.

    The head is kept when it has the model's class count and, where both are known, the same
    class names (`class_names`: the new data's); otherwise the model's own fresh head stays. A
    learned position table is resized (bicubic) to the model's patch grid.
    """
    source = read_source(spec)
    check_architecture(source, config_of(model))
    own = model.state_dict()
    state = dict(source.state)
    report = InitReport(source=source.name)
    why = _head_change(source, own, state, class_names)
    if why:
        report.fresh, report.why_fresh = list(HEAD), why
        state.update({k: own[k] for k in HEAD})  # the model's own, freshly initialised
    table = state.get("pos_embed")
    if isinstance(table, Tensor) and table.shape != own["pos_embed"].shape:
        state["pos_embed"] = _adapt_pos_embed(model, table, source=source.name)
        if state["pos_embed"].shape == own["pos_embed"].shape:
            kind = "learned" if isinstance(model.pos_embed, nn.Parameter) else "fixed sin-cos"
            report.resized.append(
                f"pos_embed ({kind}): {_grid(table, model)} -> {_grid(own['pos_embed'], model)} "
                f"patch grid"
            )
    problems = state_dict_mismatches(own, state, given_name="source")
    if problems:
        raise ValueError(
            f"cannot start from {source.name!r}: its weights do not fit the model: "
            f"{'; '.join(problems)}. Build the model as the weights were built (same width, "
            f"depth, heads and patch size)."
        )
    model.load_state_dict(state)
    resized = {"pos_embed"} if report.resized else set()
    report.loaded = [k for k in own if k not in set(report.fresh) | resized]
    report.total = len(own)
    return report


def _head_change(
    source: Source,
    own: dict[str, Tensor],
    state: dict[str, Tensor],
    class_names: list[str] | None,
) -> str:
    """Why the head starts fresh ("" to keep the source's)."""
    theirs = state.get("head.weight")
    if theirs is None:
        return "the source has no head"
    if theirs.shape != own["head.weight"].shape:
        return f"{theirs.shape[0]} classes in the source, {own['head.weight'].shape[0]} here"
    if source.class_names and class_names and list(source.class_names) != list(class_names):
        return (
            f"other classes: {', '.join(source.class_names[:3])}, ... in the source; "
            f"{', '.join(class_names[:3])}, ... here"
        )
    return ""


def _grid(table: Tensor, model: VisionTransformer) -> str:
    side = int(round((table.shape[1] - model.num_prefix_tokens) ** 0.5))
    return f"{side}x{side}"


def _flag(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
