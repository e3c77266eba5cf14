"""torch.hub entry points: a vit model in one line, from this repository.

    import torch
    model = torch.hub.load("OWNER/vit", "vit_tiny_d4_cifar10", pretrained=True)  # from GitHub
    model = torch.hub.load(".", "vit_tiny", source="local", num_classes=100)      # a checkout

Each entry returns a `vit.VisionTransformer`: trained and in eval mode with pretrained=True, else
freshly initialised (train mode, as torchvision's entries). Inputs: float images (B, 3, 32, 32)
normalised with CIFAR-10's mean and std (vit.data.datasets.preprocess does it for uint8).

torch.hub imports this file before it checks `dependencies`, so it imports no vit module and
nothing outside the standard library at the top: a missing package is then named by torch.hub.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch.hub lists every public callable here as an entry: none of these
    from typing import Any

    from vit import VisionTransformer

# what vit.create_model and vit.load_model import (vit.VisionTransformer has the Hub's methods)
dependencies = ["torch", "einops", "safetensors", "huggingface_hub"]

SHIPPED = {"vit_tiny_d4_cifar10": "vit-tiny-d4-cifar10-cpu60"}  # entry -> shipped weights


def vit_nano(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """vit_nano: width 128, depth 6, 4 heads, MLP ratio 2 (0.8 M parameters at 10 classes),
    4x4 patches of 32x32 images; untrained (no weights ship for it: pretrained=True raises).
    Keyword arguments override the constructor's, as vit.create_model (num_classes=100, ...)."""
    return _preset("vit_nano", pretrained=pretrained, overrides=kwargs)


def vit_tiny(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """vit_tiny: width 192, depth 6, 3 heads, MLP ratio 4 (2.7 M parameters at 10 classes),
    4x4 patches of 32x32 images; untrained (no weights ship for it: pretrained=True raises).
    Keyword arguments override the constructor's, as vit.create_model (num_classes=100, ...)."""
    return _preset("vit_tiny", pretrained=pretrained, overrides=kwargs)


def vit_lite(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """vit_lite: width 256, depth 7, 4 heads, MLP ratio 2 (3.7 M parameters at 10 classes),
    4x4 patches of 32x32 images; untrained (no weights ship for it: pretrained=True raises).
    Keyword arguments override the constructor's, as vit.create_model (num_classes=100, ...)."""
    return _preset("vit_lite", pretrained=pretrained, overrides=kwargs)


def vit_small(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """vit_small: width 384, depth 6, 6 heads, MLP ratio 4 (10.7 M parameters at 10 classes),
    4x4 patches of 32x32 images; untrained (no weights ship for it: pretrained=True raises).
    Keyword arguments override the constructor's, as vit.create_model (num_classes=100, ...)."""
    return _preset("vit_small", pretrained=pretrained, overrides=kwargs)


def vit_tiny_d4_cifar10(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """The shipped CIFAR-10 model, vit-tiny-d4-cifar10-cpu60: width 192, depth 4, 3 heads, MLP
    ratio 2, shifted patch tokens, locality self-attention, mean pooling (88.28% test top-1 from
    60 minutes on a 2-core CPU). pretrained=True loads its weights (inside the package, nothing
    downloaded) in eval mode; False builds the architecture untrained. Keyword arguments override
    the constructor's: img_size=48 resizes the trained positions; with pretrained=True, another
    num_classes keeps every trained weight but the head, which starts fresh (fine-tuning)."""
    return _shipped("vit_tiny_d4_cifar10", pretrained=pretrained, overrides=kwargs)


def _preset(preset: str, *, pretrained: bool, overrides: dict[str, Any]) -> VisionTransformer:
    """A preset's entry: untrained; there are no weights to load."""
    if pretrained:
        raise ValueError(
            f"{preset!r} has no trained weights; entries with weights: {sorted(SHIPPED)}. "
            f"Call {preset!r} with pretrained=False for an untrained model."
        )
    import vit  # here, not at the top: see the module docstring

    return vit.create_model(preset, **overrides)


def _shipped(entry: str, *, pretrained: bool, overrides: dict[str, Any]) -> VisionTransformer:
    """A shipped model's entry: its weights, or its architecture untrained."""
    import vit
    from vit.io.init_from import init_from, read_source

    name = SHIPPED[entry]
    config = read_source(name).config  # the architecture recorded beside the weights
    classes = overrides.get("num_classes", config["num_classes"])
    if pretrained and classes == config["num_classes"]:
        return vit.load_model(name, **overrides)[0]
    model = vit.VisionTransformer(**{**config, **overrides})
    if pretrained:  # another class count: the trained body and a fresh head, as timm does
        init_from(model, name)
        model.eval()
    return model
