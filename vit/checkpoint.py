"""Safe checkpoint loading and sharing: weights-only reads, clear errors, resizing, safetensors.

Torch, einops and safetensors only: a Lightning checkpoint loads into a plain VisionTransformer
without Lightning installed. timm interop lives in vit/timm_interop.py.
"""

from __future__ import annotations

import inspect
import json
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vit.config import NetworkConfig
from vit.embed import resize_pos_embed
from vit.model import VisionTransformer
from vit.pretrained import available, resolve

PREFIXES = ("model.", "module.", "_orig_mod.")  # Lightning, DDP, torch.compile
MODEL_ARGS = set(inspect.signature(VisionTransformer.__init__).parameters) - {"self"}
SAFETENSORS_FORMAT = "vit.VisionTransformer"  # the `format` entry of exported files' metadata
_LEGACY_MAGIC = b"l\xfc\x9cF\xf9 j\xa8P\x19"  # torch.save's pre-zip format starts with this number
WEIGHTS = ("average", "live")  # which weights of a checkpoint trained with vit.callbacks.EMA
WEIGHTS_HELP = (
    "for a checkpoint trained with vit.callbacks.EMA: use its averaged weights (the default) or "
    "the live weights trained beside them"
)
CHECKPOINT_HELP = (
    "a .ckpt written by vit-train, a .safetensors from export_safetensors, or the name of "
    "shipped weights: " + available()
)
_SHOWN = 6  # list at most this many problems of each kind in an error message


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint with weights-only unpickling; never runs code stored in the file."""
    path = _existing_file(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if _file_kind(path) == "unknown":  # garbage that happened to hit a refused opcode
            raise ValueError(_not_a_checkpoint(path)) from None
        raise ValueError(
            f"refusing to load {str(path)!r}: besides tensors and plain values it holds Python "
            f"objects ({', '.join(_unsafe_globals(path, err)) or 'unknown'}), and unpickling them "
            f"could run code. Nothing from the file was run. If you trust its origin, load it "
            f"once with torch.load(path, weights_only=False) and torch.save only its state_dict "
            f"and hyper_parameters; share that (or export_safetensors of it)."
        ) from None
    except Exception as err:  # torch raises many types on damaged files (EOF, Index, Key, Runtime)
        kind = _file_kind(path)
        if kind == "unknown":
            raise ValueError(_not_a_checkpoint(path)) from None
        raise ValueError(
            f"{str(path)!r} looks like a {kind} PyTorch checkpoint but cannot be read: it is "
            f"probably truncated or corrupt (an interrupted save or copy?). Copy or save it "
            f"again. Details: {type(err).__name__}: {_first_sentence(err)}"
        ) from None
    if not isinstance(ckpt, dict):
        raise ValueError(
            f"{str(path)!r} holds a {type(ckpt).__name__}, not a checkpoint dict; expected a "
            f".ckpt from vit-train or a saved state_dict."
        )
    return migrate_checkpoint(ckpt)


# ViTClassifier's options before they were grouped into network, optimizer and schedule: each
# flat key, and where it lives now (a key of the group, or "" where it became a callback's)
_FLAT_NETWORK = set(NetworkConfig.__dataclass_fields__)
_FLAT_OPTIMIZER = {"optimizer": "name", "lr": "lr", "weight_decay": "weight_decay",
                   "betas": "betas", "fused_adamw": "fused"}  # fmt: skip
_FLAT_MUON = {
    f"muon_{k}": k for k in ("lr_scale", "momentum", "ns_steps", "split_qkv", "patch_embed")
}
_FLAT_SCHEDULE = {"warmup_epochs": "warmup_epochs", "warmup_fraction": "warmup_fraction",
                  "min_lr": "min_lr", "lr_decay": "decay"}  # fmt: skip
_FLAT_TO_CALLBACKS = ("time_budget_min", "res_schedule", "patch_drop_schedule")


def migrate_checkpoint(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A vit-train checkpoint of an older layout, in place, as today's: flat hyper-parameters
    grouped into network, optimizer and schedule (the budget and the curricula are callbacks
    now, configured in the trainer, so their old settings are dropped), and the time budget's
    clock moved into its callback's state. Today's checkpoints pass unchanged."""
    hp = ckpt.get("hyper_parameters")
    if isinstance(hp, dict) and "preset" in hp and "network" not in hp:
        flat = dict(hp)
        optimizer = {new: flat.pop(old) for old, new in _FLAT_OPTIMIZER.items() if old in flat}
        optimizer["muon"] = {new: flat.pop(old) for old, new in _FLAT_MUON.items() if old in flat}
        if optimizer.get("name", "adamw") != "muon":
            optimizer["muon"] = {}  # the defaults: AdamW refuses Muon settings
        schedule = {new: flat.pop(old) for old, new in _FLAT_SCHEDULE.items() if old in flat}
        network = {k: flat.pop(k) for k in list(flat) if k in _FLAT_NETWORK}
        for key in _FLAT_TO_CALLBACKS:
            flat.pop(key, None)
        hp.clear()
        hp.update(flat, network=network, optimizer=optimizer, schedule=schedule)
    if "train_elapsed_s" in ckpt:
        callbacks = ckpt.setdefault("callbacks", {})
        callbacks.setdefault(
            "TimeBudget",
            {
                "elapsed_s": ckpt.pop("train_elapsed_s"),
                "off_clock_s": ckpt.pop("train_off_clock_s", 0.0),
            },
        )
    return ckpt


