"""Process settings that make CPU training faster without changing any result: the allocator."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest accepted value on 64-bit
TRIM_THRESHOLD = 1024**3


def keep_freed_memory() -> bool:
    """Let glibc keep freed activation buffers for reuse instead of unmapping them.

    By default glibc serves every allocation above a few MB (a batch's activations) with a fresh
    mmap and unmaps it on free, so each training step faults in and zeroes its activations' pages
    again: on a 2-core CPU that was about a fifth of a ViT training step
    (experiments/benchmarks/NOTES.md). Raising the mmap threshold to 32 MB and the trim threshold
    to 1 GB keeps those buffers in the heap, the way a caching allocator would. Numbers are
    unchanged: only where memory comes from. Set VIT_KEEP_FREED_MEMORY=0 to skip it. Returns
    whether the settings were applied (False off glibc, e.g. on macOS or musl).
    """
    if os.environ.get("VIT_KEEP_FREED_MEMORY", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it)
    except (OSError, AttributeError, TypeError):
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    if not ok:
        log.warning("mallopt refused the allocator settings; training runs, a little slower")
    return ok
