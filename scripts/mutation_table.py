"""The mutation score per module, from mutmut's results (scripts/mutation_run.sh runs it).

    python scripts/mutation_table.py            # writes experiments/record/mutations/mutmut.md

Reads mutants/**/*.meta (mutmut's own record of each mutant's outcome) and the reviewed survivors
in experiments/record/mutations/reviewed.tsv (mutant, verdict, reason; verdict `equivalent`: the
mutant computes the same results; `untestable`: it changes only what no test can observe, e.g.
speed), and the survivors that tests written since kill (checked.tsv, written by
scripts/mutation_check.py --record). The score is killed / (all - equivalent); untestable mutants
count against it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import platform
import re
import subprocess
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "experiments" / "record" / "mutations"
# mutmut's exit codes (mutmut/stats.py): 1 and 3 are test failures, 0 a survivor
STATUS = {1: "killed", 3: "killed", 0: "survived", 33: "no tests", 5: "no tests", 34: "skipped"}
STATUS |= {36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}
STATUS |= {37: "killed", -11: "segfault", -9: "segfault", None: "not checked"}
COLUMNS = ("killed", "survived", "timeout", "no tests", "not checked", "other")


def listed_modules() -> list[str]:
    """The files pyproject.toml's [tool.mutmut] only_mutate names, in its order."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


def reviewed() -> dict[str, tuple[str, str]]:
    path = RECORD / "reviewed.tsv"
    if not path.is_file():
        return {}
    rows = csv.reader(path.open(), delimiter="\t")
    return {r[0]: (r[1], r[2]) for r in rows if r and not r[0].startswith("#")}


def outcomes(module: str) -> dict[str, str]:
    """mutant name -> status, for one source file."""
    meta = REPO / "mutants" / (module + ".meta")
    if not meta.is_file():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: STATUS.get(code, "other") for name, code in codes.items()}


def changed_since_run(module: str) -> list[str]:
    """The functions of `module` whose source differs from the one mutmut mutated (mutmut's own
    per-function hashes, of the functions it mutates): their outcomes are the old code's until the
    next run retests them."""
    from mutmut.mutation.file_mutation import mutate_file_contents

    meta = REPO / "mutants" / (module + ".meta")
    if not meta.is_file():
        return []
    old = json.loads(meta.read_text())["hash_by_function_name"]
    new = mutate_file_contents(module, (REPO / module).read_text()).hash_by_function_name
    return sorted(f for f in old.keys() | new.keys() if old.get(f) != new.get(f))


def cpu_kind() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s*(.+)", lscpu)
    flags = set(re.search(r"Flags:\s*(.+)", lscpu).group(1).split()) if "Flags:" in lscpu else set()
    isa = (
        "amx"
        if "amx_bf16" in flags
        else "avx512bf16"
        if "avx512_bf16" in flags
        else ("avx512" if "avx512f" in flags else "avx2")
    )
    return f"{model.group(1).strip() if model else platform.processor()} ({isa})"


def checked_kills() -> set[str]:
    """Survivors of a mutmut run that tests written since kill (scripts/mutation_check.py
    --record runs them against each mutant and writes checked.tsv); the next mutmut run of those
    mutants records the same outcome in mutants/."""
    path = RECORD / "checked.tsv"
    if not path.is_file():
        return set()
    rows = csv.reader(path.open(), delimiter="\t")
    return {r[0] for r in rows if r and not r[0].startswith("#") and r[1] in ("killed", "timeout")}


def share(killed: int, of: int) -> str:
    return f"{100 * killed / of:.1f}%" if of else "-"


def table(command: str, status_note: str = "") -> str:
    review, later = reviewed(), checked_kills()
    lines = [
        "# Mutation score per module (mutmut)",
        "",
        f"Date {datetime.date.today()}; mutmut {version('mutmut')}; CPU {cpu_kind()}.",
        f"Command: `{command}` then `python scripts/mutation_table.py`.",
        *(["", status_note] if status_note else []),
        "",
        "- *mutmut*: the outcomes mutmut recorded (mutants/); *killed since*: survivors that tests",
        "  written after the run kill, and mutants of unchanged code that the run did not reach,",
        "  each checked with `python scripts/mutation_check.py MUTANT --record -- TESTS`",
        "  ([checked.tsv](checked.tsv): mutant, outcome, date, tests).",
        "- *equivalent* / *untestable*: survivors reviewed one by one in",
        "  [reviewed.tsv](reviewed.tsv), each with its reason.",
        "- *before* = killed / mutants run, as mutmut found them; *now* = (killed + killed since) /",
        "  (mutants run - equivalent). Untestable mutants count against the score.",
        "",
        "| module | mutants | " + " | ".join(COLUMNS) + " | killed since | equivalent | untestable"
        " | before | now |",
        "|---" * (len(COLUMNS) + 7) + "|",
    ]
    survivors: list[str] = []
    changed: dict[str, list[str]] = {}
    for module in listed_modules():
        if functions := changed_since_run(module):
            changed[module] = functions
        status = outcomes(module)
        stale = {
            name
            for name in status
            if name.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0] in changed.get(module, ())
        }
        for name in stale:  # an outcome for code that has changed since is no outcome
            status[name] = "not checked"
        counts = Counter(status.values())
        alive = [m for m, s in status.items() if s in ("survived", "no tests")]
        # mutants of unchanged code that mutmut's run did not reach, run by a recorded check
        reached = [
            m for m, s in status.items() if s == "not checked" and m in later and m not in stale
        ]
        since = sum(m in later for m in alive) + len(reached)
        verdicts = Counter(review[m][0] for m in alive if m in review and m not in later)
        before = share(counts["killed"], len(status) - counts["not checked"])
        run = len(status) - counts["not checked"] + len(reached)
        now = share(counts["killed"] + since, run - verdicts["equivalent"])
        if counts["not checked"] > len(reached):  # a run under way: shares of those run so far
            before, now = f"{before} of {run}", f"{now} of {run}"
        row = [module, str(len(status))] + [str(counts[c]) for c in COLUMNS]
        row += [str(since), str(verdicts["equivalent"]), str(verdicts["untestable"]), before, now]
        lines.append("| " + " | ".join(row) + " |")
        survivors += [m for m in alive if m not in review and m not in later]
    lines += ["", f"Survivors neither killed since nor reviewed: {len(survivors)}."]
    lines += [f"- `{m}`" for m in sorted(survivors)[:200]]
    if changed:
        lines += [
            "",
            "Source changed since mutmut mutated it: these functions' mutants count as not checked "
            "above (their outcomes were the old code's) until `bash scripts/mutation_run.sh` "
            "retests them:",
        ]
        lines += [f"- {m}: " + ", ".join(f"`{f}`" for f in fs) for m, fs in changed.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--command", default="bash scripts/mutation_run.sh")
    parser.add_argument("--out", type=Path, default=RECORD / "mutmut.md")
    parser.add_argument("--status", default="", help="a paragraph on the run's state")
    args = parser.parse_args()
    text = table(args.command, args.status)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