def migrate_metric_states(state_dict: dict[str, Any], own: dict[str, Tensor]) -> None:
    """Sum per-class accuracy counts (`metrics.*.tp` etc., shape (C,)) into the micro counts (1,)
    a module keeps (`own`: its metric states), in place. Checkpoints from before val/acc became
    the fraction of images right hold torchmetrics' macro counts; summed over classes they are
    exactly the micro counts, so a resume goes on. (Top-k > 1 keeps per-class counts.)"""
    for key, value in list(state_dict.items()):
        mine = own.get(key)
        if (
            mine is not None
            and isinstance(value, Tensor)
            and tuple(mine.shape) == (1,)
            and value.dim() == 1
            and value.numel() > 1
        ):
            state_dict[key] = value.sum().reshape(1).to(mine.dtype)


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
    """A plain VisionTransformer in eval mode (no Lightning needed), and the checkpoint dict.

    `path`: a vit-train .ckpt, a .safetensors from export_safetensors, or the name of shipped
    weights (vit/pretrained.py). For a .safetensors the dict is shaped like the parts of a
    checkpoint the commands read (safetensors_info). `weights` picks which weights of a
    checkpoint trained with vit.callbacks.EMA load: "average" (its `state_dict`) or "live" (the
    trained weights themselves); None loads `state_dict`, whichever that holds. `overrides`
    replace constructor arguments; `img_size=48` loads a 32x32 model at 48x48, with the learned
    position table resized on the patch grid.
    """
    _check_overrides(overrides)
    path = resolve(path)
    if path.suffix == ".safetensors":
        if weights is not None:
            raise ValueError(
                f"{str(path)!r} holds one set of plain weights ({weights!r} asked for); leave "
                f"out the weights choice for a .safetensors file."
            )
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


