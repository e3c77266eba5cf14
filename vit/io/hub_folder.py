"""Reading the Hugging Face Hub's layout: a folder of config.json, model.safetensors and a model
card (README.md), local or downloaded by `hf-hub:owner/name`. Writing it: vit/io/hub.py.

config.json holds what an export_safetensors file keeps in its metadata, with JSON values
instead of strings, so a folder and a .safetensors file describe a model alike: "format", the
constructor arguments at the top level (as huggingface_hub's ModelHubMixin reads a config),
"class_names", and how the weights were made (recipe, test_top1, ...). Folders written before
2026-11-28 hold the arguments under "config"; they load as they did.
"""

from __future__ import annotations

import inspect
import json
import re
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from vit.io.pretrained import resolve
from vit.io.safetensors_file import SAFETENSORS_FORMAT, _read_safetensors, model_from_metadata
from vit.model.vision_transformer import VisionTransformer

CONFIG_FILE, WEIGHTS_FILE, CARD_FILE = "config.json", "model.safetensors", "README.md"
HUB_PREFIX = "hf-hub:"  # timm's prefix for a Hub repository: hf-hub:owner/name
REPO_ID = re.compile(r"[\w.-]+/[\w.-]+")  # the Hub's owner/name
# JSON-encoded in safetensors metadata, plain in config.json
JSON_KEYS = ("config", "class_names", "mean", "std", "data_split")
# the constructor's arguments: top-level keys of config.json
ARGUMENTS = tuple(inspect.signature(VisionTransformer.__init__).parameters)[1:]


def resolve_weights(spec: str | Path) -> Path:
    """The file or folder behind `spec`: `hf-hub:owner/name` (downloaded once to the Hub's cache),
    a shipped name, or an existing path; anything else fails naming what was looked for."""
    key = str(spec)
    if key.startswith(HUB_PREFIX):
        return hub_download(key[len(HUB_PREFIX) :])
    return resolve(spec)


def hub_download(repo_id: str, **options: Any) -> Path:
    """A local copy of a Hub repository's files (huggingface_hub's cache; offline when cached);
    `options` go to snapshot_download: revision, token, cache_dir, local_files_only,
    force_download."""
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(
            f"{repo_id!r} is not a Hub repository id; expected owner/name, e.g. "
            f"hf-hub:your-name/vit-tiny-digits."
        )
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, CARD_FILE], **options
        )
    except Exception as err:  # not found, private, offline: huggingface_hub has many types
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"could not download {repo_id!r} from the Hugging Face Hub ({reason}). Check the "
            f"repository id, your network and login (hf auth login); a local folder of that "
            f"name does not exist either."
        ) from None
    return Path(folder)


def is_hub_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_FILE).is_file()


def _checkpoint_hint(folder: Path) -> str:
    """How to name the weights instead: a vit-train run folder (or its checkpoints/) given for a
    file is answered with its own last.ckpt."""
    for last in (folder / "checkpoints" / "last.ckpt", folder / "last.ckpt"):
        if last.is_file():
            return f"It holds a run's checkpoints: pass {str(last)!r} (or another .ckpt beside it)."
    return (
        "Pass a checkpoint file (e.g. runs/NAME/version_0/checkpoints/last.ckpt) or a "
        "save_pretrained folder."
    )


def read_hub_config(folder: Path) -> dict[str, str]:
    """config.json of a save_pretrained folder, as safetensors metadata (str -> str), checked."""
    path = folder / CONFIG_FILE
    if not folder.is_dir() or not path.is_file():
        found = sorted(p.name for p in folder.iterdir())[:8] if folder.is_dir() else []
        raise IsADirectoryError(
            f"{str(folder)!r} is a folder but not one save_pretrained wrote: expected "
            f"{CONFIG_FILE} and {WEIGHTS_FILE} in it (found {found}). {_checkpoint_hint(folder)}"
        )
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"{str(path)!r} is not valid JSON ({err}); save the model again."
        ) from None
    if not isinstance(config, dict) or config.get("format") != SAFETENSORS_FORMAT:
        raise ValueError(_foreign(path, config))
    if "config" not in config:  # the arguments at the top level, as ModelHubMixin writes them
        config["config"] = {k: config.pop(k) for k in ARGUMENTS if k in config}
        odd = sorted(k for k, v in config.items() if k not in JSON_KEYS and misspelt_argument(k, v))
        if odd:
            near = {k: get_close_matches(k, ARGUMENTS, n=1, cutoff=0.8) for k in odd}
            hints = "; ".join(f"{k!r}: did you mean {m[0]!r}?" for k, m in near.items() if m)
            raise ValueError(
                f"{str(path)!r}: {odd} are not VisionTransformer arguments (those are "
                f"{', '.join(ARGUMENTS)}){'; ' + hints if hints else ''}. Fix the names in "
                f"config.json, or make a note's value a string."
            )
    if not isinstance(config.get("config"), dict) or not config["config"]:
        raise ValueError(
            f"{str(path)!r} has no VisionTransformer arguments (expected keys such as "
            f"embed_dim and depth); save the model again with model.save_pretrained."
        )
    return {k: json.dumps(v) if k in JSON_KEYS else str(v) for k, v in config.items()}


def misspelt_argument(key: str, value: Any) -> bool:
    """A top-level key of config.json that is no argument: notes are str -> str, so anything
    else, or a name one letter or two from an argument's (global_pol), is a typo."""
    return not isinstance(value, str) or bool(get_close_matches(key, ARGUMENTS, n=1, cutoff=0.8))


def _foreign(path: Path, config: object) -> str:
    """Why a config.json is not vit's, and what to do instead."""
    if not isinstance(config, dict):
        return (
            f"{str(path)!r} holds a JSON {type(config).__name__}, expected an object with "
            f'"format": {SAFETENSORS_FORMAT!r}; save the model again with model.save_pretrained.'
        )
    other = [
        k for k in ("architectures", "model_type", "architecture", "_name_or_path") if k in config
    ]
    origin = f"; its keys {other} are another library's" if other else ""
    return (
        f"{str(path)!r} does not describe a vit model: format {config.get('format')!r}, expected "
        f"{SAFETENSORS_FORMAT!r}{origin}. Load it with the library that wrote it (timm weights "
        f"convert with vit.from_timm), or point at a folder that model.save_pretrained or "
        f"vit.save_pretrained wrote."
    )


def hub_config_json(metadata: dict[str, str]) -> dict[str, Any]:
    """safetensors metadata (str -> str) as config.json's object: JSON values decoded, the
    constructor's arguments at the top level after "format"."""
    out: dict[str, Any] = {"format": metadata["format"], **json.loads(metadata["config"])}
    for key, value in metadata.items():
        if key not in ("format", "config"):
            out[key] = json.loads(value) if key in JSON_KEYS else value
    return out


def hub_folder_model(
    folder: Path, overrides: dict[str, Any]
) -> tuple[VisionTransformer, dict[str, str]]:
    """The model of a save_pretrained folder (eval mode), and its config as metadata."""
    metadata = read_hub_config(folder)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} has a {CONFIG_FILE} but no {WEIGHTS_FILE}: an incomplete copy or "
            f"download? Copy the folder again, or save it again with vit.save_pretrained."
        )
    state, _ = _read_safetensors(weights)
    try:
        model = model_from_metadata(state, metadata, overrides, source=str(weights))
    except TypeError as err:  # an unknown argument in a hand-edited config.json
        raise ValueError(f"{str(folder / CONFIG_FILE)!r}: {err}; fix its 'config'.") from None
    return model, metadata
