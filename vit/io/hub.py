"""Share a model in the Hugging Face Hub's layout: save_pretrained writes config.json,
model.safetensors and a model card (README.md); from_pretrained reads a folder, a shipped name
or a Hub repository; push_to_hub uploads a folder. vit.VisionTransformer (vit/io/hub_model.py)
has them as methods, in huggingface_hub's ModelHubMixin conventions; these functions also take
a checkpoint or any model vit.load_model reads.

    import vit
    vit.save_pretrained("runs/digits/version_0/checkpoints/best.ckpt", "vit-digits",
                        metadata={"test_top1": "0.95", "data": "scikit-learn digits, 360 test"})
    vit.push_to_hub("vit-digits", "your-name/vit-digits")   # after `hf auth login`
    model = vit.from_pretrained("your-name/vit-digits")     # anyone, anywhere
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from vit.io.hub_folder import (
    ARGUMENTS,
    CARD_FILE,
    CONFIG_FILE,
    HUB_PREFIX,
    WEIGHTS_FILE,
    hub_config_json,
    hub_download,
    read_hub_config,
)
from vit.io.load import load_model, made_how, model_kwargs
from vit.io.pretrained import PRETRAINED
from vit.io.safetensors_file import SAFETENSORS_FORMAT
from vit.io.timm_interop import config_of
from vit.model.vision_transformer import VisionTransformer

OURS = ("format", "config", "class_names")  # the metadata save_pretrained writes itself
# The input preprocessing of every vit model (vit/data/datasets.py's preprocess; a test holds
# these equal), stated in the card: io/ may not import data/.
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
_REPO_ID = re.compile(r"[\w.-]+/[\w.-]+")


def save_pretrained(
    model: VisionTransformer | str | Path,
    folder: str | Path,
    *,
    class_names: Sequence[str] | None = None,
    metadata: dict[str, str] | None = None,
    overwrite: bool = False,
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
    """
    folder = Path(folder)
    _check_folder(folder, overwrite=overwrite)
    known: dict[str, str] = {}
    if isinstance(model, nn.Module):
        config = config_of(model)
    else:
        model, config, known, names = _from_source(model)
        class_names = names if class_names is None else class_names
    if class_names is not None and len(class_names) != model.num_classes:
        raise ValueError(
            f"{len(class_names)} class_names given for a model with {model.num_classes} "
            f"outputs; pass one name per class, in label order."
        )
    extra = {**known, **(metadata or {})}
    bad = sorted(k for k, v in extra.items() if k in OURS + ARGUMENTS or not isinstance(v, str))
    if bad:
        raise ValueError(
            f"metadata keys {bad}: each must be a str -> str entry other than {list(OURS)} "
            f"and the constructor's arguments; "
            f"convert values with str() or json.dumps."
        )
    meta = {"format": SAFETENSORS_FORMAT, "config": json.dumps(config)}
    if class_names is not None:
        meta["class_names"] = json.dumps([str(c) for c in class_names])
    meta.update(extra)  # after ours: config.json reads format, config, class_names first
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata=meta)
    (folder / CONFIG_FILE).write_text(json.dumps(hub_config_json(meta), indent=2) + "\n")
    params = sum(p.numel() for p in model.parameters())
    (folder / CARD_FILE).write_text(model_card(meta, name=folder.name, num_params=params))
    return folder


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
    if not local and (key.startswith(HUB_PREFIX) or _REPO_ID.fullmatch(key)):
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
    `vit.from_pretrained("owner/name")` or `vit-predict hf-hub:owner/name photo.jpg`."""
    folder = Path(folder)
    read_hub_config(folder)  # a folder save_pretrained wrote, before anything is uploaded
    if not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no {WEIGHTS_FILE}; save the model again.")
    if not _REPO_ID.fullmatch(repo_id):
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


def model_card(metadata: dict[str, str], *, name: str, num_params: int) -> str:
    """The README.md of a model: architecture, classes, recipe, data, test accuracy, command,
    the inputs it expects and how to use it, from safetensors-style metadata."""
    cfg = json.loads(metadata["config"])
    names = json.loads(metadata["class_names"]) if "class_names" in metadata else None
    side, patch = cfg["img_size"], cfg["patch_size"]
    extras = [k for k in ("lsa", "spt") if cfg.get(k)]
    arch = (
        f"width {cfg['embed_dim']}, depth {cfg['depth']}, {cfg['num_heads']} heads, MLP ratio "
        f"{cfg['mlp_ratio']}, {patch}x{patch} patches of {side}x{side} images, "
        f"{'CLS-token' if cfg.get('global_pool', 'token') == 'token' else 'mean'} pooling"
        + (f", {' and '.join(e.upper() for e in extras)}" if extras else "")
    )
    classes = (
        f"{len(names)}: {', '.join(names)}"
        if names
        else f"{cfg['num_classes']}, names not recorded (labels 0 to {cfg['num_classes'] - 1})"
    )
    missing = "not recorded"
    top1 = metadata.get("test_top1")
    score = f"{float(top1):.2%}" if top1 else f"{missing} (save_pretrained's metadata test_top1)"
    mean, std = (", ".join(f"{v:.4f}" for v in t) for t in (MEAN, STD))
    load_name = name if name in PRETRAINED else f"path/to/{name}"
    rows = [
        ("architecture", f"Vision Transformer: {arch}"),
        ("parameters", f"{num_params / 1e6:.2f} M"),
        ("classes", classes),
        ("weights", _weights_text(metadata.get("weights"))),
        ("recipe", metadata.get("recipe", missing)),
        ("command", f"`{metadata['command']}`" if "command" in metadata else missing),
        ("trained on", metadata.get("trained_on", missing)),
        ("data (test split)", metadata.get("data", missing)),
        ("test top-1", score),
        ("record", metadata.get("results", missing)),
    ]
    if "init_from" in metadata:  # fine-tuned: the weights it started from
        rows.insert(4, ("started from", metadata["init_from"]))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"""---
{card_data(metadata, name=name).to_yaml()}
---

