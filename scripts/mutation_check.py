"""Run chosen tests against mutmut mutants, in a scratch copy of the repository.

    python scripts/mutation_check.py vit.maps.capture.x_query_map__mutmut_7 -- tests/test_maps.py
    python scripts/mutation_check.py 'vit.maps.capture.*' --survivors -- tests/test_maps.py -k grid

The tests run in a scratch copy beside the checkout (so ../shared resolves) made of mutmut's
mutated package (mutants/vit: every mutant behind a switch) and the current tests/, once per
mutant with MUTANT_UNDER_TEST naming it, as mutmut itself does; the line says `killed` (the tests
failed) or `survived`. mutants/ holds the source as of the last mutmut run: run it again after
editing vit/. The working tree and mutmut's results are not touched, so it can run while
scripts/mutation_run.sh does: a new test is checked against the mutants it was written for before
the next mutmut run records it. `--survivors` keeps, of the matched mutants, those mutmut recorded
as survived.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
USAGE = "mutation_check.py MUTANT_OR_PATTERN... [--survivors] [-- PYTEST_ARGS...]"
COPIED = ("tests", "experiments", "scripts", "docs", "pyproject.toml", "README.md")


def recorded() -> dict[str, int | None]:
    """mutant name -> mutmut's exit code for it (0: survived), None when not run yet."""
    out = {}
    for meta in (REPO / "mutants").rglob("*.py.meta"):
        out |= json.loads(meta.read_text())["exit_code_by_key"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=USAGE)
    parser.add_argument("mutants", nargs="+", help="mutant names or fnmatch patterns")
    parser.add_argument("--survivors", action="store_true", help="only mutants mutmut kept alive")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    tests = argv[cut + 1 :] or ["tests/"]  # after --: pytest's arguments
    if not (REPO / "mutants").is_dir():
        sys.exit("no mutants/ folder: run scripts/mutation_run.sh first (it generates the mutants)")
    known = recorded()
    chosen = sorted(n for n in known if any(fnmatch.fnmatchcase(n, p) for p in args.mutants))
    if args.survivors:
        chosen = [n for n in chosen if known[n] == 0]
    if not chosen:
        sys.exit(f"no mutant matches {args.mutants} (names as in `mutmut results`)")
    scratch = Path(tempfile.mkdtemp(prefix=".mutation-check-", dir=REPO.parent))
    try:
        for item in COPIED:
            src = REPO / item
            if src.is_dir():
                shutil.copytree(src, scratch / item, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, scratch / item)
        shutil.copytree(
            REPO / "mutants" / "vit", scratch / "vit", ignore=shutil.ignore_patterns("__pycache__")
        )
        env = dict(os.environ, PYTHONPATH=str(scratch), VIT_HYPOTHESIS_PROFILE="mutation")
        survived = 0
        for name in chosen:
            run = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                cwd=scratch,
                env=dict(env, MUTANT_UNDER_TEST=name),
                capture_output=True,
                text=True,
            )
            verdict = {0: "survived", 5: "no test collected"}.get(run.returncode, "killed")
            survived += verdict != "killed"
            print(f"{name}: {verdict}", flush=True)
        print(f"{len(chosen) - survived} of {len(chosen)} killed")
        return 1 if survived else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
