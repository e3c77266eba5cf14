"""torch.hub entry points: a vit model in one line, from this repository.

    import torch
    model = torch.hub.load("OWNER/vit", "vit_tiny_d4_cifar10", pretrained=True)  # from GitHub
    model = torch.hub.load(".", "vit_tiny", source="local", num_classes=100)      # a checkout

Each entry returns a `vit.VisionTransformer` in eval mode when pretrained, else freshly
initialised (train mode, as torchvision's entries). Inputs: float images (B, 3, 32, 32)
normalised with CIFAR-10's mean and std (vit.data.datasets.preprocess does it for uint8).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch.hub lists every public callable here as an entry: no Any among them
    from collections.abc import Callable
    from typing import Any

dependencies = ["torch", "einops", "safetensors"]  # torch.hub checks these import first

SHIPPED = {"vit_tiny_d4_cifar10": "vit-tiny-d4-cifar10-cpu60"}  # entry -> shipped weights


def _preset_entry(preset: str) -> Callable[..., Any]:
    """The entry of a preset: untrained; keyword arguments override the constructor's."""
    from vit.model.vision_transformer import PRESETS

    def entry(pretrained: bool = False, **kwargs: Any) -> Any:
        import vit

        if pretrained:
            raise ValueError(
                f"{preset!r} has no trained weights; entries with weights: {sorted(SHIPPED)}. "
                f"Call it with pretrained=False for an untrained model."
            )
        return vit.create_model(preset, **kwargs)

    size = PRESETS[preset]
    entry.__name__ = entry.__qualname__ = preset
    entry.__doc__ = (
        f"{preset}: width {size['embed_dim']}, depth {size['depth']}, {size['num_heads']} heads, "
        f"MLP ratio {size['mlp_ratio']}; untrained. Keyword arguments override the "
        f"constructor's (num_classes=100, img_size=64, ...)."
    )
    return entry


vit_nano = _preset_entry("vit_nano")
vit_tiny = _preset_entry("vit_tiny")
vit_lite = _preset_entry("vit_lite")
vit_small = _preset_entry("vit_small")


def vit_tiny_d4_cifar10(pretrained: bool = False, **kwargs: Any) -> Any:
    """The shipped CIFAR-10 model (vit-tiny-d4-cifar10-cpu60: width 192, depth 4, 3 heads,
    shifted patch tokens, locality self-attention; 85.29% test top-1 from 60 minutes on a 2-core
    CPU). pretrained=True loads its weights (inside the package, nothing downloaded), in eval
    mode; False builds the same architecture untrained. Keyword arguments override the
    constructor's (img_size=48 resizes the trained positions)."""
    import vit

    name = SHIPPED["vit_tiny_d4_cifar10"]
    if pretrained:
        return vit.load_model(name, **kwargs)[0]
    import json

    from safetensors import safe_open

    from vit.io.pretrained import resolve

    with safe_open(str(resolve(name)), framework="pt") as f:  # the metadata only
        config = json.loads(f.metadata()["config"])
    return vit.VisionTransformer(**{**config, **kwargs})
