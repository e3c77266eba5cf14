"""glibc's malloc told to keep the memory a training step frees: a process-wide switch (no torch).

PyTorch's CPU tensors come from malloc. glibc hands memory at the top of its heap back to the
kernel once more than M_TRIM_THRESHOLD of it is free, and serves a chunk over M_MMAP_THRESHOLD with
a fresh mmap; both start at 128 KiB and rise only after a larger chunk is freed. A training step
frees its activations and makes them again, so until some large tensor lifts the thresholds, every
step gives tens of MB back and faults them in again, each 4 KiB page zeroed by the kernel: at the
60-minute recipe's 16-pixel stage, ~11,000 page faults a step and ~9% of the CPU's time in the
kernel (experiments/record/benchmarks/NOTES.md, "glibc's malloc and the 16-pixel stage").
`keep_freed_memory()` sets both thresholds high through mallopt, as jemalloc or tcmalloc would keep
freed pages: the process holds its peak memory instead of returning it between steps.

mallopt takes effect at once, so this may run at any time, after torch too. It does nothing off
glibc, where the user chose malloc's settings or another malloc (GLIBC_TUNABLES's glibc.malloc.*,
a MALLOC_* variable, jemalloc, tcmalloc or mimalloc in LD_PRELOAD), or with
VIT_KEEP_FREED_MEMORY=0. `status()` says what it did.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)
ENV = "VIT_KEEP_FREED_MEMORY"
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h
# mmap's ceiling on 64-bit glibc (HEAP_MAX_SIZE / 2); mallopt refuses more. Tensors above it
# (none in a step at batch 128 and 32 px) keep their own mmap.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 2**31 - 1  # mallopt's largest (an int): up to 2 GiB free at the top stays
TOP_PAD = 64 << 20  # grow the heap in 64 MiB reaches; pages are only faulted when touched
KEPT = (MMAP_THRESHOLD, TRIM_THRESHOLD, TOP_PAD)  # set_thresholds' arguments for the switch
_status = "not tried: vit.system.malloc.keep_freed_memory() has not run"


def status() -> str:
    """What keep_freed_memory() did: starts with 'on' when the thresholds were set."""
    return _status


def user_tuned(environ: Mapping[str, str]) -> str | None:
    """The variable by which the user chose malloc's settings, or another malloc, if any."""
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    if any(name in environ.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc")):
        return "LD_PRELOAD"
    return next((k for k in sorted(environ) if k.startswith("MALLOC_")), None)


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> str:
    """Raise glibc's trim and mmap thresholds for this process; return status(). Never raises."""
    global _status
    if environ.get(ENV, "").strip() == "0":
        _status = f"off: {ENV}=0"
    elif (tuned := user_tuned(environ)) is not None:
        _status = f"off: malloc is tuned by {tuned}"
    else:
        _status = _set_thresholds()
    return _status


def report(info: Callable[[str], object] = log.info) -> None:
    """Log status() where keep_freed_memory() ran and did or failed to do something."""
    if _status.startswith(("on", "not possible")):
        info(f"vit.system.malloc: {_status}")


@functools.cache
def _glibc() -> tuple[ctypes.CDLL, str] | None:
    """This process's C library and glibc's version, looked up once; None where it is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        version = libc.gnu_get_libc_version().decode()
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (AttributeError, OSError):  # musl, macOS, Windows: another malloc
        return None
    return libc, version


def set_thresholds(mmap_threshold: int, trim_threshold: int, top_pad: int) -> str:
    """mallopt's three settings for this process: 'on: glibc VERSION', or why not (never raises)."""
    if (glibc := _glibc()) is None:
        return "not needed: the C library is not glibc"
    libc, version = glibc
    settings = {
        "M_MMAP_THRESHOLD": (M_MMAP_THRESHOLD, mmap_threshold),
        "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, trim_threshold),
        "M_TOP_PAD": (M_TOP_PAD, top_pad),
    }
    refused = [n for n, (param, value) in settings.items() if libc.mallopt(param, value) != 1]
    if refused:
        return f"not possible: glibc {version}'s mallopt refused {', '.join(refused)}"
    return f"on: glibc {version}"


def trim() -> None:
    """Hand every free page back to the kernel now (glibc's malloc_trim), as glibc's defaults
    may between steps: what scripts/recipe_step.py's glibc-malloc variant measures. Not glibc:
    nothing to hand back this way."""
    if (glibc := _glibc()) is not None:
        glibc[0].malloc_trim(0)


def _set_thresholds() -> str:
    done = set_thresholds(*KEPT)
    if not done.startswith("on"):
        return done
    return (
        f"{done} keeps the memory a step frees (mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
        f"trim threshold {TRIM_THRESHOLD >> 20} MiB)"
    )
