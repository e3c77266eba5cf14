"""What a checkpoint keeps beyond the weights so that a resumed fit goes on exactly: the global
RNG (dropout, drop-path), and the epoch's training loss so far (for a mid-epoch resume)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def save_rng_and_loss(checkpoint: dict[str, Any], loss_sum: Tensor, loss_count: Tensor) -> None:
    """Into `checkpoint`: the RNG states (CPU, and every GPU's) and the running loss sum."""
    checkpoint["rng_state"] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        checkpoint["rng_state"]["cuda"] = torch.cuda.get_rng_state_all()
    checkpoint["train_loss_sum"] = [loss_sum.cpu(), loss_count.cpu()]


def restore_rng_and_loss(checkpoint: dict[str, Any], loss_sum: Tensor, loss_count: Tensor) -> None:
    """From `checkpoint`, what save_rng_and_loss kept (each part only where it is there)."""
    if "train_loss_sum" in checkpoint:
        total, count = checkpoint["train_loss_sum"]
        loss_sum.copy_(total)
        loss_count.copy_(count)
    state = checkpoint.get("rng_state") or {}
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