def safetensors_info(metadata: dict[str, str]) -> dict[str, Any]:
    """What load_model returns beside a .safetensors model, in a checkpoint's shape, so the
    commands read both alike: `hyper_parameters` (class_names, test_flip off),
    `datamodule_hyper_parameters` (the image size it was trained at; every other data setting
    takes CIFAR10DataModule's default) and `safetensors_metadata` (the file's metadata as is)."""
    names = metadata.get("class_names")
    return {
        "hyper_parameters": {
            "class_names": json.loads(names) if names else None,
            "test_flip": False,
        },
        "datamodule_hyper_parameters": {"image_size": json.loads(metadata["config"])["img_size"]},
        "safetensors_metadata": dict(metadata),
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
        "vit.callbacks.EMA: its state_dict holds the live weights only. Leave out the weights "
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


def config_of(model: VisionTransformer) -> dict[str, Any]:
    """The architecture of a built model as constructor arguments (dropout rates not included)."""
    block, dim = model.blocks[0], model.embed_dim
    return dict(
        img_size=model.patch_embed.img_size,
        patch_size=model.patch_embed.patch_size,
        in_chans=model.patch_embed.in_chans,
        num_classes=model.head.out_features,
        embed_dim=dim,
        depth=len(model.blocks),
        num_heads=block.attn.num_heads,
        mlp_ratio=mlp_ratio_of(dim, block.mlp.fc1.out_features),
        qkv_bias=block.attn.qkv.bias is not None,
        class_token=model.cls_token is not None,
        global_pool=model.global_pool,
        pos_embed="learned" if isinstance(model.pos_embed, nn.Parameter) else "sincos",
        lsa=block.attn.lsa,
        spt=model.patch_embed.spt,
    )


def mlp_ratio_of(dim: int, hidden: int) -> float:
    """The mlp_ratio that rebuilds an MLP of `hidden` units, as int(dim * mlp_ratio) == hidden."""
    ratio = hidden / dim
    return ratio if int(dim * ratio) == hidden else (hidden + 0.5) / dim  # float rounding


def export_safetensors(
    ckpt_path: str | Path, out_path: str | Path, *, metadata: dict[str, str] | None = None
) -> Path:
    """Write a checkpoint's model weights as safetensors, with the model config as metadata.

    Metadata (str -> str): `format`, `config` (JSON constructor arguments), `weights` (average or
    live) and, when the checkpoint records them, `class_names` (JSON list); `metadata` adds keys
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
    model = VisionTransformer(**{**json.loads(metadata["config"]), **overrides})
    fit_state_dict(model, state, source=str(path))
    return model.eval(), metadata


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


def _existing_file(path: str | Path) -> Path:
    """`path` as a Path, or a clear error if it is missing, a directory or empty."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"{str(path)!r} is a directory, not a checkpoint file; pass the file inside it, e.g. "
            f"{str(path / 'last.ckpt')!r} (vit-train writes version_N/checkpoints/*.ckpt)."
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist. Pass the path of a .ckpt that vit-train "
            f"wrote, e.g. runs/quick/version_0/checkpoints/last.ckpt."
        )
    if path.stat().st_size == 0:
        raise ValueError(
            f"{str(path)!r} is empty (0 bytes): an interrupted save or copy? Save or copy it again."
        )
    return path


def _file_kind(path: Path) -> str:
    """'zip' or 'legacy' for torch.save's two formats by their first bytes, else 'unknown'."""
    with path.open("rb") as f:
        head = f.read(32)
    if head.startswith(b"PK\x03\x04") or zipfile.is_zipfile(path):
        return "zip"
    return "legacy" if _LEGACY_MAGIC in head else "unknown"


def _not_a_checkpoint(path: Path) -> str:
    if path.suffix == ".safetensors":
        return (
            f"{str(path)!r} is not a torch.save checkpoint; read .safetensors files with "
            f"load_safetensors or load_weights."
        )
    return (
        f"{str(path)!r} is not a PyTorch checkpoint: its first bytes match neither format that "
        f"torch.save writes (random bytes, another file type, or the wrong path?). Pass a .ckpt "
        f"written by vit-train or a file from torch.save."
    )


def _unsafe_globals(path: Path, err: Exception) -> list[str]:
    """Names of the Python objects a refused file asks for, read without running anything."""
    try:  # lists the pickle's GLOBAL opcodes of a zip checkpoint without unpickling
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:
        return re.findall(r"Unsupported global: GLOBAL (\S+)", str(err))


def _first_sentence(err: Exception) -> str:
    """torch's loader errors run to paragraphs; their first sentence says what failed."""
    return re.split(r"(?<=\.)\s|\n", str(err).strip(), maxsplit=1)[0]


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
