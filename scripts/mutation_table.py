"""The mutation score per module, from mutmut's results (scripts/mutation_run.sh runs it).

    python scripts/mutation_table.py               # experiments/record/mutations/mutmut.md
    python scripts/mutation_table.py --keep COMMIT # no outcomes here: that table, corrected

Reads mutants/**/*.meta (mutmut's own record of each mutant's outcome) and the reviewed survivors
in experiments/record/mutations/reviewed.tsv (mutant, verdict, reason; verdict `equivalent`: the
mutant computes the same results; `untestable`: it changes only what no test can observe, e.g.
speed), and the survivors that tests written since kill (checked.tsv, written by
scripts/mutation_check.py --record). A row of either file counts only while its diff key is the
one its mutant has in the current source (scripts/mutation_diffs.py: mutmut renumbers a changed
function's mutants, so a name alone may mean another mutation); a row without a key never counts.
The score is killed / (all - equivalent); untestable mutants count against it.

mutants/*.meta is not in git, and `mutation_check.py --generate` writes it without outcomes.
Without outcomes the score cannot be recomputed: `--keep COMMIT` writes the table as committed
there (the last one written from outcomes) and below it the correction the keyed record makes to
it: each mutant whose credit differs between the record as committed there, counted by name, and
the record now, counted by diff, moves the score if mutmut's run left it alive, which the kept
table's counts do not say per mutant, so the corrected score is a range. Modules added to the
scope later get their own section: from their mutmut run's outcomes where mutants/ holds them,
else as last committed, while their source is unchanged since.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import subprocess
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import tomllib
from mutation_diffs import (
    CHECKED,
    CHECKED_HEADER,
    REFUSED,
    REVIEWED,
    REVIEWED_HEADER,
    MutantDiff,
    git,
    mutant_diffs,
    read_rows,
    refusal,
)

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "experiments" / "record" / "mutations"
# mutmut's exit codes (mutmut/stats.py): 1 and 3 are test failures, 0 a survivor
STATUS = {1: "killed", 3: "killed", 0: "survived", 33: "no tests", 5: "no tests", 34: "skipped"}
STATUS |= {36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}
STATUS |= {37: "killed", -11: "segfault", -9: "segfault", None: "not checked"}
COLUMNS = ("killed", "survived", "timeout", "no tests", "not checked", "other")
KILLS = ("killed", "timeout")


def listed_modules() -> list[str]:
    """The files pyproject.toml's [tool.mutmut] only_mutate names, in its order."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


class Record:
    """checked.tsv and reviewed.tsv against the current source: the rows that count, and the
    refused ones (mutant, file, verdict, why)."""

    def __init__(self, modules: list[str]) -> None:
        self.now: dict[str, MutantDiff] = {}
        self.hashes: dict[str, dict[str, str]] = {}
        for module in modules:
            self.hashes[module] = {}
            self.now |= mutant_diffs(module, (REPO / module).read_text(), self.hashes[module])
        self.kills: set[str] = set()
        self.review: dict[str, tuple[str, str]] = {}
        self.refused: list[tuple[str, str, str, str]] = []
        for row in read_rows(CHECKED):
            if why := refusal(row, len(CHECKED_HEADER) - 2, self.now):
                if row[1] in KILLS:  # a refused survivor row would not count either way
                    self.refused.append((row[0], CHECKED.name, row[1], why))
            elif row[1] in KILLS:
                self.kills.add(row[0])
        for row in read_rows(REVIEWED):
            if why := refusal(row, len(REVIEWED_HEADER) - 2, self.now):
                self.refused.append((row[0], REVIEWED.name, row[1], why))
            else:
                self.review[row[0]] = (row[1], row[2])

    def credit(self, name: str) -> str:
        """What the record says of a mutant: killed since, equivalent, untestable, or nothing."""
        if name in self.kills:
            return "killed since"
        return self.review[name][0] if name in self.review else "none"


