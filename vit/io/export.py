"""A model for deployment: an ONNX file (onnxruntime, TensorRT, OpenVINO, ...) or a torch.export
program (.pt2), each taking any batch size of float images (B, 3, H, W), normalised.

    import vit
    from vit.io.export import export_onnx
    model, _ = vit.load_model("vit-tiny-d4-cifar10-cpu60")
    export_onnx(model, "vit.onnx", metadata={"class_names": "..."})

ONNX needs the `export` extra (pip install 'vit[export]'); torch.export is torch's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from vit.io.timm_interop import config_of
from vit.model.vision_transformer import VisionTransformer

# The attention kernel of an exported model. The explicit path masks locality self-attention's
# diagonal in place, which torch.export's functional graph refuses; the fused kernel takes that
# mask as a boolean input and becomes plain MatMul/Softmax/Where ops in ONNX.
EXPORT_KERNEL = "fused"
INPUT, OUTPUT = "images", "logits"
MAX_BATCH = 65_536  # the batch dimension's upper bound in the exported shapes


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


def _example(model: VisionTransformer) -> tuple[torch.Tensor]:
    side = model.patch_embed.img_size
    return (torch.zeros(2, model.patch_embed.in_chans, side, side),)  # 2: not specialised to 1


def _batch_dim() -> dict[str, dict[int, torch.export.Dim]]:
    return {"x": {0: torch.export.Dim("batch", min=1, max=MAX_BATCH)}}


def export_program(model: nn.Module, path: str | Path) -> Path:
    """`model` as a torch.export program with a dynamic batch, saved to `path` (.pt2); load it
    with torch.export.load(path).module()."""
    pinned = for_export(model)
    program = torch.export.export(pinned, _example(pinned), dynamic_shapes=_batch_dim())
    torch.export.save(program, str(path))
    return Path(path)


def export_onnx(
    model: nn.Module, path: str | Path, *, metadata: dict[str, str] | None = None
) -> Path:
    """`model` as one ONNX file (weights inside) with input "images" (batch, 3, H, W) and output
    "logits" (batch, classes); the model's config and `metadata` go into its metadata_props."""
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch's ONNX exporter needs it)
    except ImportError:
        raise ValueError(
            "ONNX export needs onnx and onnxscript: pip install 'vit[export]'."
        ) from None
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
    program.save(str(path), external_data=False)  # one file: the weights are a few MB
    proto = onnx.load(str(path))
    onnx.helper.set_model_props(proto, {"config": json.dumps(config_of(model)), **(metadata or {})})
    onnx.save(proto, str(path))
    return Path(path)
