"""`vit-export`: a trained model as an ONNX file or a torch.export program, any batch size, then
checked against PyTorch on a few images (vit/io/export.py does the export)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch

from vit.data.datasets import CIFAR10_MEAN, CIFAR10_STD, recorded_normalization
from vit.io.checkpoint import CHECKPOINT_HELP, WEIGHTS, WEIGHTS_HELP
from vit.io.export import INPUT, export_onnx, export_program, require_onnx
from vit.io.load import load_model
from vit.system.errors import exit_on_user_error

log = logging.getLogger(__name__)
SUFFIX = {"onnx": ".onnx", "torch-export": ".pt2"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vit-export",
        description="Export a model for deployment: ONNX (onnxruntime and the runtimes that read "
        "it; needs pip install 'vit[export]') or a torch.export program (.pt2, "
        "torch.export.load). Input: float images (B, 3, S, S), any batch size B, S the model's "
        "img_size (32 for the shipped weights), scaled to [0, 1] then normalised with the "
        f"model's mean and std per channel (CIFAR-10's {CIFAR10_MEAN} and {CIFAR10_STD} unless "
        "it records its own; as vit.data.datasets.preprocess does); output: logits (B, "
        "classes). The ONNX file's metadata holds the class names, mean, std and model config.",
    )
    p.add_argument("weights_path", metavar="WEIGHTS", help=CHECKPOINT_HELP)
    p.add_argument(
        "--format", choices=tuple(SUFFIX), default=None,
        help="default: from --output's suffix (.onnx or .pt2), else onnx",
    )  # fmt: skip
    p.add_argument(
        "--output", type=Path, default=None, help="the file to write; missing folders are made "
        "(default: WEIGHTS' name + .onnx or .pt2, in the current folder)",
    )  # fmt: skip
    p.add_argument("--weights", choices=WEIGHTS, default=None, help=WEIGHTS_HELP)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    return p


def run_export(argv: list[str] | None = None) -> dict:
    """What `vit-export` does; returns what it wrote and the check's largest difference."""
    ns = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("onnxscript", "onnx_ir"):  # their optimizer logs ~100 INFO lines per export
        logging.getLogger(noisy).setLevel(logging.WARNING)
    fmt = ns.format or _format_of(ns.output)
    output = ns.output or Path(Path(ns.weights_path).stem + SUFFIX[fmt])
    _check_output(output, fmt=fmt, overwrite=ns.overwrite)  # all before any slow work
    if fmt == "onnx":
        require_onnx()
    model, ckpt = load_model(ns.weights_path, weights=ns.weights)
    if fmt == "onnx":
        names = (ckpt.get("hyper_parameters") or {}).get("class_names")
        norm = recorded_normalization(ckpt)
        side = model.patch_embed.img_size
        metadata = {
            "source": str(ns.weights_path),
            "input": f"{INPUT}: float (batch, 3, {side}, {side}), [0, 1] then (x - mean) / std "
            "per channel",
            "mean": json.dumps(list(norm.mean)),
            "std": json.dumps(list(norm.std)),
            "class_names": json.dumps(list(names) if names else None),
        }
        export_onnx(model, output, metadata=metadata)
    else:
        export_program(model, output)
    gap = check(model, output, fmt=fmt)
    said = (
        "" if gap is None else f"; on 4 random images its logits are within {gap:.1e} of PyTorch's"
    )
    print(f"wrote {output} ({output.stat().st_size / 1e6:.1f} MB, {fmt}){said}")
    return {"output": output, "format": fmt, "max_abs_diff": gap}


def _format_of(output: Path | None) -> str:
    """The format an --output's suffix names; onnx when it names none."""
    by_suffix = {suffix: fmt for fmt, suffix in SUFFIX.items()}
    return by_suffix.get(output.suffix.lower(), "onnx") if output is not None else "onnx"


def _check_output(output: Path, *, fmt: str, overwrite: bool) -> None:
    """Refuse, with the fix, an --output that cannot or should not be written."""
    if output.is_dir():
        raise IsADirectoryError(f"--output {str(output)!r} is a folder; name a file.")
    if output.exists() and not overwrite:
        raise FileExistsError(
            f"{str(output)!r} exists and was kept; pass --overwrite to replace it, or choose "
            f"another --output."
        )
    other = {s: f for f, s in SUFFIX.items() if f != fmt}.get(output.suffix.lower())
    if other is not None:
        raise ValueError(
            f"--output {str(output)!r} ends in {output.suffix}, the suffix of --format {other}, "
            f"but --format {fmt} writes {SUFFIX[fmt]}; name it "
            f"{output.with_suffix(SUFFIX[fmt]).name!r} or pass --format {other}."
        )
    folder = next(p for p in output.absolute().parents if p.exists())  # the nearest that exists
    if not folder.is_dir():
        raise ValueError(
            f"--output {str(output)!r} would be inside {str(folder)!r}, which is a file, not a "
            f"folder; choose an --output in a folder."
        )


def check(model: torch.nn.Module, path: Path, *, fmt: str) -> float | None:
    """The largest |logit difference| between the written file and `model` on 4 random images;
    None for ONNX when onnxruntime is not installed."""
    side = model.patch_embed.img_size
    x = torch.randn(4, 3, side, side, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = model.eval()(x)
        if fmt == "torch-export":
            got = torch.export.load(str(path)).module()(x)
        else:
            try:
                import onnxruntime
            except ImportError:
                log.info("onnxruntime is not installed: the file was not checked")
                return None
            runtime = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            got = torch.from_numpy(runtime.run(None, {INPUT: x.numpy()})[0])
    return float((got - expected).abs().max())


def export_main(argv: list[str] | None = None) -> None:
    """`vit-export WEIGHTS [...]`: see --help."""
    exit_on_user_error(lambda: run_export(argv))