def outcomes(module: str) -> dict[str, str]:
    """mutant name -> status, for one source file."""
    meta = REPO / "mutants" / (module + ".meta")
    if not meta.is_file():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: STATUS.get(code, "other") for name, code in codes.items()}


def changed_since_run(module: str, record: Record) -> list[str]:
    """The functions of `module` whose source differs from the one mutmut mutated (mutmut's own
    per-function hashes, of the functions it mutates): their outcomes are the old code's until the
    next run retests them."""
    meta = REPO / "mutants" / (module + ".meta")
    if not meta.is_file():
        return []
    old = json.loads(meta.read_text())["hash_by_function_name"]
    new = record.hashes[module]
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


def scope() -> str:
    """The mutated files' share of the package, in non-blank lines (git's vit/**/*.py files)."""
    files = [f for f in git("ls-files", "vit").split() if f.endswith(".py")]
    lines = {f: sum(bool(x.strip()) for x in (REPO / f).read_text().splitlines()) for f in files}
    mutated, total = sum(lines[m] for m in listed_modules()), sum(lines.values())
    return (
        f"Scope: the {len(listed_modules())} files of pyproject.toml's [tool.mutmut] only_mutate,"
        f" {mutated} of the {total} non-blank lines of vit/'s {len(files)} Python files"
        f" ({100 * mutated / total:.1f}%)."
    )


def share(killed: int, of: int) -> str:
    return f"{100 * killed / of:.1f}%" if of else "-"


REFUSED_LINES = "Record rows refused"  # the list that ends a table, and a kept section


def no_outcomes(module: str) -> SystemExit:
    return SystemExit(f"{module}: no outcomes of its current source: run mutmut on it first")


def refused_lines(record: Record) -> list[str]:
    """The refused rows that name a mutant of the current source (those naming none are history),
    one line each, and a count of the rest."""
    here = [r for r in record.refused if r[0] in record.now]
    lines = [
        "",
        f"{REFUSED_LINES} (a kill or a verdict whose recorded diff is not its mutant's diff"
        f" now, or no diff recorded): {len(record.refused)}; {len(record.refused) - len(here)} of"
        " them name no mutant of the current source.",
    ]
    for name, file, verdict, why in sorted(here):
        lines.append(f"- `{name}` ({file}, {verdict}: {why}): now `{record.now[name].gist}`")
    return lines


TABLE_HEAD = [
    "| module | mutants | " + " | ".join(COLUMNS) + " | killed since | equivalent | untestable"
    " | before | now |",
    "|---" * (len(COLUMNS) + 7) + "|",
]


def module_row(module: str, record: Record) -> tuple[str, list[str], list[str]]:
    """One module's table row from mutmut's outcomes and the record; its survivors neither
    killed since nor reviewed; the functions changed since mutmut mutated them."""
    later, review = record.kills, record.review
    changed = changed_since_run(module, record)
    status = outcomes(module)
    stale = {
        name for name in status if name.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0] in changed
    }
    for name in stale:  # an outcome for code that has changed since is no outcome
        status[name] = "not checked"
    counts = Counter(status.values())
    alive = [m for m, s in status.items() if s in ("survived", "no tests")]
    # mutants of unchanged code that mutmut's run did not reach, run by a recorded check
    reached = [m for m, s in status.items() if s == "not checked" and m in later and m not in stale]
    since = sum(m in later for m in alive) + len(reached)
    verdicts = Counter(review[m][0] for m in alive if m in review and m not in later)
    before = share(counts["killed"], len(status) - counts["not checked"])
    run = len(status) - counts["not checked"] + len(reached)
    now = share(counts["killed"] + since, run - verdicts["equivalent"])
    if counts["not checked"] > len(reached):  # a run under way: shares of those run so far
        before, now = f"{before} of {run}", f"{now} of {run}"
    row = [module, str(len(status))] + [str(counts[c]) for c in COLUMNS]
    row += [str(since), str(verdicts["equivalent"]), str(verdicts["untestable"]), before, now]
    open_ = [m for m in alive if m not in review and m not in later]
    return "| " + " | ".join(row) + " |", open_, changed


