"""Evidence that the test suite catches real bugs: apply plausible bugs one at a time to a copy of
the repository and run the suite against each; every bug must make at least one test fail.

    python scripts/mutate.py                 # all bugs; writes experiments/record/mutations/results.md
    python scripts/mutate.py --only scale    # one bug, by name

Each run copies the tracked files to a temporary folder, applies one bug there (an exact text
replacement that must match once), and runs pytest on that copy with `-x`: the test files that
name the bug's module first, then (where those all pass) the whole suite, so a caught bug stops
at its first failing test. Not part of CI: it runs the suite once per bug.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "experiments" / "record" / "mutations" / "results.md"


@dataclass(frozen=True)
class Bug:
    name: str
    what: str
    file: str
    old: str
    new: str
    first: tuple[str, ...]  # test files to run before the rest of the suite


BUGS = (
    Bug(
        "scale",
        "attention drops the 1/sqrt(d_k) scale",
        "vit/model/attention.py",
        "scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))",
        "scores = q @ k.transpose(-2, -1)",
        ("tests/test_attention.py",),
    ),
    Bug(
        "causal-shift",
        "the causal mask is shifted by one (each token also sees the next)",
        "vit/model/attention.py",
        "return torch.ones(n, n, dtype=torch.bool, device=device).tril()",
        "return torch.ones(n, n, dtype=torch.bool, device=device).tril(1)",
        ("tests/test_attention.py",),
    ),
    Bug(
        "grad-rollout-pairing",
        "gradient rollout pairs layer l's weights with layer l+1's gradient",
        "vit/maps/rollout.py",
        "for w, g in zip(maps, grads, strict=True)]",
        "for w, g in zip(maps, grads[1:] + grads[:1], strict=True)]",
        ("tests/test_maps.py",),
    ),
    Bug(
        "cls-row",
        "the maps read the first patch's row instead of the CLS token's",
        "vit/maps/capture.py",
        "keys[..., 0, :] if num_prefix_tokens > 0",
        "keys[..., 1, :] if num_prefix_tokens > 0",
        ("tests/test_maps.py", "tests/test_visualize.py"),
    ),
    Bug(
        "no-weight-decay",
        "Muon-with-AdamW skips the decoupled weight decay",
        "vit/train/muon.py",
        'p.mul_(1.0 - group["lr"] * group["weight_decay"])  # decoupled decay',
        "pass",
        ("tests/test_optim.py",),
    ),
    Bug(
        "muon-scale",
        "Muon's update is scaled by the short side of the matrix instead of the long one",
        "vit/train/muon.py",
        "scale = 0.2 * math.sqrt(max(shape))",
        "scale = 0.2 * math.sqrt(min(shape))",
        ("tests/test_optim.py",),
    ),
    Bug(
        "loader-position",
        "a resumed loader forgets its position in the epoch",
        "vit/data/loader.py",
        "            self.epoch_sampler.resume = (epoch, consumed * self.batch_size)",
        "            pass",
        ("tests/test_loader.py", "tests/test_resume.py"),
    ),
    Bug(
        "ema-warmup",
        "the EMA skips its warm-up (full decay from the first step)",
        "vit/train/callbacks/ema.py",
        "d = min(self.decay, (1 + n) / (10 + n))",
        "d = self.decay",
        ("tests/test_ema.py",),
    ),
    Bug(
        "val-split",
        "the validation split is off by one image (one image in both splits)",
        "vit/train/datamodule.py",
        "val, train = perm[: hp.val_size], perm[hp.val_size :]",
        "val, train = perm[: hp.val_size], perm[hp.val_size - 1 :]",
        ("tests/test_datamodule.py",),
    ),
    Bug(
        "budget-clock",
        "a resumed wall-clock budget forgets the time already used",
        "vit/train/callbacks/budget.py",
        'self._elapsed_before = float(state_dict.get("elapsed_s", 0.0))',
        "self._elapsed_before = 0.0",
        ("tests/test_callbacks.py", "tests/test_migrate.py", "tests/test_resume.py"),
    ),
    Bug(
        "migrate-patch-embed",
        "the migration of old checkpoints drops Muon's patch-projection setting",
        "vit/io/migrate.py",
        '("lr_scale", "momentum", "ns_steps", "split_qkv", "patch_embed")',
        '("lr_scale", "momentum", "ns_steps", "split_qkv")',
        ("tests/test_migrate.py",),
    ),
    Bug(
        "eval-smoothing",
        "label smoothing is applied to the validation and test loss too",
        "vit/train/module.py",
        'smoothing = hp.label_smoothing if stage == "train" else 0.0',
        "smoothing = hp.label_smoothing",
        ("tests/test_module.py",),
    ),
)


def cpu_kind() -> str:
    """The CPU's model name, core count and the bf16 support that decides the recipes' precision."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
        "an unknown CPU",
    )
    flags = set(
        next(
            (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
        )
    )
    isa = (
        "AMX"
        if "amx_bf16" in flags
        else "AVX512-BF16"
        if "avx512_bf16" in flags
        else "AVX-512, no native bf16"
        if "avx512f" in flags
        else "AVX2 only"
    )
    return f"a {os.cpu_count()}-core {name} ({isa})"


def commit() -> str:
    """The checkout's commit, with a mark when it has changes beside it."""

    def run(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return run("rev-parse", "--short", "HEAD") + (
        " plus uncommitted changes" if run("status", "--porcelain", "--untracked-files=no") else ""
    )


def copy_repo(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of the working tree, as they are."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    (dest.parent / "shared").symlink_to(REPO.parent / "shared")  # the data, as beside the repo


def run_bug(bug: Bug) -> tuple[list[str], float]:
    """The failing tests with `bug` applied, and the seconds the run took."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "main"
        copy_repo(copy)
        path = copy / bug.file
        text = path.read_text()
        if text.count(bug.old) != 1:
            raise SystemExit(f"{bug.name}: the text to change is not in {bug.file} exactly once")
        path.write_text(text.replace(bug.old, bug.new))
        # the copy's package, not the installed one: checked by the first line pytest prints
        env = {**os.environ, "PYTHONPATH": str(copy)}
        probe = "import vit; print(vit.__file__)"
        where = subprocess.run([sys.executable, "-c", probe], cwd=copy, env=env, text=True,
                               capture_output=True).stdout  # fmt: skip
        if not where.startswith(str(copy)):
            raise SystemExit(f"the copy's vit was not the one imported: {where}")
        start = time.perf_counter()
        for paths in (bug.first, ("tests",)):  # the bug's module's tests, then the whole suite
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *paths],
                cwd=copy, env=env, capture_output=True, text=True,
            )  # fmt: skip
            failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)
            if failed:
                break
        seconds = time.perf_counter() - start
    return failed, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="names of the bugs to apply (default: all)")
    ns = parser.parse_args()
    bugs = [b for b in BUGS if not ns.only or b.name in ns.only]
    rows, missed, times = [], [], []
    for bug in bugs:
        failed, seconds = run_bug(bug)
        times.append(seconds)
        print(f"{bug.name}: {failed or 'NOT CAUGHT'} ({seconds:.0f} s)", flush=True)
        rows.append(
            f"| {bug.what} | `{bug.file}` | {', '.join(f'`{t}`' for t in failed) or '**none**'} |"
        )
        if not failed:
            missed.append(bug.name)
    if not ns.only:
        OUT.write_text(
            "# Bugs the test suite catches\n\n"
            "Each bug applied alone to a copy of the repository; the suite run with `-x` (the bug's "
            "module's tests first), so the first failing test is listed.\n\n"
            f"Command: `python scripts/mutate.py`, run {datetime.date.today()} at commit "
            f"{commit()} on {cpu_kind()}, {sum(times) / len(times):.0f} s a bug on average "
            f"({sum(times) / 60:.1f} minutes in all).\n\n"
            "| bug | file | first failing test |\n|---|---|---|\n" + "\n".join(rows) + "\n"
        )
        print(f"wrote {OUT}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
