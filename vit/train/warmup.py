"""Compile every shape a fit will train on before its clock starts.

With torch_compile, each image side of a resolution curriculum and each patch-drop rate is a
graph of its own (static shapes), compiled the first time a step meets it: mid-fit, on a
wall-clock budget's time. `compile_planned_shapes` runs one forward and backward per (side,
rate) pair, and one evaluation forward, at fit start: the compiles happen there, and the global
RNG, the gradients and the model's settings are as they were before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


def compile_for_fit(
    module: L.LightningModule,
    *,
    sides: list[tuple[float, int]],
    drop_rates: list[tuple[float, float]],
) -> None:
    """compile_planned_shapes for a LightningModule's `model` in its fit: the data module's batch
    sizes, the precision's autocast. Skipped outside a fit, without a data module to give the
    batch sizes, and under several processes (DDP's gradient hooks expect its own forward)."""
    trainer = module._trainer  # None outside a fit (`trainer` would raise)
    dm = getattr(trainer, "datamodule", None)
    batch_size = getattr(getattr(dm, "hparams", None), "batch_size", None)
    if trainer is None or batch_size is None or trainer.world_size > 1:
        return
    net = module.model
    compile_planned_shapes(
        net,
        shapes=stage_pairs(
            sides or [(0.0, net.patch_embed.img_size)], drop_rates or [(0.0, net.patch_drop_rate)]
        ),
        batch_size=batch_size,
        eval_batch_sizes=_eval_batch_sizes(dm),
        in_chans=net.patch_embed.in_chans,
        full_side=net.patch_embed.img_size,
        context=trainer.precision_plugin.train_step_context(),
    )


def compile_augment_for_fit(module: L.LightningModule) -> int:
    """Compile the data module's compiled augmentation (compile_augment) for each training batch
    size, at fit start (in the budget, off the schedule's clock): full batches and, without
    drop_last, the last partial one. Its draws come from a generator of its own: the fit's draws
    are as without it. Returns how many sizes ran."""
    dm = getattr(module._trainer, "datamodule", None)
    augment, data = getattr(dm, "train_augment", None), getattr(dm, "train_dataset", None)
    if not getattr(augment, "compiled", False) or data is None or len(data) == 0:
        return 0
    sizes = _batch_sizes(len(data), dm.hparams.batch_size, partial=not dm.hparams.drop_last)
    images = data.images[:1].to(module.device)  # (1, C, H, W) uint8
    for b in sizes:
        augment(images.expand(b, -1, -1, -1).contiguous(), generator=torch.Generator())
    return len(sizes)


def compile_planned_shapes(
    model: nn.Module,
    *,
    shapes: Iterable[tuple[int, float]],
    batch_size: int,
    eval_batch_sizes: Iterable[int] = (),
    in_chans: int,
    full_side: int,
    context: contextlib.AbstractContextManager | None = None,
) -> int:
    """Run the compiled `model` once per (image side, patch-drop rate) in training and once per evaluation batch
    size, under `context` (the precision's autocast); returns how many shapes it ran. Images are
    resized to each side as the training step does."""
    device = next(model.parameters()).device
    was_training, rate_before = model.training, model.patch_drop_rate
    ran = 0
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), context or contextlib.nullcontext():
        full = torch.randn(batch_size, in_chans, full_side, full_side, device=device)
        model.train()
        for side, rate in sorted(set(shapes)):
            x = full if side == full_side else _resized(full, side)
            model.set_patch_drop(rate)
            torch.compiler.cudagraph_mark_step_begin()  # CUDA graphs: each call is a new step
            model(x).float().mean().backward()
            for p in model.parameters():  # under CUDA graphs the grads are the graph's outputs,
                p.grad = None  # overwritten by its next run: never accumulate into them
            ran += 1
        model.eval()
        for size in sorted(set(eval_batch_sizes)):
            torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad():
                model(torch.randn(size, in_chans, full_side, full_side, device=device))
            ran += 1
    torch.compiler.cudagraph_mark_step_begin()  # the fit's first step starts afresh
    model.set_patch_drop(rate_before)
    model.train(was_training)
    return ran


def stage_pairs(
    sides: list[tuple[float, int]], rates: list[tuple[float, float]]
) -> list[tuple[int, float]]:
    """The (side, rate) pairs two curricula make together: at each stage start of either, the
    value each has there. [(0, 16), (0.5, 32)] with [(0, 0.0), (0.25, 0.5)] -> (16, 0.0),
    (16, 0.5), (32, 0.5)."""

    def at(stages: list[tuple[float, Any]], fraction: float) -> Any:
        return [value for start, value in stages if start <= fraction][-1]

    starts = sorted({start for start, _ in sides} | {start for start, _ in rates})
    return list(dict.fromkeys((at(sides, f), at(rates, f)) for f in starts))


def _eval_batch_sizes(dm: object) -> list[int]:
    """The validation batches' sizes: full ones, and the last partial one if any."""
    size, data = getattr(dm, "eval_batch_size", None), getattr(dm, "val_dataset", None)
    if not size or data is None or len(data) == 0:
        return []
    return _batch_sizes(len(data), size)


def _batch_sizes(n: int, size: int, *, partial: bool = True) -> list[int]:
    """The sizes of the batches `n` items make: full ones, and (`partial`) the last one if short."""
    return sorted(s for s in {min(size, n), n % size if partial else 0} if s)


def _resized(images: torch.Tensor, side: int) -> torch.Tensor:
    """As ViTClassifier's training step resizes for a resolution curriculum."""
    return F.interpolate(
        images, size=(side, side), mode="bilinear", antialias=True, align_corners=False
    )