def table(command: str, status_note: str = "") -> str:
    record = Record(listed_modules())
    lines = [
        "# Mutation score per module (mutmut)",
        "",
        f"Date {datetime.date.today()}; mutmut {version('mutmut')}; CPU {cpu_kind()}.",
        f"Command: `{command}` then `python scripts/mutation_table.py`.",
        "",
        scope(),
        *(["", status_note] if status_note else []),
        "",
        "- *mutmut*: the outcomes mutmut recorded (mutants/); *killed since*: survivors that tests",
        "  written after the run kill, and mutants of unchanged code that the run did not reach,",
        "  each checked with `python scripts/mutation_check.py MUTANT --record -- TESTS`",
        "  ([checked.tsv](checked.tsv): mutant, outcome, date, tests, diff key).",
        "- *equivalent* / *untestable*: survivors reviewed one by one in",
        "  [reviewed.tsv](reviewed.tsv), each with its reason and diff key.",
        "- A record row counts only while its diff key is its mutant's now",
        "  (scripts/mutation_diffs.py); a row without one does not count.",
        "- *before* = killed / mutants run, as mutmut found them; *now* = (killed + killed",
        "  since) / (mutants run - equivalent). Untestable mutants count against the score.",
        "",
        *TABLE_HEAD,
    ]
    survivors: list[str] = []
    changed: dict[str, list[str]] = {}
    for module in listed_modules():
        row, alive, functions = module_row(module, record)
        lines.append(row)
        survivors += alive
        if functions:
            changed[module] = functions
    lines += ["", f"Survivors neither killed since nor reviewed: {len(survivors)}."]
    lines += [f"- `{m}`" for m in sorted(survivors)[:200]]
    lines += refused_lines(record)
    if changed:
        lines += [
            "",
            "Source changed since mutmut mutated it: these functions' mutants count as not checked "
            "above (their outcomes were the old code's) until `bash scripts/mutation_run.sh` "
            "retests them:",
        ]
        lines += [f"- {m}: " + ", ".join(f"`{f}`" for f in fs) for m, fs in changed.items()]
    return "\n".join(lines) + "\n"


def have_outcomes() -> bool:
    """Whether mutants/ holds any outcome of a mutmut run."""
    return any(s != "not checked" for m in listed_modules() for s in outcomes(m).values())


def credit_by_name(commit: str) -> dict[str, str]:
    """What the record as committed at `commit` credited each mutant with, counted by name."""
    out: dict[str, str] = {}
    for path in (REVIEWED, CHECKED):  # a kill takes precedence over a verdict, as in table()
        text = git("show", f"{commit}:{path.relative_to(REPO)}")
        for row in (line.split("\t") for line in text.splitlines()):
            if row[0] and not row[0].startswith("#") and len(row) > 1:
                if path == REVIEWED:
                    out[row[0]] = row[1]
                elif row[1] in KILLS:
                    out[row[0]] = "killed since"
    return out