# {name}

A Vision Transformer ([Dosovitskiy et al. 2020](https://arxiv.org/abs/2010.11929)) from the
`vit` project: plain PyTorch with timm's parameter names.

| | |
|---|---|
{table}

## Inputs

RGB images resized to {side}x{side} (squashed, no crop), scaled to [0, 1], then normalised
with the CIFAR-10 mean ({mean})
and standard deviation ({std}), as in training.
`vit-predict` does this for images of any size.

## Use

```bash
vit-predict {load_name} photo.jpg my_photos/ --top-k 3 --output predictions.csv
vit-train fit -c experiments/finetune.yaml --model.init_from {load_name} \\
  --data.data_dir my_images/ --model.network.num_classes N
```

```python
import vit

# an nn.Module; from the Hub: "owner/name" (revision=, token=, cache_dir= as in transformers)
model = vit.VisionTransformer.from_pretrained("{load_name}")
print(model.class_names)  # in label order
```

## Files

`config.json` (the constructor arguments, class names and the rows above), `model.safetensors`
(the weights, with the same metadata) and this card.
"""


def card_data(metadata: dict[str, str], *, name: str) -> Any:
    """The card's YAML header (huggingface_hub's ModelCardData): license, library, tags, the
    dataset, `base_model` for a fine-tune of a Hub model, and the test top-1 as a model-index
    entry (what the Hub shows as the model's result) when it is known."""
    from huggingface_hub import EvalResult, ModelCardData

    cifar10 = re.search(r"cifar-?10(?!\d)", metadata.get("data", ""), re.IGNORECASE)
    start = metadata.get("init_from", "")
    on_hub = start.startswith(HUB_PREFIX) or (  # else a local checkpoint or a shipped name
        _REPO_ID.fullmatch(start) is not None
        and Path(start).suffix not in (".ckpt", ".safetensors", ".pt")
        and not Path(start).exists()
    )
    results = None
    if metadata.get("test_top1") and cifar10:  # a model-index names its dataset
        results = [
            EvalResult(
                task_type="image-classification",
                task_name="Image classification",
                dataset_type="cifar10",
                dataset_name="CIFAR-10",
                dataset_split="test",
                metric_type="accuracy",
                metric_name="top-1 accuracy",
                metric_value=float(metadata["test_top1"]),
            )
        ]
    return ModelCardData(
        license="mit",
        library_name="vit",
        pipeline_tag="image-classification",
        tags=["vision-transformer", "image-classification"],
        datasets=["cifar10"] if cifar10 else None,
        metrics=["accuracy"],
        base_model=start.removeprefix(HUB_PREFIX) if on_hub else None,  # a repository id
        model_name=name if results else None,  # the model-index's name; alone, not a card key
        eval_results=results,
    )


def shipped_card(name: str) -> str:
    """The model card of shipped weights (vit/io/weights/NAME.md, kept equal by a test)."""
    model, info = load_model(name)
    params = sum(p.numel() for p in model.parameters())
    return model_card(info["safetensors_metadata"], name=name, num_params=params)


def _weights_text(kind: str | None) -> str:
    if kind == "average":
        return "the exponential moving average of the trained weights (EMA)"
    return "the trained weights" if kind == "live" else "not recorded"


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
