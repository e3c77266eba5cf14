"""One inductor cache per ATen kernel setting: a process-wide switch for the entry points (no torch).

torch 2.14's inductor cache keys its compiled CPU kernels without the vector width they were
generated for, while `ATEN_CPU_CAPABILITY` changes that width. A cache filled under one setting
hands another setting its kernels: NaN at the first step of `vit-train` under
`ATEN_CPU_CAPABILITY=avx2` after a run under the machine's own AVX-512, a C++ compile error under
`default`, and out-of-bounds stores the other way round (experiments/record/kernels.md, "A finding:
inductor's cache does not key on ATEN_CPU_CAPABILITY"). So where the setting is given and no cache
folder is, each setting gets a folder of its own. A cache folder the user chose is left as it is.
It must run before anything imports torch._inductor, which fixes the folder on first use.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import MutableMapping

CAPABILITY = "ATEN_CPU_CAPABILITY"
CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"


def separate_by_capability(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Point inductor at `<tmp>/torchinductor_<user>-<capability>` when a capability is set and no
    cache folder is; returns the folder set, or None where nothing changed."""
    capability = environ.get(CAPABILITY, "").strip()
    if not capability or environ.get(CACHE_DIR):
        return None
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", capability)  # the value names a folder: no separators
    folder = os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}-{tag}")
    environ[CACHE_DIR] = folder
    return folder


def _user() -> str:
    """The user's name as inductor's default folder spells it (uid_N where there is no name)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a passwd entry
        name = f"uid_{os.getuid()}"
    return re.sub(r'[\\/:*?"<>|]', "_", name)
