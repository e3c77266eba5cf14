"""Safe checkpoint reading: weights-only unpickling, never running code from a file, and an error
that names what is wrong with a missing, empty, damaged or hostile file."""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from vit.io.migrate import migrate_checkpoint
from vit.io.pretrained import available

_LEGACY_MAGIC = b"l\xfc\x9cF\xf9 j\xa8P\x19"  # torch.save's pre-zip format starts with this number


WEIGHTS = ("average", "live")  # which weights of a checkpoint trained with vit.train.callbacks.EMA


WEIGHTS_HELP = (
    "for a checkpoint trained with vit.train.callbacks.EMA: use its averaged weights (the default) or "
    "the live weights trained beside them"
)


CHECKPOINT_HELP = (
    "a .ckpt written by vit-train, a .safetensors from export_safetensors, a save_pretrained "
    "folder, hf-hub:owner/name (downloaded), or the name of shipped weights: " + available()
)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint with weights-only unpickling; never runs code stored in the file."""
    path = _existing_file(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if _file_kind(path) == "unknown":  # garbage that happened to hit a refused opcode
            raise ValueError(_not_a_checkpoint(path)) from None
        raise ValueError(
            f"refusing to load {str(path)!r}: besides tensors and plain values it holds Python "
            f"objects ({', '.join(_unsafe_globals(path, err)) or 'unknown'}), and unpickling them "
            f"could run code. Nothing from the file was run. If you trust its origin, load it "
            f"once with torch.load(path, weights_only=False) and torch.save only its state_dict "
            f"and hyper_parameters; share that (or export_safetensors of it)."
        ) from None
    except Exception as err:  # torch raises many types on damaged files (EOF, Index, Key, Runtime)
        kind = _file_kind(path)
        if kind == "unknown":
            raise ValueError(_not_a_checkpoint(path)) from None
        raise ValueError(
            f"{str(path)!r} looks like a {kind} PyTorch checkpoint but cannot be read: it is "
            f"probably truncated or corrupt (an interrupted save or copy?). Copy or save it "
            f"again. Details: {type(err).__name__}: {_first_sentence(err)}"
        ) from None
    if not isinstance(ckpt, dict):
        raise ValueError(
            f"{str(path)!r} holds a {type(ckpt).__name__}, not a checkpoint dict; expected a "
            f".ckpt from vit-train or a saved state_dict."
        )
    return migrate_checkpoint(ckpt)


def _existing_file(path: str | Path) -> Path:
    """`path` as a Path, or a clear error if it is missing, a directory or empty."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"{str(path)!r} is a directory, not a checkpoint file; pass the file inside it, e.g. "
            f"{str(path / 'last.ckpt')!r} (vit-train writes version_N/checkpoints/*.ckpt)."
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist. Pass the path of a .ckpt that vit-train "
            f"wrote, e.g. runs/quick/version_0/checkpoints/last.ckpt."
        )
    if path.stat().st_size == 0:
        raise ValueError(
            f"{str(path)!r} is empty (0 bytes): an interrupted save or copy? Save or copy it again."
        )
    return path


def _file_kind(path: Path) -> str:
    """'zip' or 'legacy' for torch.save's two formats by their first bytes, else 'unknown'."""
    with path.open("rb") as f:
        head = f.read(32)
    if head.startswith(b"PK\x03\x04") or zipfile.is_zipfile(path):
        return "zip"
    return "legacy" if _LEGACY_MAGIC in head else "unknown"


def _not_a_checkpoint(path: Path) -> str:
    if path.suffix == ".safetensors":
        return (
            f"{str(path)!r} is not a torch.save checkpoint; read .safetensors files with "
            f"load_safetensors or load_weights."
        )
    return (
        f"{str(path)!r} is not a PyTorch checkpoint: its first bytes match neither format that "
        f"torch.save writes (random bytes, another file type, or the wrong path?). Pass a .ckpt "
        f"written by vit-train or a file from torch.save."
    )


def _unsafe_globals(path: Path, err: Exception) -> list[str]:
    """Names of the Python objects a refused file asks for, read without running anything."""
    try:  # lists the pickle's GLOBAL opcodes of a zip checkpoint without unpickling; a set, so
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))  # sorted
    except Exception:
        return re.findall(r"Unsupported global: GLOBAL (\S+)", str(err))


def _first_sentence(err: Exception) -> str:
    """torch's loader errors run to paragraphs; their first sentence says what failed."""
    return re.split(r"(?<=\.)\s|\n", str(err).strip(), maxsplit=1)[0]
