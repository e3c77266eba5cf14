"""vit.system.mkl_amd: MKL's AVX2 kernels on AMD CPUs, switched on before torch loads, and only then."""

from __future__ import annotations

import logging
import os
import platform
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import AMD, REPO
from vit.system import mkl_amd

INTEL = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"
ON = "on: MKL (torch's float32 BLAS on x86) takes its AVX2 or AVX-512 kernels, as the CPU allows ("
LATE = "not possible: torch was imported first, and its MKL is bound to its own vendor check"
HERE = mkl_amd.reason_not_needed(None, sys.platform, mkl_amd.read_cpuinfo())  # None: an AMD CPU
HAS_CC = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
SHIM = HAS_CC and sys.platform.startswith("linux")  # where enable() can build and load it
X86_MKL = platform.machine() in ("x86_64", "AMD64") and torch.backends.mkl.is_available()
# a fake CPU for a child process, then the switch, torch and one product under MKL_VERBOSE=1
PROBE = """
import sys
from vit.system import mkl_amd
mkl_amd.read_cpuinfo = lambda: {cpuinfo!r}
if {answer} is not None:  # the shim's answer to "is this an Intel CPU?"
    mkl_amd.SOURCE = mkl_amd.SOURCE.replace("return 1", "return {answer}")
if {torch_first}:
    import torch
print("STATUS", mkl_amd.enable())
if {force_late}:  # what enable() refuses to do: load the shim after torch
    mkl_amd.load_global(mkl_amd.build(mkl_amd.private_dir(mkl_amd.default_cache_dir())))
import torch
a = torch.randn(256, 256)
(a @ a).sum()
print("LIBS", [ln.split()[-1] for ln in open("/proc/self/maps") if "libvit_mkl_amd" in ln][:1])
"""


