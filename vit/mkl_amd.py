"""MKL's AVX2 kernels on AMD CPUs, switched on before torch loads (imports no torch itself).

PyTorch's x86 wheels multiply float32 matrices with Intel's MKL, which chooses its kernels by CPU
vendor: on an AMD CPU it takes its generic path ("Intel(R) Architecture processors" under
MKL_VERBOSE=1) even where the CPU has AVX2 and FMA. On a 2-core AMD EPYC (Zen 3) the AVX2 path
trained the 60-minute recipe's model 1.19x faster in float32 at 32x32 (no gain at 16x16, where
the products are small): experiments/benchmarks/mkl_amd.md. On an AMD CPU with AVX-512 (Zen 4,
session 9's EPYC) the same answer makes MKL take its AVX-512 path instead (its banner under
MKL_VERBOSE=1 says so; its speed there is not measured: the recipes train in bf16 on such CPUs,
through oneDNN, which MKL's vendor check does not touch).

MKL asks `mkl_serv_intel_cpu()` whether the CPU is Intel's, through libtorch_cpu.so's symbol table,
so a library loaded into the global symbol scope before torch that answers 1 makes MKL take the
AVX2 path its CPU-feature checks allow; PyTorch's maintainers suggest the same for AMD CPUs
(pytorch/builder#1245, there with LD_PRELOAD). `enable()` compiles that two-line library once with
the system's C compiler into the cache (~/.cache/vit/, or $VIT_CACHE_DIR) and loads it with
RTLD_GLOBAL. It runs when `vit` is imported, so it takes effect where vit is imported before torch
(vit-train, vit-evaluate, vit-visualize and the scripts do); it does nothing on Intel CPUs, on CPUs
without AVX2 and FMA, off Linux, or without a C compiler, and VIT_MKL_AVX2=0 turns it off.
`status()` says what it did, and why not where it did nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from vit.paths import default_cache_dir

ENV = "VIT_MKL_AVX2"
SOURCE = (
    "/* vit: MKL's vendor check answers 'Intel' so it uses the AVX2 kernels (vit/mkl_amd.py). */\n"
    "int mkl_serv_intel_cpu(void) { return 1; }\n"
    "int mkl_serv_intel_cpu_true(void) { return 1; }\n"
)
_status = "not tried: vit.mkl_amd.enable() has not run"


def status() -> str:
    """What enable() did: starts with 'on' when MKL's AVX2 path was switched on."""
    return _status


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


def shim_path(cache_dir: Path) -> Path:
    """Where the shim built from SOURCE lives in cache_dir."""
    return cache_dir / f"libvit_mkl_amd-{hashlib.sha256(SOURCE.encode()).hexdigest()[:12]}.so"


def build(cache_dir: Path) -> Path:
    """The shim, compiled once per source text into cache_dir (atomically: parallel processes race
    safely). Raises RuntimeError when no C compiler works."""
    lib = shim_path(cache_dir)
    if lib.is_file():
        return lib
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc; or set CC)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
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
        os.replace(out, lib)
    return lib


def enable() -> str:
    """Switch MKL to its AVX2 kernels on an AMD CPU, if torch is not loaded yet; return status()."""
    global _status
    if _status.startswith("on"):
        return _status
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = None
    reason = reason_not_needed(os.environ.get(ENV), sys.platform, cpuinfo)
    if reason is not None:
        _status = reason
    elif "torch" in sys.modules:
        _status = (
            "not possible: torch was imported before vit, and MKL checks the CPU vendor as torch "
            "loads; import vit first to get MKL's AVX2 kernels on this AMD CPU"
        )
    else:
        try:
            lib = build(default_cache_dir())
            try:
                ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL)
            except OSError:  # a damaged cached copy: build it afresh, once
                lib.unlink(missing_ok=True)
                ctypes.CDLL(str(build(default_cache_dir())), mode=os.RTLD_GLOBAL)
            _status = (
                "on: MKL (torch's float32 BLAS on x86) takes its AVX2 or AVX-512 kernels, "
                f"as the CPU allows ({lib})"
            )
        except (OSError, RuntimeError) as err:
            _status = f"not possible: the shim did not build or load ({err})"
    return _status
