"""`import vit` only defines things; the commands (vit/commands/entry.py) switch MKL before torch
loads, and malloc's thresholds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import AMD, REPO

# Never copied nor watched: git's and the environment's folders, bytecode and tools' caches.
CACHES = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
RUN_OUTPUTS = {"runs", "lightning_logs", "data_cache", "build", "eval"}  # .gitignore's, at the top

# The watcher, run in the child process: every file under a checkout as [path, mtime, size].
CHECKOUT_FILES = f"""
def checkout_files(root):
    import os
    caches = {sorted(CACHES)!r}
    found = []
    for folder, names, files in os.walk(root):
        names[:] = sorted(n for n in names if n not in caches)
        for name in files:
            path = os.path.join(folder, name)
            st = os.stat(path, follow_symlinks=False)
            found.append([os.path.relpath(path, root), st.st_mtime_ns, st.st_size])
    return sorted(found)
"""


def copy_checkout(dest: Path) -> Path:
    """The checkout copied to dest/<name> (not .git, .venv, caches or run outputs), for a child
    process to import vit from (cwd and PYTHONPATH), so that a file it writes beside its own
    modules or in its working folder lands in the watched copy, whatever else writes to REPO."""

    def skip(folder: str, names: list[str]) -> set[str]:
        top = Path(folder) == REPO
        return {
            n for n in names if n in CACHES or n.endswith(".egg-info") or (top and n in RUN_OUTPUTS)
        }

    return Path(shutil.copytree(REPO, dest / REPO.name, ignore=skip, symlinks=True))


def changed(before: list, after: list) -> list[str]:
    """The checkout's files written, removed or touched between two of checkout_files' lists."""
    old, new = ({path: (mtime, size) for path, mtime, size in files} for files in (before, after))
    return sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p))


# On a faked AMD CPU with AVX2, where the switch would compile and load its shim if anything ran
# it: the files under the temporary HOME and cache, the shared libraries mapped, and the files of
# the checkout vit is imported from (checkout_files), at each step.
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
    return files, sorted(libs), checkout_files({checkout!r})
steps = {{"start": seen()}}
import vit
steps["vit from"] = vit.__file__
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


def test_import_vit_and_vit_model_have_no_side_effects(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    cache.mkdir()
    checkout = copy_checkout(tmp_path_factory.mktemp("checkout"))
    env = {
        **os.environ,
        "HOME": str(home),
        "VIT_CACHE_DIR": str(cache),
        "PYTHONPATH": str(checkout),
    }
    env.pop("VIT_MKL_AVX2", None)
    code = CHECKOUT_FILES + IMPORTS.format(amd=AMD, root=str(tmp_path), checkout=str(checkout))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=checkout, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout.splitlines()[-1])
    assert Path(steps["vit from"]).resolve().is_relative_to(checkout.resolve())  # the watched copy
    assert len(steps["start"][2]) > 100  # the whole checkout is watched, not an empty folder
    for step in ("import vit", "import torch", "import vit.model"):
        assert changed(steps["start"][2], steps[step][2]) == [], step  # nothing in the checkout
    assert steps["import vit"] == steps["start"]  # no file written, no library loaded
    assert steps["spawned by vit"] == steps["spawned by vit.model"] == []  # no compiler run
    assert steps["torch loaded"] is False  # `import vit` does not even load torch
    assert steps["import vit.model"] == steps["import torch"]  # torch's libraries, no more
    assert steps["import vit.model"][0] == [str(cache), str(home)]  # still empty
    assert steps["lightning loaded"] is False  # the model side needs no training stack


# A module that writes under the checkout when imported: a new file in a new folder beside the
# package, and a line added to an existing file.
SNEAKY = """
from pathlib import Path
checkout = Path(__file__).resolve().parents[1]
(checkout / "written-on-import").mkdir()
(checkout / "written-on-import" / "state.json").write_text("{}")
with open(checkout / "pyproject.toml", "a") as f:
    f.write("# touched on import\\n")
"""
WATCH = """
import json
before = checkout_files({checkout!r})
import {module}
print(json.dumps([before, checkout_files({checkout!r})]))
"""


def test_the_checkout_watcher_catches_a_module_that_writes_on_import(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    checkout = copy_checkout(tmp_path_factory.mktemp("checkout"))
    (checkout / "vit" / "sneaky_import.py").write_text(SNEAKY)
    code = CHECKOUT_FILES + WATCH.format(checkout=str(checkout), module="vit.sneaky_import")
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=checkout, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    before, after = json.loads(done.stdout.splitlines()[-1])
    assert changed(before, after) == ["pyproject.toml", "written-on-import/state.json"]
    assert changed(before, before) == []


# Each command's target with the switches replaced by probes: first stopped at the second (was
# torch loaded when they ran? did both run, the cache's for real?), then run through to its --help.
COMMAND_NAMES = ("train", "evaluate", "visualize", "explore", "predict", "inspect", "export")
COMMANDS = """
import os, sys
from vit.commands import entry
from vit.system import inductor_cache, malloc, mkl_amd
ARGS = {
    "train": ["fit", "--help"], "evaluate": ["--help"], "visualize": ["--help"], "explore": ["--help"],
    "predict": ["--help"], "inspect": ["--help"], "export": ["--help"],
}
class Stop(Exception):
    pass
