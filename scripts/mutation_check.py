"""Run chosen tests against mutmut mutants, in a scratch copy of the repository.

    python scripts/mutation_check.py vit.maps.capture.x_query_map__mutmut_7 -- tests/test_maps.py
    python scripts/mutation_check.py 'vit.maps.*' --survivors -- tests/test_maps.py -k grid
    python scripts/mutation_check.py 'vit.*' --survivors --record -- NEW_TESTS...

The tests run in a scratch copy beside the checkout (so ../shared resolves) made of mutmut's
mutated package (mutants/vit: every mutant behind a switch) and the current tests/, once per
mutant with MUTANT_UNDER_TEST naming it, in a child forked from one warm interpreter, as mutmut
itself does; the line says `killed` (the tests failed) or `survived`. mutants/ holds the source as
of the last mutmut run; `--generate` writes it for the current source without running a test
(mutmut's own generation step, keeping mutmut's outcomes of unchanged functions). The working tree
and mutmut's results are not touched, so it can run beside scripts/mutation_run.sh: a new test is
checked against the mutants it was written for before a mutmut run records it. `--survivors`
keeps, of the matched mutants, those mutmut left alive (survived, or no test reached them); `--at
COMMIT` takes the tests as committed there; `--record` writes each outcome, with the date, the
commit, the tests, and the mutant's diff key and changed lines (scripts/mutation_diffs.py), to
experiments/record/mutations/checked.tsv, which scripts/mutation_table.py reads. Only a failing
test counts as a kill: a test file that does not collect stops the check.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mutation_diffs import (
    CHECKED,
    CHECKED_HEADER,
    MutantDiff,
    generated_diffs,
    module_path,
    read_rows,
    write_rows,
)

REPO = Path(__file__).resolve().parents[1]
USAGE = "mutation_check.py MUTANT_OR_PATTERN... [--survivors] [--record] [-- PYTEST_ARGS...]"
USAGE += "\n       mutation_check.py --generate"
COPIED = ("tests", "experiments", "scripts", "docs", "pyproject.toml", "README.md")
CPU_LIMIT_S = 300  # a mutant that loops forever counts as killed by timeout, as in mutmut


def recorded() -> dict[str, int | None]:
    """mutant name -> mutmut's exit code for it (0: survived), None when not run yet."""
    out = {}
    for meta in (REPO / "mutants").rglob("*.py.meta"):
        out |= json.loads(meta.read_text())["exit_code_by_key"]
    return out


def run_one(name: str, tests: list[str]) -> str:
    """The tests against one mutant, in a forked child: killed, survived or timeout."""
    pid = os.fork()
    if pid == 0:
        os.environ["MUTANT_UNDER_TEST"] = name
        resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S + 1))
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child exits at once
        os._exit(int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests])))
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "timeout"
    code = os.WEXITSTATUS(status)  # only a failing test kills: not an error in the tests themselves
    return {0: "survived", 1: "killed", 5: "no test collected"}.get(code, f"pytest error {code}")


def write_record(outcomes: dict[str, str], tests: list[str], at: str) -> None:
    """Each outcome as a row of checked.tsv, with the diff of the mutant as generated in mutants/
    (the code the tests ran against): scripts/mutation_table.py counts a row only while that diff
    is the one its mutant has in the current source."""
    rows = {r[0]: r for r in read_rows(CHECKED)}
    diffs: dict[str, MutantDiff] = {}
    for path in sorted({module_path(name) for name in outcomes}):
        diffs |= generated_diffs(path)
    today = str(datetime.date.today())
    for name, outcome in outcomes.items():
        diff = diffs.get(name, MutantDiff("", "", ""))  # no diff: the row will not count
        rows[name] = [name, outcome, today, at, " ".join(tests), diff.key, diff.gist]
    write_rows(CHECKED, CHECKED_HEADER, [rows[k] for k in sorted(rows)])


