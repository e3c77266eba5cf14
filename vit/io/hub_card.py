"""The model card of a vit model (README.md of a save_pretrained folder): a YAML header the Hub
reads (huggingface_hub's ModelCardData: license, library, tags, datasets, model-index, base_model)
and a body stating the architecture, classes, recipe, data, test accuracy, inputs and use."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from vit.io.hub_folder import HUB_PREFIX, REPO_ID
from vit.io.load import load_model
from vit.io.pretrained import PRETRAINED

# The input preprocessing of a vit model that records no mean and std of its own (CIFAR-10's:
# vit/data/datasets.py; a test holds these equal), stated in the card: io/ may not import data/.
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
# The card's fixed header, given to the mixin by vit.VisionTransformer's class statement
# (vit/io/hub_model.py); the mixin adds its own tag, "model_hub_mixin", as here.
HEADER = {
    "library_name": "vit",
    "license": "mit",
    "pipeline_tag": "image-classification",
    "tags": ["image-classification", "vision-transformer"],
}


def model_card(
    metadata: dict[str, str], *, name: str, num_params: int, repo_id: str | None = None
) -> str:
    """The README.md of a model: architecture, classes, recipe, data, test accuracy, command,
    the inputs it expects and how to use it, from safetensors-style metadata. The use lines load
    `repo_id` (owner/name) when the card is for a Hub repository, else a shipped name or a folder."""
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
    own = "mean" in metadata and "std" in metadata
    values = (json.loads(metadata["mean"]), json.loads(metadata["std"])) if own else (MEAN, STD)
    mean, std = (", ".join(f"{v:.4f}" for v in t) for t in values)
    whose = "its training images'" if own else "the CIFAR-10"
    load_name = repo_id or (name if name in PRETRAINED else f"path/to/{name}")
    cli_name = f"{HUB_PREFIX}{repo_id}" if repo_id else load_name  # the commands' Hub prefix
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
with {whose} mean ({mean})
and standard deviation ({std}), as in training.
`vit-predict` does this for images of any size.

## Use

```bash
vit-predict {cli_name} photo.jpg my_photos/ --top-k 3 --output predictions.csv
vit-train fit -c experiments/finetune.yaml --model.init_from {cli_name} \\
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

    named = re.search(r"cifar-?(10|100)(?!\d)", metadata.get("data", ""), re.IGNORECASE)
    dataset = {"10": ("cifar10", "CIFAR-10"), "100": ("cifar100", "CIFAR-100")}.get(
        named[1] if named else ""
    )
    start = metadata.get("init_from", "")
    on_hub = start.startswith(HUB_PREFIX) or (  # else a local checkpoint or a shipped name
        REPO_ID.fullmatch(start) is not None
        and Path(start).suffix not in (".ckpt", ".safetensors", ".pt")
        and not Path(start).exists()
    )
    results = None
    if metadata.get("test_top1") and dataset:  # a model-index names its dataset
        results = [
            EvalResult(
                task_type="image-classification",
                task_name="Image classification",
                dataset_type=dataset[0],
                dataset_name=dataset[1],
                dataset_split="test",
                metric_type="accuracy",
                metric_name="top-1 accuracy",
                metric_value=float(metadata["test_top1"]),
            )
        ]
    return ModelCardData(
        **{**HEADER, "tags": sorted([*HEADER["tags"], "model_hub_mixin"])},
        datasets=[dataset[0]] if dataset else None,
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
