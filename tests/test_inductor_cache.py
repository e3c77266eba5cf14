"""One inductor cache folder per ATEN_CPU_CAPABILITY (vit/system/inductor_cache.py), and the fault
it keeps out: kernels compiled under one setting, reused under another."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from tests.helpers import REPO
from vit.system.inductor_cache import CACHE_DIR, CAPABILITY, separate_by_capability


def test_a_capability_without_a_cache_folder_gets_a_folder_of_its_own() -> None:
    env = {CAPABILITY: "avx2"}
    folder = separate_by_capability(env)
    expected = default_cache_dir() + "-avx2"  # inductor's own folder, named for the setting
    assert folder == expected and env[CACHE_DIR] == expected
    other = {CAPABILITY: "default"}
    assert separate_by_capability(other) != folder  # each setting its own


@pytest.mark.parametrize("given", [{}, {CAPABILITY: ""}, {CAPABILITY: "  "}])
def test_no_capability_leaves_the_cache_alone(given: dict[str, str]) -> None:
    env = dict(given)
    assert separate_by_capability(env) is None and env == given


def test_a_cache_folder_the_user_chose_is_kept() -> None:
    env = {CAPABILITY: "avx2", CACHE_DIR: "/shared/inductor"}
    assert separate_by_capability(env) is None
    assert env == {CAPABILITY: "avx2", CACHE_DIR: "/shared/inductor"}


def test_a_user_without_a_name_gets_inductors_own_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_name() -> str:
        raise KeyError("getpwuid(): uid not found")  # a container's uid without a passwd entry

    monkeypatch.setattr(getpass, "getuser", no_name)
    folder = separate_by_capability({CAPABILITY: "avx2"})
    assert folder == default_cache_dir() + "-avx2"  # inductor falls back the same way
    assert Path(folder).name == f"torchinductor_uid_{os.getuid()}-avx2"


def test_the_capability_cannot_name_a_folder_elsewhere() -> None:
    env = {CAPABILITY: "../../etc/x y"}
    folder = Path(separate_by_capability(env))
    assert folder.parent == Path(tempfile.gettempdir())
    assert str(folder) == default_cache_dir() + "-.._.._etc_x_y"


# A kernel inductor vectorises (a boolean mask to an additive one, as attention with a boolean mask
# compiles), compiled through the commands' switches, checked against eager.
COMPILE = """
from vit.commands.entry import switch
switch()
import torch
mask = ~torch.eye(16, dtype=torch.bool)
def additive(m):
    return torch.where(m, torch.tensor(0.0), torch.tensor(float("-inf")))
out = torch.compile(additive, dynamic=False)(mask)
print("EQUAL", torch.equal(out, additive(mask)), flush=True)
"""


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() != "AVX512",
    reason="needs a CPU whose own vector width differs from AVX2's",
)
def test_kernels_compiled_under_avx2_do_not_reach_a_native_run(tmp_path: Path) -> None:
    """First a run under ATEN_CPU_CAPABILITY=avx2, then one under the machine's own AVX-512, each
    with inductor's default cache (TMPDIR points it into tmp_path). Sharing one folder, the second
    took the first's 8-wide loop with 16-wide stores: heap corruption, the process aborted."""
    env = {k: v for k, v in os.environ.items() if k not in (CAPABILITY, CACHE_DIR)}
    env |= {"TMPDIR": str(tmp_path), "VIT_MKL_AVX2": "0"}
    for extra in ({CAPABILITY: "avx2"}, {}):
        done = subprocess.run(
            [sys.executable, "-c", COMPILE],
            cwd=REPO,
            env=env | extra,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (extra, done.stderr[-2000:])
        assert "EQUAL True" in done.stdout, (extra, done.stdout)
    user_folder = Path(default_cache_dir()).name  # torchinductor_<user>
    assert sorted(p.name for p in tmp_path.glob("torchinductor_*")) == [
        user_folder,
        user_folder + "-avx2",
    ]