def generate() -> None:
    """mutmut's mutated package, mutants/, for the current source, without running a test: the
    first steps of `mutmut run` (mutmut/__main__.py's _run). Outcomes mutmut recorded for
    functions that have not changed are kept; those of changed functions are reset, as a run
    does."""
    from mutmut.__main__ import create_mutants
    from mutmut.mutation.trampoline import set_mutant_under_test
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir

    os.chdir(REPO)
    set_mutant_under_test("mutant_generation")
    (REPO / "mutants").mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    stats = create_mutants(max_children=1)
    print(f"mutants/: {stats.mutated} files mutated, {stats.unmodified} unchanged")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=USAGE)
    parser.add_argument("mutants", nargs="*", help="mutant names or fnmatch patterns")
    parser.add_argument(
        "--generate", action="store_true", help="write mutants/ for the current source, run nothing"
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="only mutants mutmut left alive (survived, no tests)",
    )
    parser.add_argument("--record", action="store_true", help=f"write outcomes to {CHECKED.name}")
    parser.add_argument(
        "--at", metavar="COMMIT", help="the tests as committed there, not as edited"
    )
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    tests = argv[cut + 1 :] or ["tests/"]  # after --: pytest's arguments
    if args.generate:
        generate()
        return 0
    if not args.mutants:
        parser.error("name the mutants to check, or --generate")
    if not (REPO / "mutants").is_dir():
        sys.exit("no mutants/ folder: run `python scripts/mutation_check.py --generate` first")
    known = recorded()
    chosen = sorted(n for n in known if any(fnmatch.fnmatchcase(n, p) for p in args.mutants))
    if args.survivors:
        chosen = [n for n in chosen if known[n] in (0, 33)]  # survived, or no test reached it
    if not chosen:
        sys.exit(f"no mutant matches {args.mutants} (names as in `mutmut results`)")
    scratch = Path(tempfile.mkdtemp(prefix=".mutation-check-", dir=REPO.parent))
    try:
        if args.at:
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.at, *COPIED],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
        for item in () if args.at else COPIED:
            src = REPO / item
            if src.is_dir():
                shutil.copytree(src, scratch / item, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, scratch / item)
        shutil.copytree(
            REPO / "mutants" / "vit", scratch / "vit", ignore=shutil.ignore_patterns("__pycache__")
        )
        os.chdir(scratch)
        sys.path.insert(0, str(scratch))
        os.environ["PYTHONPATH"] = str(scratch)  # for the tests' own subprocesses
        os.environ["VIT_HYPOTHESIS_PROFILE"] = "mutation"
        # collected once here, so that each child finds torch, vit and the test modules imported
        with open(os.devnull, "w") as quiet:
            stdout, sys.stdout = sys.stdout, quiet
            try:
                collected = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *tests])
            finally:
                sys.stdout = stdout
        if collected != 0:
            sys.exit(f"the tests do not collect cleanly (pytest exit {collected}): {tests}")
        clean = run_one("", tests)  # no mutant: the tests must pass on mutmut's copy of vit/
        if clean != "survived":
            sys.exit(
                f"the tests do not pass without a mutant ({clean}): fix them, or run mutmut "
                "again if vit/ changed since its last run"
            )
        outcomes = {}
        for name in chosen:
            outcomes[name] = run_one(name, tests)
            print(f"{name}: {outcomes[name]}", flush=True)
        killed = sum(o in ("killed", "timeout") for o in outcomes.values())
        print(f"{killed} of {len(chosen)} killed")
        if args.record:
            at = args.at or "working tree"
            if args.at:
                rev = ["git", "-C", str(REPO), "rev-parse", "--short", args.at]
                at = subprocess.run(rev, capture_output=True, text=True, check=True).stdout.strip()
            write_record(outcomes, tests, at)
        return 0 if killed == len(chosen) else 1
    finally:
        os.chdir(REPO)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
