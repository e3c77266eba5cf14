"""A model for deployment: an ONNX file (onnxruntime, TensorRT, OpenVINO, ...) or a torch.export
program (.pt2), each taking any batch size of float images (B, 3, H, W), normalised.

    import json, vit
    from vit.io.export import export_onnx, export_program
    model, _ = vit.load_model("vit-tiny-d4-cifar10-cpu60")
    export_onnx(model, "vit.onnx", metadata={"class_names": json.dumps(model.class_names)})
    export_program(model, "vit.pt2")  # torch.export.load("vit.pt2").module()(images)

ONNX needs the `export` extra (pip install 'vit[export]'); torch.export is torch's own.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch
from torch import nn

from vit.io.timm_interop import config_of
from vit.model.vision_transformer import VisionTransformer

# The attention kernel of an exported model. The explicit path writes locality self-attention's
# -inf diagonal in place, and the ONNX exporter's decomposition (aot_autograd) refuses that
# mutation; the fused kernel takes the diagonal as a boolean mask and becomes plain
# MatMul/Softmax/Where ops. It is also what `auto` runs in float32 on CPU, so the file computes
# what the model computes there.
EXPORT_KERNEL = "fused"
INPUT, OUTPUT = "images", "logits"
MAX_BATCH = 65_536  # the batch dimension's upper bound in the exported shapes
ONNX_PACKAGES = ("onnx", "onnxscript")  # onnxscript: what torch's ONNX exporter writes with


def for_export(model: nn.Module) -> VisionTransformer:
    """A copy of `model` in eval mode with its attention kernel pinned (EXPORT_KERNEL)."""
    if not isinstance(model, VisionTransformer):
        raise ValueError(
            f"expected a vit VisionTransformer, got {type(model).__name__}; load one with "
            f"vit.load_model(PATH)."
        )
    pinned = VisionTransformer(**{**config_of(model), "kernel": EXPORT_KERNEL})
    pinned.load_state_dict(model.state_dict())
    return pinned.eval()


def require_onnx() -> None:
    """Fail, naming the extra to install, unless the packages ONNX export needs import (an
    import, not a look-up: a broken or mismatched install fails here too, not mid-export)."""
    missing = []
    for name in ONNX_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError as err:
            missing.append(f"{name}: {err}")
    if missing:
        raise ValueError(
            f"ONNX export needs {' and '.join(ONNX_PACKAGES)}, which do not import "
            f"({'; '.join(missing)}): pip install 'vit[export]' (from a checkout: "
            f"pip install -e '.[export]')."
        )


def _example(model: VisionTransformer) -> tuple[torch.Tensor]:
    side = model.patch_embed.img_size
    return (torch.zeros(2, model.patch_embed.in_chans, side, side),)  # 2: not specialised to 1


def _batch_dim() -> dict[str, dict[int, torch.export.Dim]]:
    return {"x": {0: torch.export.Dim("batch", min=1, max=MAX_BATCH)}}


def export_program(model: nn.Module, path: str | Path) -> Path:
    """`model` as a torch.export program with a dynamic batch, saved to `path` (.pt2; missing
    folders are made); load it with torch.export.load(path).module()."""
    pinned = for_export(model)
    program = torch.export.export(pinned, _example(pinned), dynamic_shapes=_batch_dim())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path


def export_onnx(
    model: nn.Module, path: str | Path, *, metadata: dict[str, str] | None = None
) -> Path:
    """`model` as one ONNX file (weights inside; missing folders are made) with input "images"
    (batch, 3, H, W) and output "logits" (batch, classes); the model's config and `metadata`
    (str -> str) go into its metadata_props."""
    require_onnx()
    import onnx

    pinned = for_export(model)
    program = torch.onnx.export(
        pinned,
        _example(pinned),
        input_names=[INPUT],
        output_names=[OUTPUT],
        dynamic_shapes=_batch_dim(),
        dynamo=True,
        verbose=False,
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path), external_data=False)  # one file: the weights are a few MB
    proto = onnx.load(str(path))
    onnx.helper.set_model_props(proto, {"config": json.dumps(config_of(model)), **(metadata or {})})
    onnx.save(proto, str(path))
    return path