switched = []
separate = inductor_cache.separate_by_capability
def stop():
    folder = separate()
    set_here = folder is not None and os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder
    print("SWITCH", "torch loaded:", "torch" in sys.modules, "mkl, malloc:", switched == [1, 2],
          "cache:", set_here, flush=True)
    raise Stop
mkl_amd.enable = lambda: switched.append(1)
malloc.keep_freed_memory = lambda: switched.append(2)
inductor_cache.separate_by_capability = stop
for name in ARGS:
    switched.clear()
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    try:
        getattr(entry, name)()
    except Stop:
        pass
mkl_amd.enable = malloc.keep_freed_memory = lambda: "off: a test"
inductor_cache.separate_by_capability = lambda: None
for name, argv in ARGS.items():
    sys.argv = [f"vit-{name}", *argv]
    try:
        getattr(entry, name)()
    except SystemExit as exit:
        print("EXIT", name, exit.code, flush=True)
"""


def test_each_command_switches_before_torch_loads_and_helps() -> None:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}  # every x86 CPU has it
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", COMMANDS], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith(("SWITCH", "EXIT"))] == [
        *["SWITCH torch loaded: False mkl, malloc: True cache: True"] * 7,
        "EXIT train 0",
        "EXIT evaluate 0",
        "EXIT visualize 0",
        "EXIT explore 0",
        "EXIT predict 0",
        "EXIT inspect 0",
        "EXIT export 0",
    ]
    usages = (
        "vit-train [options] fit",
        "vit-evaluate",
        "vit-visualize",
        "vit-explore",
        "vit-predict",
        "vit-inspect",
        "vit-export",
    )
    for usage in (f"usage: {u}" for u in usages):
        assert usage in done.stdout, usage


def test_ctrl_c_ends_each_command_with_one_line_and_130() -> None:
    """Ctrl-C at any moment of a command (here, as it starts): no traceback, exit status 130."""
    code = (
        "import sys\n"
        "from vit.commands import entry\n"
        "from vit.system import inductor_cache\n"
        "def pressed():\n"
        "    raise KeyboardInterrupt\n"
        "inductor_cache.separate_by_capability = pressed\n"
        f"for name in {list(COMMAND_NAMES)!r}:\n"
        "    try:\n"
        "        getattr(entry, name)()\n"
        "    except SystemExit as exit:\n"
        "        print('EXIT', name, exit.code, flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"EXIT {name} 130" for name in COMMAND_NAMES]
    assert done.stderr.count("Interrupted by Ctrl-C.") == len(COMMAND_NAMES)
    assert "Traceback" not in done.stderr


def test_only_an_exit_made_by_ctrl_c_becomes_130(capsys) -> None:
    """Lightning ends an interrupted fit or test with sys.exit(1) inside its KeyboardInterrupt
    handler: that exit becomes 130; a command's own exit 1 (vit-predict's unreadable images)
    stays 1."""
    from vit.system.errors import interruptible

    def lightning_like() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            sys.exit(1)

    def own_exit() -> None:
        try:
            raise ValueError("an image could not be read")
        except ValueError:
            sys.exit(1)

    with pytest.raises(SystemExit) as stop:
        interruptible(lightning_like)()
    assert stop.value.code == 130
    assert capsys.readouterr().err == "Interrupted by Ctrl-C.\n"
    for command in (own_exit, lambda: sys.exit(1)):
        with pytest.raises(SystemExit) as stop:
            interruptible(command)()
        assert stop.value.code == 1
    assert capsys.readouterr().err == ""


def test_a_command_prints_a_lightning_message_once() -> None:
    # the data module's "CIFAR-10: ... source at ..." goes through Lightning's rank_zero_info
    code = (
        "from vit.commands.entry import switch_mkl; switch_mkl(); "
        "from lightning.pytorch.utilities import rank_zero_info; rank_zero_info('one line'); "
        "import logging; logging.getLogger('vit.x').info('plain line')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert sum("one line" in ln for ln in lines) == 1, lines
    assert "plain line" in lines  # vit's own messages stay plain lines
