"""Share a model in the Hugging Face Hub's layout: save_pretrained writes config.json,
model.safetensors and a model card (README.md); from_pretrained reads a folder, a shipped name
or a Hub repository; push_to_hub uploads a folder. vit.VisionTransformer (vit/io/hub_model.py)
has them as methods, in huggingface_hub's ModelHubMixin conventions; these functions also take
a checkpoint or any model vit.load_model reads. The card itself: vit/io/hub_card.py.

    import vit
    vit.save_pretrained("runs/digits/version_0/checkpoints/best.ckpt", "vit-digits",
                        metadata={"test_top1": "0.95", "data": "scikit-learn digits, 360 test"},
                        repo_id="your-name/vit-digits")  # the card's use lines load it
    vit.push_to_hub("vit-digits", "your-name/vit-digits")   # after `hf auth login`
    model = vit.from_pretrained("your-name/vit-digits")     # anyone, anywhere
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from vit.io.hub_card import MEAN, STD, model_card, shipped_card
from vit.io.hub_folder import (
    ARGUMENTS,
    CARD_FILE,
    CONFIG_FILE,
    HUB_PREFIX,
    REPO_ID,
    WEIGHTS_FILE,
    hub_config_json,
    hub_download,
    misspelt_argument,
    read_hub_config,
)
from vit.io.load import load_model, made_how, model_kwargs
from vit.io.pretrained import PRETRAINED
from vit.io.safetensors_file import SAFETENSORS_FORMAT
from vit.io.timm_interop import config_of
from vit.model.vision_transformer import VisionTransformer

OURS = ("format", "config", "class_names")  # the metadata save_pretrained writes itself
__all__ = ["MEAN", "STD", "load_pretrained", "model_card", "push_to_hub", "save_pretrained"]
__all__ += ["pretrained_metadata", "shipped_card"]  # the card's names, kept importable here


def save_pretrained(
    model: VisionTransformer | str | Path,
    folder: str | Path,
    *,
    class_names: Sequence[str] | None = None,
    metadata: dict[str, str] | None = None,
    overwrite: bool = False,
    repo_id: str | None = None,
) -> Path:
    """Write `folder`/config.json, model.safetensors and README.md (the model card).

    Args:
        model: A VisionTransformer, or what load_model takes (a .ckpt, a .safetensors, a shipped
            name, a save_pretrained folder), whose class names and metadata are carried over.
        folder: Where the three files go; created if missing.
        class_names: The classes in label order (default: the source's; for a bare model,
            none recorded and the card says so).
        metadata: How the weights were made, str -> str, for the card: recipe, data, test_top1
            (a fraction, e.g. "0.9528"), trained_on, command, results; more keys are kept too.
        overwrite: Replace the files of a folder that already holds some.
        repo_id: The Hub repository (owner/name) the folder is for: the card's use lines load
            it (default: the folder, or the shipped name).
    """
    folder = Path(folder)
    if repo_id is not None and not REPO_ID.fullmatch(repo_id):
        raise ValueError(f"repo_id {repo_id!r}: expected owner/name, e.g. your-name/vit-digits.")
    _check_folder(folder, overwrite=overwrite)
    known: dict[str, str] = {}
    config = None
    if not isinstance(model, nn.Module):
        model, config, known, names = _from_source(model)
        class_names = names if class_names is None else class_names
    meta = pretrained_metadata(
        model, class_names=class_names, metadata={**known, **(metadata or {})}, config=config
    )
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata=meta)
    (folder / CONFIG_FILE).write_text(json.dumps(hub_config_json(meta), indent=2) + "\n")
    params = sum(p.numel() for p in model.parameters())
    card = model_card(meta, name=folder.name, num_params=params, repo_id=repo_id)
    (folder / CARD_FILE).write_text(card)
    return folder


def pretrained_metadata(
    model: VisionTransformer,
    *,
    class_names: Sequence[str] | None,
    metadata: dict[str, str] | None,
    config: dict[str, Any] | None = None,
) -> dict[str, str]:
    """What save_pretrained records of `model`, checked, as safetensors metadata (str -> str):
    format, the constructor's `config` (default: read off the model), class names and how the
    weights were made."""
    if class_names is not None and len(class_names) != model.num_classes:
        raise ValueError(
            f"{len(class_names)} class_names given for a model with {model.num_classes} "
            f"outputs; pass one name per class, in label order."
        )
    extra = dict(metadata or {})
    # a name close to an argument's would read back as a misspelt argument (hub_folder.py)
    bad = sorted(k for k, v in extra.items() if k in OURS + ARGUMENTS or misspelt_argument(k, v))
    if bad:
        raise ValueError(
            f"metadata keys {bad}: each must be a str -> str entry other than {list(OURS)} "
            f"and the constructor's arguments (or names close to them); "
            f"rename the key, and convert values with str() or json.dumps."
        )
    meta = {"format": SAFETENSORS_FORMAT, "config": json.dumps(config or config_of(model))}
    if class_names is not None:
        meta["class_names"] = json.dumps([str(c) for c in class_names])
    meta.update(extra)  # after ours: config.json reads format, config, class_names first
    return meta


def load_pretrained(
    name: str | Path,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    force_download: bool = False,
    **overrides: Any,
) -> tuple[VisionTransformer, dict[str, Any]]:
    """load_model for what from_pretrained takes: a save_pretrained folder, a Hub repository
    ("owner/name" or "hf-hub:owner/name", downloaded once with huggingface_hub at `revision`,
    with `token`, into `cache_dir`), a shipped name, or a .ckpt / .safetensors file. `overrides`
    replace constructor arguments (`img_size=48`). vit.from_pretrained (vit/io/hub_model.py)
    gives the model with the Hub's methods."""
    key = str(name)
    local = Path(key).exists() or key in PRETRAINED
    if not local and (key.startswith(HUB_PREFIX) or REPO_ID.fullmatch(key)):
        repo = key.removeprefix(HUB_PREFIX)  # the Hub's convention: a bare owner/name
        options = dict(
            revision=revision,
            token=token,
            cache_dir=None if cache_dir is None else str(cache_dir),
            local_files_only=local_files_only,
            force_download=force_download,
        )
        name = hub_download(repo, **options)
    return load_model(name, **overrides)


