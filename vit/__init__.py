"""vit: a Vision Transformer for CIFAR-10, built from first principles with PyTorch Lightning.

The public API, in one place:

    import vit
    model = vit.create_model("vit_tiny", num_classes=10)
    model, ckpt = vit.load_model("vit-tiny-d4-cifar10-cpu60")  # a checkpoint, .safetensors or name
    model.save_pretrained("my-vit")  # the Hub's layout; vit.VisionTransformer.from_pretrained
    logits, maps = vit.attention_maps(model, images)

Importing it only defines things: each name loads its module on first use (PEP 562), so
`import vit` loads neither torch nor anything else, and process-wide switches stay with the
commands (vit/system/mkl_amd.py and malloc.py, switched by vit/commands/entry.py).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a native module)

# name -> the module that defines it
_API = {
    "VisionTransformer": "vit.io.hub_model",
    "create_model": "vit.io.hub_model",
    "NetworkConfig": "vit.model.config",
    "attention_maps": "vit.maps.capture",
    "query_map": "vit.maps.capture",
    "rollout_map": "vit.maps.rollout",
    "grad_rollout": "vit.maps.rollout",
    "load_model": "vit.io.hub_model",
    "load_weights": "vit.io.load",
    "export_safetensors": "vit.io.load",
    "export_onnx": "vit.io.export",
    "export_program": "vit.io.export",
    "load_safetensors": "vit.io.safetensors_file",
    "load_checkpoint": "vit.io.checkpoint",
    "save_pretrained": "vit.io.hub",
    "from_pretrained": "vit.io.hub_model",
    "push_to_hub": "vit.io.hub",
    "from_timm": "vit.io.hub_model",
    "to_timm": "vit.io.timm_interop",
    "ViTClassifier": "vit.train.module",
    "CIFAR10DataModule": "vit.train.datamodule",
}
__all__ = [
    "CIFAR10DataModule",
    "NetworkConfig",
    "ViTClassifier",
    "VisionTransformer",
    "attention_maps",
    "create_model",
    "export_onnx",
    "export_program",
    "export_safetensors",
    "from_pretrained",
    "from_timm",
    "grad_rollout",
    "load_checkpoint",
    "load_model",
    "load_safetensors",
    "load_weights",
    "push_to_hub",
    "query_map",
    "rollout_map",
    "save_pretrained",
    "to_timm",
]

if TYPE_CHECKING:  # for type checkers and editors; never run
    from vit.io.checkpoint import load_checkpoint
    from vit.io.export import export_onnx, export_program
    from vit.io.hub import push_to_hub, save_pretrained
    from vit.io.hub_model import (
        VisionTransformer,
        create_model,
        from_pretrained,
        from_timm,
        load_model,
    )
    from vit.io.load import export_safetensors, load_weights
    from vit.io.safetensors_file import load_safetensors
    from vit.io.timm_interop import to_timm
    from vit.maps.capture import attention_maps, query_map
    from vit.maps.rollout import grad_rollout, rollout_map
    from vit.model.config import NetworkConfig
    from vit.train.datamodule import CIFAR10DataModule
    from vit.train.module import ViTClassifier


def __getattr__(name: str) -> object:
    if name not in _API:
        raise AttributeError(f"module 'vit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