def score_range(cells: list[str], moved: list[tuple[str, str, str]]) -> str:
    """A kept table row's score, and its range once each mutant in `moved` (name, credit then,
    credit now) is counted anew, for every case of which of them the run left alive."""
    mutants, killed, survived, no_tests, not_checked = (int(cells[i]) for i in (1, 2, 3, 5, 6))
    since, equivalent, untestable = (int(cells[i]) for i in (8, 9, 10))
    # every survivor was credited, so the kills credited beyond them are mutants the run did not
    # reach, which count as run
    reached = since - (survived + no_tests - equivalent - untestable)
    num, den = killed + since, mutants - not_checked + reached - equivalent
    if share(num, den) != cells[12]:
        raise SystemExit(f"{cells[0]}: {num}/{den} is not the table's {cells[12]}")
    low, high = [num, den], [num, den]
    for _, was, now in moved:  # each applies only if the run left the mutant alive
        dn = (now == "killed since") - (was == "killed since")
        dd = (was == "equivalent") - (now == "equivalent")
        worse = (num + dn) * den < num * (den + dd)
        for bound, apply in ((low, worse), (high, not worse)):
            if apply:
                bound[0] += dn
                bound[1] += dd
    return (
        f"{cells[12]} ({num}/{den}) | {len(moved)} | "
        f"{sum(w == 'killed since' for _, w, _ in moved)} -> "
        f"{sum(n == 'killed since' for _, _, n in moved)} | "
        f"{share(*low)} ({low[0]}/{low[1]}) to {share(*high)} ({high[0]}/{high[1]})"
    )


def corrected(commit: str, status_note: str = "") -> str:
    """The table as committed at `commit`, and the keyed record's correction to it."""
    kept = git("show", f"{commit}:{(RECORD / 'mutmut.md').relative_to(REPO)}")
    if "| module |" not in kept or "Survivors neither killed since nor reviewed: 0." not in kept:
        raise SystemExit(f"no table at {commit}, or one with open survivors: correct it by hand")
    record, old = Record(listed_modules()), credit_by_name(commit)
    command = f"python scripts/mutation_table.py --keep {commit}"
    command += " --status TEXT" if status_note else ""
    lines = [kept.rstrip("\n"), "", f"## Correction, {datetime.date.today()}: record rows keyed"]
    lines += [
        "",
        f"The table above is the one committed at {commit}, written from mutmut's outcomes, which"
        " are not kept in git; it counted a record row by its mutant's name. Counted by diff key"
        " instead (scripts/mutation_diffs.py), a mutant whose credit differs between that record"
        " and this one changes the score only if mutmut's run left it alive (every survivor was"
        " credited, so a mutant with no credit then was killed by the run); the table's counts do"
        " not say which were, so *now, corrected* is the range over those cases. Written by"
        f" `{command}`; the rows refused, and what they named, are in [refused.tsv](refused.tsv).",
        "",
        scope(),
        *(["", status_note] if status_note else []),
        "",
        f"Rows refused since the record was keyed ({REFUSED.name},"
        " `python scripts/mutation_diffs.py check --write`):",
        *refused_summary(),
        "",
        "| module | now (above) | credit changed | killed since, then -> now | now, corrected |",
        "|---|---|---|---|---|",
    ]
    cells_by_row = {
        r.strip("| ").split(" | ")[0]: r.strip("| ").split(" | ") for r in kept.split("\n")
    }
    moved_all: list[tuple[str, str, str]] = []
    for module in listed_modules():
        prefix = module.removesuffix(".py").replace("/", ".") + "."
        names = sorted(n for n in old if n.startswith(prefix) and n in record.now)
        moved = [(n, old[n], record.credit(n)) for n in names if old[n] != record.credit(n)]
        if moved:
            lines.append(f"| {module} | {score_range(cells_by_row[module], moved)} |")
            moved_all += moved
    open_now = sum(now == "none" for _, _, now in moved_all)
    lines += [
        "",
        f"Mutants with no credit now (open survivors if the run left them alive): {open_now}.",
        "",
        "Each mutant whose credit changed (the record then, by name -> now, by diff):",
    ]
    lines += [f"- `{n}`: {w} -> {c}; now `{record.now[n].gist}`" for n, w, c in moved_all]
    lines += added_modules(record, [m for m in listed_modules() if m not in cells_by_row])
    return "\n".join(lines + refused_lines(record)) + "\n"