def probe(
    cache: Path,
    *,
    cpuinfo: str | None = AMD,
    answer: int | None = None,
    torch_first: bool = False,
    force_late: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[str, str, str]:
    """Run PROBE in a fresh process; return (MKL's banner line, status, shim mapped or '[]')."""
    code = PROBE.format(
        cpuinfo=cpuinfo, answer=answer, torch_first=torch_first, force_late=force_late
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "MKL_VERBOSE": "1", "VIT_CACHE_DIR": str(cache), **(env or {})},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    banner = next((ln for ln in lines if "oneMKL" in ln or "Intel(R) MKL" in ln), "")
    status = next(ln for ln in lines if ln.startswith("STATUS ")).removeprefix("STATUS ")
    libs = next(ln for ln in lines if ln.startswith("LIBS ")).removeprefix("LIBS ")
    return banner, status, libs


def fast_path(banner: str) -> bool:
    """MKL's banner names a vector path of its own (AVX2, or AVX-512), not its generic
    'Intel(R) Architecture processors' path."""
    return "AVX2" in banner or "AVX-512" in banner


def test_fast_path_reads_mkl_banners() -> None:
    head = "MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture "
    assert fast_path(head + "Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled")
    assert fast_path(head + "Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with")
    assert not fast_path(head + "Intel(R) Architecture processors, Lnx 2.60GHz lp64 gnu_thread")


def test_cpu_info_reads_the_first_processor() -> None:
    vendor, flags = mkl_amd.cpu_info(AMD)
    assert vendor == "AuthenticAMD"
    assert {"avx2", "fma"} <= flags and "avx512f" not in flags


@pytest.mark.parametrize(
    ("env", "platform_", "cpuinfo", "expected"),
    [
        (None, "linux", AMD, None),
        ("1", "linux", AMD, None),
        ("0", "linux", AMD, "off: VIT_MKL_AVX2=0"),
        ("false", "linux", AMD, "off: VIT_MKL_AVX2=false"),
        (None, "darwin", AMD, "not needed: darwin (the shim is for Linux)"),
        (None, "linux", None, "not needed: /proc/cpuinfo unreadable"),
        (
            None,
            "linux",
            INTEL,
            "not needed: GenuineIntel CPU (MKL picks its kernels by features there)",
        ),
        (
            None,
            "linux",
            AMD.replace(" avx2 fma", ""),
            "not needed: the CPU has no AVX2 and FMA, MKL's generic path is its best",
        ),
    ],
)
def test_reason_not_needed(
    env: str | None, platform_: str, cpuinfo: str | None, expected: str | None
) -> None:
    assert mkl_amd.reason_not_needed(env, platform_, cpuinfo) == expected


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """enable() not yet run, its cache in tmp_path/cache, an AMD CPU with AVX2 and FMA."""
    monkeypatch.setattr(mkl_amd, "_status", "not tried")
    monkeypatch.setattr(mkl_amd, "read_cpuinfo", lambda: AMD)
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(mkl_amd.ENV, raising=False)
    return tmp_path / "cache"


def test_enable_says_why_it_did_nothing(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert mkl_amd.enable().startswith(LATE)  # this test process imported torch already
    monkeypatch.setenv(mkl_amd.ENV, "0")
    assert mkl_amd.enable() == "off: VIT_MKL_AVX2=0"
    monkeypatch.delenv(mkl_amd.ENV)
    monkeypatch.setattr(mkl_amd, "read_cpuinfo", lambda: INTEL)
    expected = "not needed: GenuineIntel CPU (MKL picks its kernels by features there)"
    assert mkl_amd.enable() == expected and mkl_amd.status() == expected
    assert not fresh.exists()  # nothing compiled, nothing written


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_build_compiles_the_shim_once_into_a_private_folder(tmp_path: Path) -> None:
    folder = mkl_amd.private_dir(tmp_path)
    assert folder == tmp_path / "mkl_amd" and stat.S_IMODE(folder.stat().st_mode) == 0o700
    lib = mkl_amd.build(folder)
    assert lib.parent == folder and stat.S_IMODE(lib.stat().st_mode) == 0o700
    built = lib.stat().st_mtime_ns
    assert mkl_amd.build(folder) == lib and lib.stat().st_mtime_ns == built  # cached
    assert [p.name for p in folder.iterdir()] == [lib.name]  # no temporary files left


@pytest.mark.parametrize("cc", ["false", "/nonexistent/cc"])
def test_build_says_when_the_compiler_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cc: str
) -> None:
    monkeypatch.setenv("CC", cc)
    with pytest.raises(RuntimeError, match="cc|false"):
        mkl_amd.build(tmp_path)
    assert not list(tmp_path.glob("*.so"))


def test_check_private_refuses_another_users_file(tmp_path: Path) -> None:
    mine = os.stat(tmp_path)
    theirs = os.stat_result((stat.S_IFREG | 0o700, 1, 1, 1, os.getuid() + 1, 0, 0, 0, 0, 0))
    mkl_amd.check_private(mine, tmp_path)
    with pytest.raises(mkl_amd.UnsafeShim, match=f"owned by uid {os.getuid() + 1}, not by"):
        mkl_amd.check_private(theirs, tmp_path)


@pytest.mark.skipif(not SHIM, reason="no C compiler, or not Linux")
@pytest.mark.parametrize("what", ["folder", "file", "link"])
def test_enable_refuses_a_shim_others_can_write(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    lib = mkl_amd.build(mkl_amd.private_dir(fresh))
    if what == "folder":
        lib.parent.chmod(0o777)
        reason = f"{lib.parent} is writable by others (mode drwxrwxrwx)"
    elif what == "file":
        lib.chmod(0o720)
        reason = f"{lib} is writable by others (mode -rwx-w----)"
    else:  # the folder swapped for a link to one of someone else's
        shutil.move(lib.parent, fresh / "elsewhere")
        lib.parent.symlink_to(fresh / "elsewhere")
        reason = f"{lib.parent} is not a folder (a link?)"
    monkeypatch.delitem(sys.modules, "torch")  # as in a command that has not imported it yet
    status = mkl_amd.enable()  # no exception: a status, and a warning that gives the reason
    assert status == f"not possible: refused to load the shim ({reason})"
    mkl_amd.report()
    assert caplog.record_tuples == [
        (
            "vit.system.mkl_amd",
            logging.WARNING,
            f"MKL's AVX2 kernels (vit/system/mkl_amd.py): {status}",
        )
    ]


@pytest.mark.skipif(not (SHIM and X86_MKL), reason="needs Linux, a C compiler, torch with MKL")
def test_the_shim_takes_effect_before_torch_and_not_after(tmp_path: Path) -> None:
    """Why the commands switch before importing torch. A shim that answers 'not Intel' moves an
    Intel CPU's MKL to its generic path, so this shows on any x86 CPU whether MKL saw the shim."""
    banner, status, _ = probe(tmp_path / "a", cpuinfo=INTEL)
    if not fast_path(banner):
        pytest.skip(f"MKL takes its generic path here already: {banner}")
    assert status == "not needed: GenuineIntel CPU (MKL picks its kernels by features there)"
    banner, status, libs = probe(tmp_path / "b", answer=0)  # switched before torch loads
    assert status.startswith(ON) and str(tmp_path / "b" / "mkl_amd") in libs
    assert not fast_path(banner), banner  # MKL asked the shim
    banner, status, libs = probe(tmp_path / "c", answer=0, torch_first=True, force_late=True)
    assert status.startswith(LATE) and str(tmp_path / "c" / "mkl_amd") in libs  # loaded ...
    assert fast_path(banner), banner  # ... and ignored: torch's MKL was bound as torch loaded


@pytest.mark.skipif(not SHIM, reason="no C compiler, or not Linux")
def test_a_damaged_cached_shim_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mkl_amd, "SOURCE", mkl_amd.SOURCE.replace("return 1", "return 0"))
    damaged = mkl_amd.shim_path(mkl_amd.private_dir(tmp_path))  # the probe's shim (answer=0)
    damaged.write_bytes(b"not an ELF file")
    damaged.chmod(0o700)
    _, status, libs = probe(tmp_path, answer=0)
    assert status.startswith(ON) and str(damaged) in libs
    assert damaged.read_bytes()[:4] == b"\x7fELF"  # rebuilt in place


@pytest.mark.skipif(HERE is not None or not HAS_CC, reason=f"the shim does not apply: {HERE}")
def test_on_this_amd_cpu_the_switch_gives_mkls_avx2_path(tmp_path: Path) -> None:
    real = mkl_amd.read_cpuinfo()
    banner_on, status_on, _ = probe(tmp_path, cpuinfo=real)
    banner_off, status_off, libs = probe(tmp_path, cpuinfo=real, env={mkl_amd.ENV: "0"})
    assert status_on.startswith(ON) and fast_path(banner_on), banner_on
    assert status_off == "off: VIT_MKL_AVX2=0" and not fast_path(banner_off), banner_off
    assert libs == "[]"