def push_to_hub(
    folder: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload a vit model",
) -> str:
    """Upload a save_pretrained folder to the Hub repository `repo_id` (owner/name), creating
    the repository if needed; returns its URL. Needs huggingface_hub and an account: log in once
    with `hf auth login` (or pass `token`). Anyone then loads it with
    `vit.from_pretrained("owner/name")` or `vit-predict hf-hub:owner/name photo.jpg`.

    The folder goes up as it is, hand-edited card included; model.push_to_hub (the mixin's)
    writes the model afresh instead."""
    folder = Path(folder)
    read_hub_config(folder)  # a folder save_pretrained wrote, before anything is uploaded
    if not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no {WEIGHTS_FILE}; save the model again.")
    if not REPO_ID.fullmatch(repo_id):
        raise ValueError(f"repo_id {repo_id!r}: expected owner/name, e.g. your-name/vit-digits.")
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(
        folder_path=str(folder),
        repo_id=repo_id,
        commit_message=commit_message,
        allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, CARD_FILE],
    )
    return str(url)


def _check_folder(folder: Path, *, overwrite: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{str(folder)!r} is a file; save_pretrained writes a folder.")
    ours = [f for f in (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE) if (folder / f).exists()]
    if ours and not overwrite:
        raise FileExistsError(
            f"{str(folder)!r} already holds {ours}; pass overwrite=True or choose another folder."
        )


def _from_source(
    source: str | Path,
) -> tuple[VisionTransformer, dict[str, Any], dict[str, str], list[str] | None]:
    """A model loaded by load_model, its full constructor config, what it says about how it was
    made (weights, recipe, data, ...) as metadata, and its class names."""
    model, info = load_model(source)
    recorded = info.get("safetensors_metadata")
    if recorded is not None:  # a .safetensors, a folder or shipped weights
        known = {k: v for k, v in recorded.items() if k not in OURS}
        config = json.loads(recorded["config"])
    else:  # a vit-train checkpoint
        known, config = made_how(info), model_kwargs(info)
    names = (info.get("hyper_parameters") or {}).get("class_names")
    return model, config, known, list(names) if names else None
