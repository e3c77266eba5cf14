"""What the machine offers (fast bfloat16, a CUDA device, a C++ compiler): the one home of
hardware probes.

It imports no other vit module, so anything in vit (the optimizer, the commands) can ask it
without pulling in the training stack.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


BF16_ENV = "VIT_CPU_BF16"  # 0: answer "no native bf16" on any CPU


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively: AVX512-BF16 or AMX on x86.

    oneDNN also offers bf16 on plain AVX-512 by emulation, and AVX2-only CPUs fall back to a
    reference kernel; both train slower in bf16 than in float32 (experiments/record/benchmarks/
    fp32.md, cpu-avx512-nobf16.md). Elsewhere (Arm, or no /proc/cpuinfo), oneDNN's own answer.
    VIT_CPU_BF16=0 answers no on any CPU: a bf16 CPU then takes the float32 path the others take
    (the precision fallback, `float32_overrides`, Muon in float32), to measure it beside bf16.
    """
    if bf16_switched_off():
        return False
    flags = cpu_flags()
    if flags is not None and platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        return bool(flags & {"avx512_bf16", "amx_bf16"})
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_switched_off() -> bool:
    """Whether VIT_CPU_BF16=0 is set; a value other than 0 or 1 is refused, not ignored."""
    value = os.environ.get(BF16_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(
            f"{BF16_ENV}={value!r}: expected 0 (train as a CPU without native bf16 does) or 1 "
            f"(the default: ask the CPU); unset it or set one of those."
        )
    return value == "0"


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux), or None where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return None


# the x86 flags that decide the kernels and the training dtype, in the order records name them
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def vector_flags() -> list[str]:
    """Which of VECTOR_FLAGS this CPU has, in that order (none where /proc/cpuinfo is absent)."""
    flags = cpu_flags() or set()
    return [f for f in VECTOR_FLAGS if f in flags]


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() is empty on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def runs_on_cpu(accelerator: Any) -> bool:
    """Whether a Trainer's `accelerator` setting trains on the CPU ("auto": no CUDA, no MPS)."""
    return accelerator == "cpu" or (
        accelerator == "auto"
        and not torch.cuda.is_available()
        and not torch.backends.mps.is_available()
    )


def cpu_precision(precision: Any, accelerator: Any) -> Any:
    """The precision to train with: a bf16 one becomes 32-true on a CPU without native bf16."""
    if not (runs_on_cpu(accelerator) and str(precision).startswith("bf16")) or cpu_has_fast_bf16():
        return precision
    why = (
        f"{BF16_ENV}=0 treats this CPU as one without native bfloat16 matrix products"
        if bf16_switched_off()
        else "this CPU has no native bfloat16 matrix products (no AVX512-BF16 or AMX)"
    )
    log.warning(
        "trainer.precision=%s: %s, where bf16 trains many times slower than float32 "
        "(experiments/record/benchmarks/fp32.md); training in 32-true instead. Pass "
        "--bf16_fallback false to keep %s.",
        precision,
        why,
        precision,
    )
    return "32-true"


def resolve_device(name: str) -> torch.device:
    """`--device`: auto (CUDA when visible, else CPU), cpu, cuda or cuda:N, checked here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N.")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"--device {name}: no CUDA GPU is visible here; use --device cpu.")
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"--device {name}: this machine has {count} CUDA GPU(s), cuda:0 to "
                f"cuda:{count - 1}."
            )
    return device


def check_cpp_compiler(
    option: str = "model.torch_compile", off: str = "set model.torch_compile: false"
) -> None:
    """torch.compile's CPU code is C++ built at run time: fail at the start of the fit (or of
    whatever `option` compiles), with the fix, where inductor would fail inside the first step."""
    cxx = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")  # inductor's
    if shutil.which(cxx) is None:
        raise RuntimeError(
            f"{option} needs a C++ compiler on CPU and {cxx!r} (the CXX variable, or the "
            f"platform's default) is not on PATH: install one (e.g. apt install g++), point "
            f"CXX at it, or {off}."
        )
