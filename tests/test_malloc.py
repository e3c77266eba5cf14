"""vit.system.malloc: glibc keeps the memory a step frees, unless the user chose otherwise."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from vit.system import malloc

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# In a fresh process: rounds of a step's pattern, many chunks under glibc's first mmap threshold
# (128 KiB) written and freed; the page faults of every round after the first, and one round's pages.
ROUNDS = """
import ctypes, json, resource, sys
from vit.system import malloc
status = malloc.keep_freed_memory({{}}) if {switch} else malloc.status()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
CHUNK, COUNT = 100 * 1024, 320  # 32 MiB a round
def one_round():
    chunks = [libc.malloc(CHUNK) for _ in range(COUNT)]
    for c in chunks:
        libc.memset(c, 1, CHUNK)  # touched, as a tensor's memory is
    for c in reversed(chunks):
        libc.free(c)
one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    one_round()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({{"status": status, "faults": faults, "pages": CHUNK * COUNT // resource.getpagesize()}}))
"""


def rounds(switch: bool) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")
    }
    done = subprocess.run(
        [sys.executable, "-c", ROUNDS.format(switch=switch)],
        cwd=REPO, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(
    not GLIBC, reason="the switch sets glibc's malloc; other C libraries keep theirs"
)
def test_with_the_switch_freed_memory_is_reused_without_page_faults() -> None:
    default, kept = rounds(False), rounds(True)
    assert default["status"].startswith("not tried")
    assert kept["status"].startswith("on: glibc"), kept["status"]
    # glibc's defaults hand the freed heap back: each of the 4 rounds faults most of its pages in again
    assert default["faults"] > 4 * 0.9 * default["pages"], default
    # kept: the rounds reuse the first round's pages; a tenth of one round's pages covers the
    # interpreter's own allocations in between
    assert kept["faults"] < 0.1 * kept["pages"], kept


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({malloc.ENV: "0"}, "off: VIT_KEEP_FREED_MEMORY=0"),
        ({malloc.ENV: " 0 "}, "off: VIT_KEEP_FREED_MEMORY=0"),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
            "off: malloc is tuned by GLIBC_TUNABLES",
        ),
        ({"MALLOC_ARENA_MAX": "2"}, "off: malloc is tuned by MALLOC_ARENA_MAX"),
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, "off: malloc is tuned by MALLOC_TRIM_THRESHOLD_"),
        ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "off: malloc is tuned by LD_PRELOAD"),
        ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "off: malloc is tuned by LD_PRELOAD"),
    ],
)
def test_the_users_own_malloc_settings_are_left_alone(
    monkeypatch: pytest.MonkeyPatch, environ: dict, expected: str
) -> None:
    def refuse() -> str:
        raise AssertionError("mallopt called although the user chose malloc's settings")

    monkeypatch.setattr(malloc, "_set_thresholds", refuse)
    monkeypatch.setattr(malloc, "_status", malloc._status)
    assert malloc.keep_freed_memory(environ) == expected == malloc.status()


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {malloc.ENV: "1"},
        {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"},  # not malloc's
        {"LD_PRELOAD": "libmylib.so"},
        {"MY_MALLOC_": "1"},  # not glibc's name
    ],
)
def test_other_settings_do_not_stop_the_switch(
    monkeypatch: pytest.MonkeyPatch, environ: dict
) -> None:
    monkeypatch.setattr(malloc, "_set_thresholds", lambda: "on: a test")
    monkeypatch.setattr(malloc, "_status", malloc._status)
    assert malloc.keep_freed_memory(environ) == "on: a test" == malloc.status()


@pytest.mark.parametrize(
    ("status", "logged"),
    [
        ("on: glibc 2.36 keeps freed memory", True),
        ("not possible: glibc 2.36's mallopt refused M_TOP_PAD", True),
        ("off: VIT_KEEP_FREED_MEMORY=0", False),
        ("not needed: the C library is not glibc", False),
        ("not tried: vit.system.malloc.keep_freed_memory() has not run", False),
    ],
)
def test_the_report_logs_what_the_switch_did(
    monkeypatch: pytest.MonkeyPatch, status: str, logged: bool
) -> None:
    monkeypatch.setattr(malloc, "_status", status)
    lines: list[str] = []
    malloc.report(info=lines.append)
    assert lines == ([f"vit.system.malloc: {status}"] if logged else [])


def test_the_fault_counter_reports_a_command_that_touches_fresh_memory() -> None:
    touch = "import time; b = bytearray(64 << 20); time.sleep(1.5); raise SystemExit(3)"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "page_faults.py"), "--every", "0.5", "--",
         sys.executable, "-c", touch],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3  # the command's own status
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert rows and all(len(r) == 4 for r in rows)
    # 64 MiB zeroed and touched: at least its pages faulted in, spread over the first lines
    assert sum(float(r[1]) * 0.5 for r in rows) > 0.5 * (64 << 20) / 4096, done.stdout


def test_the_fault_counter_says_when_the_command_cannot_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "page_faults.py"), "--",
         str(tmp_path / "no-such-program")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2  # argparse's usage error, not a traceback
    assert "cannot run" in done.stderr and "no-such-program" in done.stderr
    assert "Traceback" not in done.stderr
