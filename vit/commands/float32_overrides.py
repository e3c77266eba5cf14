"""`--float32_overrides`: the options a fit replaces where a CPU trains in float32 (no native
bf16: fewer steps fit in a time budget there), and the one of them dropped where it cannot run."""

from __future__ import annotations

import copy
import logging
from typing import Any

from vit.system.hardware import check_cpp_compiler, runs_on_cpu

log = logging.getLogger(__name__)


def trains_float32_on_cpu(trainer: Any) -> bool:
    """Whether the trainer's config trains in 32-bit precision on a CPU (as resolved: after the
    bf16 fallback)."""
    # None: Lightning's default, 32-true
    return runs_on_cpu(trainer.accelerator) and trainer.precision in (None, 32, "32", "32-true")


# the options that compile: the network, and the optimizer's update
COMPILES = ("model.torch_compile", "model.optimizer.compile")


def compile_if_possible(overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides less the options that compile (COMPILES) where no C++ compiler can build
    inductor's CPU code: the compile is the recipe's choice, not the user's, so the fit trains
    eager (with a warning saying how to get the compile back) instead of failing at its start."""
    asked = [key for key in COMPILES if dotted(overrides).get(key)]
    if not asked:
        return overrides
    try:
        check_cpp_compiler()
    except RuntimeError as err:
        log.warning(
            "float32_overrides: %s left out, the fit trains eager: %s", ", ".join(asked), err
        )
        return without_compile(overrides)
    return overrides


def without_compile(overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of the overrides less the options that compile (COMPILES; a section left empty
    goes too): what a fit that must stay eager applies."""

    def prune(node: dict[str, Any], prefix: str) -> dict[str, Any]:
        kept = {}
        for key, value in node.items():
            if isinstance(value, dict) and value:
                value = prune(value, f"{prefix}{key}.")
                if value == {}:
                    continue
            if f"{prefix}{key}" not in COMPILES:
                kept[key] = value
        return kept

    return prune(copy.deepcopy(overrides), "")


def dotted(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{a: {b: 1}} -> {"a.b": 1}: the options a nested mapping sets."""
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, dict) and value:
            flat |= dotted(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat
