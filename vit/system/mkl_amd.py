"""MKL's AVX2 kernels on AMD CPUs: a process-wide switch for the entry points (imports no torch).

PyTorch's x86 wheels multiply float32 matrices with Intel's MKL, which chooses its kernels by CPU
vendor: on an AMD CPU it takes its generic path ("Intel(R) Architecture processors" under
MKL_VERBOSE=1) even where the CPU has AVX2 and FMA. The AVX2 path trained the 60-minute recipe's
model faster in float32 at 32x32 on an AMD EPYC (experiments/record/benchmarks/mkl_amd.md); on an AMD
CPU with AVX-512 the same answer makes MKL take its AVX-512 path.

MKL asks `mkl_serv_intel_cpu()` whether the CPU is Intel's, through libtorch_cpu.so's symbol table,
so a library in the global symbol scope that answers 1 makes MKL take the path its CPU-feature
checks allow; PyTorch's maintainers suggest the same for AMD CPUs (pytorch/builder#1245, there
with LD_PRELOAD). The library must be loaded before torch: Python loads torch with RTLD_NOW, which
binds libtorch_cpu.so's call to its own `mkl_serv_intel_cpu` at import, and a library loaded later
changes nothing (tests/test_mkl_amd.py shows both orders). So `import vit` does none of this; the
commands (vit/commands/entry.py, scripts/benchmark.py) call `enable()` before they import torch.

`enable()` compiles the two-line library once with the system's C compiler into a private folder
(`mkl_amd/` under $VIT_CACHE_DIR or ~/.cache/vit, mode 0o700), writes it atomically, and loads it
only where that folder and file belong to this user and no one else can write them. It does
nothing on Intel CPUs, on CPUs without AVX2 and FMA, off Linux, or without a C compiler;
VIT_MKL_AVX2=0 turns it off. `status()` says what it did, and why not where it did nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from vit.system.paths import default_cache_dir

log = logging.getLogger(__name__)
ENV = "VIT_MKL_AVX2"
SOURCE = (
    "/* vit: MKL's vendor check answers 'Intel' so it uses the AVX2 kernels (vit/system/mkl_amd.py). */\n"
    "int mkl_serv_intel_cpu(void) { return 1; }\n"
    "int mkl_serv_intel_cpu_true(void) { return 1; }\n"
)
_status = "not tried: vit.system.mkl_amd.enable() has not run"


class UnsafeShim(RuntimeError):
    """The shim's folder or file could be written by someone else: it is not loaded."""


def status() -> str:
    """What enable() did: starts with 'on' when MKL's AVX2 path was switched on."""
    return _status


def read_cpuinfo() -> str | None:
    """/proc/cpuinfo's text, None where there is none (tests replace this to fake a CPU)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def cpu_info(text: str) -> tuple[str, set[str]]:
    """(vendor_id, flags) of the first processor in /proc/cpuinfo's text."""
    vendor, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return vendor, flags


def reason_not_needed(env: str | None, platform: str, cpuinfo: str | None) -> str | None:
    """Why the shim does not apply here (None: it does): the env switch, the OS, the CPU."""
    if env is not None and env.strip().lower() in ("0", "false", "no", "off"):
        return f"off: {ENV}={env}"
    if not platform.startswith("linux"):
        return f"not needed: {platform} (the shim is for Linux)"
    if cpuinfo is None:
        return "not needed: /proc/cpuinfo unreadable"
    vendor, flags = cpu_info(cpuinfo)
    if vendor not in ("AuthenticAMD", "HygonGenuine"):
        return f"not needed: {vendor or 'unknown'} CPU (MKL picks its kernels by features there)"
    if not {"avx2", "fma"} <= flags:
        return "not needed: the CPU has no AVX2 and FMA, MKL's generic path is its best"
    return None


def check_private(st: os.stat_result, path: Path) -> None:
    """Raise UnsafeShim unless path (as lstat/fstat saw it) is this user's and only theirs to write."""
    if st.st_uid != os.getuid():
        raise UnsafeShim(f"{path} is owned by uid {st.st_uid}, not by this user ({os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeShim(f"{path} is writable by others (mode {stat.filemode(st.st_mode)})")


def private_dir(cache_dir: Path) -> Path:
    """cache_dir/mkl_amd, created 0o700; UnsafeShim where it is a link or not private."""
    folder = cache_dir / "mkl_amd"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeShim(f"{folder} is not a folder (a link?)")
    check_private(st, folder)
    return folder


def shim_path(folder: Path) -> Path:
    """Where the shim built from SOURCE lives in folder."""
    return folder / f"libvit_mkl_amd-{hashlib.sha256(SOURCE.encode()).hexdigest()[:12]}.so"


def build(folder: Path) -> Path:
    """The shim, compiled once per source text into folder, written atomically (a rename within
    folder: parallel processes race safely). RuntimeError where no C compiler works."""
    lib = shim_path(folder)
    if lib.is_file():
        return lib
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc; or set CC)")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src, out = Path(tmp) / "shim.c", Path(tmp) / "shim.so"
        src.write_text(SOURCE)
        try:
            done = subprocess.run(
                [cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(src)],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise RuntimeError(f"{cc} could not run: {err}") from err
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[:300]}")
        out.chmod(0o700)  # whatever the umask: the loader refuses group-writable files
        os.replace(out, lib)
    return lib


def load_global(lib: Path) -> None:
    """dlopen lib into the global symbol scope, through the descriptor that was checked (so the
    file cannot be swapped between the check and the load); UnsafeShim where it is not private."""
    fd = os.open(lib, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeShim(f"{lib} is not a regular file")
        check_private(st, lib)
        ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_GLOBAL)
    finally:
        os.close(fd)


def _switch_on() -> str:
    """Build (once) and load the shim; the status to report."""
    folder = private_dir(default_cache_dir())
    lib = build(folder)
    try:
        load_global(lib)
    except OSError:  # a damaged cached copy: build it afresh, once
        lib.unlink(missing_ok=True)
        load_global(build(folder))
    return (
        "on: MKL (torch's float32 BLAS on x86) takes its AVX2 or AVX-512 kernels, "
        f"as the CPU allows ({lib})"
    )


def enable() -> str:
    """Switch MKL to its AVX2 kernels on an AMD CPU, if torch is not loaded yet; return status().
    Never raises: what went wrong is in the status (report() logs it)."""
    global _status
    if _status.startswith("on"):
        return _status
    reason = reason_not_needed(os.environ.get(ENV), sys.platform, read_cpuinfo())
    if reason is not None:
        _status = reason
    elif "torch" in sys.modules:
        _status = (
            "not possible: torch was imported first, and its MKL is bound to its own vendor "
            "check by then; run vit-train, vit-evaluate or vit-visualize (or call "
            "vit.system.mkl_amd.enable() before importing torch) for MKL's AVX2 kernels on this AMD CPU"
        )
    else:
        try:
            _status = _switch_on()
        except UnsafeShim as err:
            _status = f"not possible: refused to load the shim ({err})"
        except (OSError, RuntimeError) as err:
            _status = f"not possible: the shim did not build or load ({err})"
    return _status


def report(info: Callable[[str], object] = log.info) -> None:
    """Log status() once where it matters: info where on, a warning where an AMD CPU lost speed."""
    if _status.startswith("not possible"):
        log.warning("MKL's AVX2 kernels (vit/system/mkl_amd.py): %s", _status)
    elif _status.startswith("on"):
        info(f"vit.system.mkl_amd: {_status}")
