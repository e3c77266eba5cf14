"""The optimizer of a fit, as one value: AdamW, or Muon with AdamW (vit/train/muon.py), with
their parameter groups and the check that a resumed fit keeps the optimizer's layout."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from vit.train.muon import MuonAdamW, check_momentum, check_ns_steps


@dataclass
class MuonConfig:
    """Muon's settings, used with optimizer name muon (vit/train/optim.py).

    Args:
        lr_scale: The Muon group's peak learning rate as a multiple of lr (its updates are scaled
            to AdamW's RMS, so 1.0 means the same step size).
        momentum: Weight of the past in Muon's average of the gradient, in [0, 1).
        ns_steps: Newton-Schulz iterations per step (fewer are cheaper and less exact).
        split_qkv: Orthogonalize the query, key and value projections one by one, as
            modded-nanogpt does, instead of the qkv matrix whole.
        patch_embed: Put the patch projection's weight (a conv filter as an out x in*k*k
            matrix) in the Muon group too, instead of AdamW's.
    """

    lr_scale: float = 1.0
    momentum: float = 0.95
    ns_steps: int = 5
    split_qkv: bool = False
    patch_embed: bool = False

    def __post_init__(self) -> None:
        if not self.lr_scale > 0:
            raise ValueError(
                f"optimizer.muon.lr_scale={self.lr_scale} must be positive: the Muon group's "
                "learning rate is lr times it."
            )
        check_momentum(self.momentum, "optimizer.muon.momentum")
        check_ns_steps(self.ns_steps, "optimizer.muon.ns_steps")


@dataclass
class OptimizerConfig:
    """The optimizer: AdamW, or Muon for the blocks' weight matrices with AdamW for the rest.

    Args:
        name: adamw, or muon (Muon for the encoder's matrices, AdamW for everything else, in one
            optimizer: vit.train.muon.MuonAdamW).
        lr: Peak learning rate of the schedule (AdamW's; Muon's is lr x muon.lr_scale).
        weight_decay: Decoupled weight decay of the matrices (biases, norms, the CLS token and
            the positions are not decayed).
        betas: AdamW's moment coefficients.
        fused: AdamW's fused kernel (name adamw only; None: PyTorch's default).
        muon: Muon's settings (name muon only).
        compile: Compile the step's arithmetic with torch.compile, its elementwise work fused
            (name muon only; the learning rate enters as a tensor, so the schedule recompiles
            nothing). Needs a C++ compiler on a CPU.
    """

    name: Literal["adamw", "muon"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    fused: bool | None = None
    muon: MuonConfig = field(default_factory=MuonConfig)
    compile: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.muon, dict):  # as read back from a checkpoint's hyper-parameters
            self.muon = MuonConfig(**self.muon)
        self.betas = tuple(self.betas)
        if self.name not in ("adamw", "muon"):
            raise ValueError(
                f"optimizer.name={self.name!r}: expected 'adamw', or 'muon' (Muon for the "
                "blocks' weight matrices, AdamW for the rest)."
            )
        if not self.lr > 0:
            raise ValueError(
                f"optimizer.lr={self.lr} must be positive (1e-3 suits AdamW on a ViT)."
            )
        if self.weight_decay < 0:
            raise ValueError(f"optimizer.weight_decay={self.weight_decay} must be >= 0.")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(
                f"optimizer.betas={list(self.betas)} must be two numbers in [0, 1), e.g. "
                "[0.9, 0.999]."
            )
        if self.compile and self.name != "muon":
            raise ValueError(
                "optimizer.compile compiles Muon-with-AdamW's step (optimizer.name: muon); for "
                "adamw, optimizer.fused is PyTorch's own fused step."
            )
        unused = {k: v for k, v in asdict(self.muon).items() if v != getattr(MuonConfig, k)}
        if self.name != "muon" and unused:
            values = ", ".join(f"{k}={v}" for k, v in unused.items())
            flags = " ".join(
                f"--model.optimizer.muon.{k} {str(getattr(MuonConfig, k)).lower()}" for k in unused
            )
            raise ValueError(
                f"optimizer.muon sets {values}, and optimizer.name={self.name!r} has no Muon "
                f"group: set optimizer.name: muon, or drop those settings ({flags} over a config "
                "that sets them, such as cpu60.yaml)."
            )


def build_optimizer(
    model: nn.Module, config: OptimizerConfig, *, sharded: bool = False
) -> torch.optim.Optimizer:
    """The optimizer `config` names, over `model`'s parameters (on their device already: Muon
    picks its iterations' dtype from it). `sharded`: the strategy shards parameters (FSDP)."""
    if config.name == "adamw":
        groups = param_groups(model, weight_decay=config.weight_decay)
        return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, fused=config.fused)
    if sharded:
        raise ValueError(
            "optimizer.name: muon orthogonalises whole weight matrices, and FSDP shards them "
            "across devices: use strategy ddp (each device holds every matrix) or "
            "optimizer.name: adamw."
        )
    muon = config.muon
    groups = muon_param_groups(
        model,
        weight_decay=config.weight_decay,
        lr=config.lr * muon.lr_scale,
        split_qkv=muon.split_qkv,
        patch_embed=muon.patch_embed,
    )
    return MuonAdamW(
        groups,
        lr=config.lr,
        betas=config.betas,
        momentum=muon.momentum,
        ns_steps=muon.ns_steps,
        compiled=config.compile,
    )


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay matrices; spare biases, norms, the CLS token and positions."""
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def muon_param_groups(
    model: nn.Module,
    *,
    weight_decay: float,
    lr: float | None = None,
    split_qkv: bool = False,
    patch_embed: bool = False,
) -> list[dict[str, Any]]:
    """A Muon group of the blocks' weight matrices (decayed; its own peak `lr` if given, which
    the schedule scales as it does the others'), then `param_groups` of the rest for AdamW.
    `split_qkv`: the qkv matrices go in a Muon group of their own with split 3 (MuonAdamW._muon).
    `patch_embed`: the patch projection's weight joins the Muon group."""
    muon = [
        p
        for name, p in model.named_parameters()
        if p.requires_grad
        and (
            (name.startswith("blocks.") and p.ndim == 2)
            or (patch_embed and name == "patch_embed.proj.weight")
        )
    ]
    taken = {id(p) for p in muon}
    rest = [
        dict(group, params=[p for p in group["params"] if id(p) not in taken])
        for group in param_groups(model, weight_decay=weight_decay)
    ]
    group = {"weight_decay": weight_decay, "use_muon": True} | ({} if lr is None else {"lr": lr})
    qkv = {
        id(p) for name, p in model.named_parameters() if split_qkv and name.endswith("qkv.weight")
    }
    muon_groups = [
        dict(group, params=[p for p in muon if id(p) not in qkv]),
        dict(group, params=[p for p in muon if id(p) in qkv], split=3),
    ]
    return [g for g in muon_groups if g["params"]] + rest


def check_resume_layout(saved: dict[str, Any], ours: OptimizerConfig) -> None:
    """A resumed fit restores the optimizer state, which fits only the parameter groups it was
    saved with: say which settings to resume with, before torch's "different number of
    parameter groups". `saved`: the checkpoint's optimizer settings (a dict)."""
    muon = saved.get("muon") or {}
    theirs = {
        "name": saved.get("name", "adamw"),
        "muon.split_qkv": muon.get("split_qkv", False),
        "muon.patch_embed": muon.get("patch_embed", False),
    }
    mine = {
        "name": ours.name,
        "muon.split_qkv": ours.muon.split_qkv,
        "muon.patch_embed": ours.muon.patch_embed,
    }
    if theirs != mine:
        flags = " ".join(f"--model.optimizer.{k} {str(v).lower()}" for k, v in theirs.items())
        raise ValueError(
            f"--ckpt_path: the checkpoint's optimizer state was saved with {theirs} and this run "
            f"has {mine}; a resume needs the same optimizer layout. Resume with {flags}, or "
            "start a fresh run without --ckpt_path."
        )
