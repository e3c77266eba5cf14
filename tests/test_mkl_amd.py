"""vit.mkl_amd: MKL's AVX2 kernels on AMD CPUs, switched on before torch loads, and nowhere else."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vit import mkl_amd

REPO = Path(__file__).resolve().parents[1]
AMD = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\n\nvendor_id\t: AuthenticAMD\n"
INTEL = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"


def _cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


HERE = mkl_amd.reason_not_needed(None, sys.platform, _cpuinfo())  # None: this CPU gets the shim
HAS_CC = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
PROBE = (
    "import {first}, {second}, torch\n"
    "torch.manual_seed(0)\n"
    "a = torch.randn(384, 256)\n"
    "torch.save(a @ a.T, {out!r})\n"
    "print('STATUS', vit.mkl_amd.status())\n"
)


def probe(tmp_path: Path, *, env: dict[str, str], torch_first: bool = False) -> tuple[str, str]:
    """Import vit (and torch) in a fresh process, multiply once under MKL_VERBOSE=1; return
    (MKL's banner line, vit.mkl_amd.status()); the product is saved to tmp_path/<status word>.pt."""
    out = tmp_path / f"product-{len(list(tmp_path.glob('product-*')))}.pt"
    first, second = ("torch", "vit") if torch_first else ("vit", "os")
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first, second=second, out=str(out))],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "MKL_VERBOSE": "1", **env},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    banner = next((ln for ln in lines if "oneMKL" in ln or "Intel(R) MKL" in ln), "")
    status = next(ln for ln in lines if ln.startswith("STATUS ")).removeprefix("STATUS ")
    return banner, status


def fast_path(banner: str) -> bool:
    """MKL's banner names a vector path of its own (AVX2, or AVX-512 on a CPU that has it, such
    as AMD's Zen 4), not its generic 'Intel(R) Architecture processors' path."""
    return "AVX2" in banner or "AVX-512" in banner


def test_fast_path_reads_mkl_banners():
    head = "MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture "
    assert fast_path(
        head + "Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors"
    )
    assert fast_path(
        head + "Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support"
    )
    assert not fast_path(head + "Intel(R) Architecture processors, Lnx 2.60GHz lp64 gnu_thread")


def test_cpu_info_reads_the_first_processor():
    vendor, flags = mkl_amd.cpu_info(AMD)
    assert vendor == "AuthenticAMD"
    assert {"avx2", "fma"} <= flags and "avx512f" not in flags


@pytest.mark.parametrize(
    ("env", "platform", "cpuinfo", "expected"),
    [
        (None, "linux", AMD, None),
        ("1", "linux", AMD, None),
        ("0", "linux", AMD, "off"),
        ("false", "linux", AMD, "off"),
        (None, "darwin", AMD, "not needed"),
        (None, "linux", None, "not needed"),
        (None, "linux", INTEL, "not needed"),
        (None, "linux", AMD.replace(" avx2 fma", ""), "not needed"),
    ],
)
def test_reason_not_needed(env, platform, cpuinfo, expected):
    reason = mkl_amd.reason_not_needed(env, platform, cpuinfo)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(expected)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_build_compiles_the_shim_once(tmp_path):
    lib = mkl_amd.build(tmp_path)
    assert lib.is_file() and lib.parent == tmp_path
    shim = ctypes.CDLL(str(lib))  # local scope here: this process's MKL is untouched
    assert shim.mkl_serv_intel_cpu() == 1 and shim.mkl_serv_intel_cpu_true() == 1
    built = lib.stat().st_mtime_ns
    assert mkl_amd.build(tmp_path) == lib and lib.stat().st_mtime_ns == built  # cached
    assert [p.name for p in tmp_path.iterdir()] == [lib.name]  # no temporary files left


@pytest.mark.parametrize("cc", ["false", "/nonexistent/cc"])
def test_build_says_when_the_compiler_fails(tmp_path, monkeypatch, cc):
    monkeypatch.setenv("CC", cc)
    with pytest.raises(RuntimeError, match="cc|false"):
        mkl_amd.build(tmp_path)
    assert not list(tmp_path.glob("*.so"))


def test_import_switches_mkl_only_where_it_helps(tmp_path):
    """On an AMD CPU with AVX2 (and a compiler): MKL's banner names its AVX2 or AVX-512 path and
    status() says 'on';
    elsewhere status() gives the reason it did nothing."""
    banner, status = probe(tmp_path, env={"VIT_CACHE_DIR": str(tmp_path / "cache")})
    if HERE is not None:
        assert status == HERE
    elif not HAS_CC:
        assert status.startswith("not possible")
    else:
        assert status.startswith("on"), status
        assert fast_path(banner), banner


@pytest.mark.skipif(HERE is not None or not HAS_CC, reason=f"the shim does not apply: {HERE}")
def test_off_switch_torch_first_and_same_products(tmp_path):
    import torch

    cache = {"VIT_CACHE_DIR": str(tmp_path / "cache")}
    banner_on, status_on = probe(tmp_path, env=cache)
    banner_off, status_off = probe(tmp_path, env={**cache, "VIT_MKL_AVX2": "0"})
    assert status_on.startswith("on") and fast_path(banner_on), banner_on
    assert status_off == "off: VIT_MKL_AVX2=0" and not fast_path(banner_off), banner_off
    on, off = (torch.load(tmp_path / f"product-{i}.pt") for i in (0, 1))
    torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-4)  # float32, other kernels
    _, status_late = probe(tmp_path, env=cache, torch_first=True)
    assert status_late.startswith("not possible: torch was imported before vit")


@pytest.mark.skipif(HERE is not None or not HAS_CC, reason=f"the shim does not apply: {HERE}")
def test_a_corrupt_cached_shim_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    damaged = mkl_amd.shim_path(cache)
    damaged.write_bytes(b"not an ELF file")
    banner, status = probe(tmp_path, env={"VIT_CACHE_DIR": str(cache)})
    assert status.startswith("on") and fast_path(banner), (status, banner)
    assert damaged.read_bytes()[:4] == b"\x7fELF"  # rebuilt in place
