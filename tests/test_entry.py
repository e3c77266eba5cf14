"""`import vit` only defines things; the commands (vit/entry.py) switch MKL before torch loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.test_mkl_amd import AMD, REPO

# On a faked AMD CPU with AVX2, where the switch would compile and load its shim if anything ran
# it: the files under the temporary HOME and cache, and the shared libraries mapped, at each step.
IMPORTS = """
import json, os, pathlib, subprocess, sys
real_read_text = pathlib.Path.read_text
pathlib.Path.read_text = lambda self, *a, **k: (
    {amd!r} if str(self) == "/proc/cpuinfo" else real_read_text(self, *a, **k)
)
real_popen, spawned = subprocess.Popen, []
def popen(*args, **kwargs):  # a compiler run would be one of these
    spawned.append(args[0] if args else kwargs.get("args"))
    return real_popen(*args, **kwargs)
subprocess.Popen = popen
def seen():
    files = sorted(str(p) for p in pathlib.Path({root!r}).rglob("*"))
    libs = {{ln.split()[-1] for ln in open("/proc/self/maps") if ".so" in ln}}
    return files, sorted(libs)
steps = {{"start": seen()}}
import vit
steps["import vit"] = seen()
steps["torch loaded"] = "torch" in sys.modules
steps["spawned by vit"] = list(spawned)
import torch  # torch may run a process or two (ldconfig): not ours
steps["import torch"] = seen()
spawned.clear()
import vit.model
steps["import vit.model"] = seen()
steps["spawned by vit.model"] = list(spawned)
steps["lightning loaded"] = "lightning" in sys.modules
print(json.dumps(steps))
"""


def test_import_vit_and_vit_model_have_no_side_effects(tmp_path: Path) -> None:
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    cache.mkdir()
    env = {**os.environ, "HOME": str(home), "VIT_CACHE_DIR": str(cache)}
    env.pop("VIT_MKL_AVX2", None)
    code = IMPORTS.format(amd=AMD, root=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout.splitlines()[-1])
    assert steps["import vit"] == steps["start"]  # no file written, no library loaded
    assert steps["spawned by vit"] == steps["spawned by vit.model"] == []  # no compiler run
    assert steps["torch loaded"] is False  # `import vit` does not even load torch
    assert steps["import vit.model"] == steps["import torch"]  # torch's libraries, no more
    assert steps["import vit.model"][0] == [str(cache), str(home)]  # still empty
    assert steps["lightning loaded"] is False  # the model side needs no training stack


# Each command's target with the switch replaced by a probe: first stopped there (was torch
# loaded when it ran?), then run through to its --help.
COMMANDS = """
import sys
from vit import entry, mkl_amd
ARGS = {
    "train": ["fit", "--help"], "evaluate": ["--help"], "visualize": ["--help"], "explore": ["--help"]
}
class Stop(Exception):
    pass
def stop():
    print("SWITCH", "torch loaded:", "torch" in sys.modules, flush=True)
    raise Stop
mkl_amd.enable = stop
for name in ARGS:
    try:
        getattr(entry, name)()
    except Stop:
        pass
mkl_amd.enable = lambda: "off: a test"
for name, argv in ARGS.items():
    sys.argv = [f"vit-{name}", *argv]
    try:
        getattr(entry, name)()
    except SystemExit as exit:
        print("EXIT", name, exit.code, flush=True)
"""


def test_each_command_switches_mkl_before_torch_loads_and_helps() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COMMANDS], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith(("SWITCH", "EXIT"))] == [
        *["SWITCH torch loaded: False"] * 4,
        "EXIT train 0",
        "EXIT evaluate 0",
        "EXIT visualize 0",
        "EXIT explore 0",
    ]
    usages = ("vit-train [options] fit", "vit-evaluate", "vit-visualize", "vit-explore")
    for usage in (f"usage: {u}" for u in usages):
        assert usage in done.stdout, usage