def added_modules(record: Record, modules: list[str]) -> list[str]:
    """Sections for modules the kept table lacks: from mutmut's outcomes of their own run, or,
    for a module without outcomes here, its section as last committed if its source has not
    changed since (the outcomes are not in git)."""
    if not modules:
        return []
    fresh = [m for m in modules if set(outcomes(m).values()) - {"not checked"}]
    lines: list[str] = []
    for section, covered in kept_sections([m for m in modules if m not in fresh]):
        if overlap := [m for m in covered if m in fresh]:
            raise SystemExit(f"{', '.join(overlap)}: both kept and run again: keep one")
        lines += ["", *section]
    if not fresh:
        return lines
    lines += ["", f"## Added to the scope since ({', '.join(fresh)})", ""]
    runs = ", ".join(f"`bash scripts/mutation_run.sh {m.removesuffix('.py').replace('/', '.')}`"
                     for m in fresh)  # fmt: skip
    lines += [
        f"Run by {runs} (mutmut's outcomes in mutants/), then each survivor killed or reviewed "
        f"as above; {datetime.date.today()}, CPU {cpu_kind()}.",
        "",
        *TABLE_HEAD,
    ]
    survivors: list[str] = []
    for module in fresh:
        row, alive, changed = module_row(module, record)
        if changed:
            raise no_outcomes(module)
        lines.append(row)
        survivors += alive
    lines += ["", f"Survivors neither killed since nor reviewed: {len(survivors)}."]
    return lines + [f"- `{m}`" for m in sorted(survivors)]


ADDED = "## Added to the scope since ("
KEPT = "(Kept as committed at"


def kept_sections(modules: list[str]) -> list[tuple[list[str], list[str]]]:
    """For modules without mutmut outcomes here: each committed "Added to the scope" section
    that holds their rows (its lines, the modules it covers), from the last commit of mutmut.md,
    provided none of its modules' source has changed since."""
    if not modules:
        return []
    path = str((RECORD / "mutmut.md").relative_to(REPO))
    commit = git("log", "-1", "--format=%h", "--", path).strip()
    text = git("show", f"{commit}:{path}") if commit else ""
    sections = []
    for part in text.split("\n" + ADDED)[1:]:
        body = part.split("\n\n" + REFUSED_LINES)[0].rstrip("\n").split("\n")
        covered = body[0].removesuffix(")").split(", ")
        sections.append((covered, [ADDED + body[0], *body[1:]]))
    out: list[tuple[list[str], list[str]]] = []
    for module in modules:
        found = [(body, covered) for covered, body in sections if module in covered]
        if not found:
            raise no_outcomes(module)
        body, covered = found[0]
        if any(covered == c for _, c in out):
            continue
        if changed := [m for m in covered if git("diff", commit, "--", m).strip()]:
            raise SystemExit(f"{', '.join(changed)}: changed since {commit}: run mutmut on it")
        if not any(line.startswith(KEPT) for line in body):  # an older keep names the first
            body = [body[0], "", f"{KEPT} {commit}: mutmut's outcomes are not in git, and the "
                    "source of these modules has not changed since.)", *body[1:]]  # fmt: skip
        out.append((body, covered))
    return out


def refused_summary() -> list[str]:
    """refused.tsv's rows counted by record file, verdict and why."""
    counts = Counter((r[1], r[2], r[3]) for r in read_rows(REFUSED))
    return [f"- {f}, {v}: {n} ({why})" for (f, v, why), n in sorted(counts.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--command", default="bash scripts/mutation_run.sh")
    parser.add_argument("--out", type=Path, default=RECORD / "mutmut.md")
    parser.add_argument("--status", default="", help="a paragraph on the run's state")
    parser.add_argument("--keep", metavar="COMMIT", help="no outcomes: that table, corrected")
    args = parser.parse_args()
    if args.keep:
        text = corrected(args.keep, args.status)
    elif have_outcomes():
        text = table(args.command, args.status)
    else:
        raise SystemExit(
            "mutants/ holds no mutmut outcomes: run scripts/mutation_run.sh, or keep the last "
            "table with --keep COMMIT"
        )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
