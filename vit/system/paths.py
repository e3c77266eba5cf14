"""Where vit keeps what it builds once: decoded datasets, the MKL shim (no torch import here)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """$VIT_CACHE_DIR if set, else ~/.cache/vit."""
    return Path(os.environ.get("VIT_CACHE_DIR") or Path.home() / ".cache" / "vit").expanduser()
