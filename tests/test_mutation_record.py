"""The mutation record's verdicts hold only for the mutations they judged (mutation_diffs.py).

mutmut names a mutant by its function and its number in that function, and renumbers a function's
mutants when the function changes: a row of checked.tsv or reviewed.tsv counts only while its diff
key is the one its mutant has now. The keying of mutmut's own mutants runs where mutmut is
installed (pip install -e '.[mutation]'); the rest needs only the standard library.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import load_script

diffs = load_script("mutation_diffs")

SCALE = """\
def scale(x, k):
    if k > 1:
        k = k // 2
    # the lines between keep the last mutation's diff apart
    # from an edit of the first
    #
    return x - k
"""
OTHER = """\
def other(x):
    return x * 2
"""


KEY = len(diffs.REVIEWED_HEADER) - 2  # reviewed.tsv: mutant, verdict, reason, diff key, mutation


def key_row(name: str, key: str) -> list[str]:
    return [name, "equivalent", "a reason", key, "- a / + b"]


def test_a_diff_has_no_line_numbers_and_its_key_follows_the_change() -> None:
    original = "def f(x):\n    y = x + 1\n    return y * 2"
    plus = diffs.function_diff(original, original.replace("x + 1", "x - 1"))
    assert plus.diff == "@@\n def f(x):\n-    y = x + 1\n+    y = x - 1\n     return y * 2"
    assert plus.gist == "- y = x + 1 / + y = x - 1"
    assert len(plus.key) == 12 and int(plus.key, 16) >= 0
    times = diffs.function_diff(original, original.replace("y * 2", "y * 3"))
    assert times.key != plus.key  # another mutation of the same function
    assert diffs.function_diff(original, original.replace("x + 1", "x - 1")) == plus


def test_a_row_counts_only_while_its_key_is_its_mutants_key_now() -> None:
    now = {"m.x_f__mutmut_1": diffs.MutantDiff("@@", "aaaaaaaaaaaa", "- a / + b")}
    assert diffs.refusal(key_row("m.x_f__mutmut_1", "aaaaaaaaaaaa"), KEY, now) == ""
    assert diffs.refusal(key_row("m.x_f__mutmut_1", "bbbbbbbbbbbb"), KEY, now) == (
        "another mutation now"
    )
    assert diffs.refusal(key_row("m.x_f__mutmut_2", "aaaaaaaaaaaa"), KEY, now) == (
        "no such mutant now"
    )


def test_a_row_without_a_key_is_refused() -> None:
    now = {"m.x_f__mutmut_1": diffs.MutantDiff("@@", "aaaaaaaaaaaa", "- a / + b")}
    old_layout = ["m.x_f__mutmut_1", "equivalent", "a reason"]  # as written before the keys
    assert diffs.refusal(old_layout, KEY, now) == "no diff recorded"
    assert diffs.refusal(key_row("m.x_f__mutmut_1", ""), KEY, now) == "no diff recorded"


def test_record_files_round_trip_as_plain_tab_separated_text(tmp_path: Path) -> None:
    path = tmp_path / "reviewed.tsv"
    rows = [key_row("m.x_f__mutmut_2", "aaaaaaaaaaaa"), ["m.x_f__mutmut_1", "untestable", 'x("y")']]
    diffs.write_rows(path, diffs.REVIEWED_HEADER, rows)
    assert path.read_text().splitlines()[2] == 'm.x_f__mutmut_1\tuntestable\tx("y")\t\t'
    assert diffs.read_rows(path) == [rows[0], rows[1] + ["", ""]]  # order kept, short rows padded
    assert diffs.module_path("vit.data.augment.xǁTrainAugmentǁforward__mutmut_13") == (
        "vit/data/augment.py"
    )


def mutants(source: str) -> dict:
    pytest.importorskip("mutmut", reason="keys mutmut's own mutants: pip install -e '.[mutation]'")
    return diffs.mutant_diffs("pkg/mod.py", source)


def test_moving_a_function_in_its_file_keeps_every_key() -> None:
    before = mutants(SCALE + "\n\n" + OTHER)
    after = mutants(OTHER + "\n\n# a comment above it\n\n\n" + SCALE)  # scale moved down
    assert before and before == after
    assert len({d.key for d in before.values()}) == len(before)  # one key per mutation


def test_an_edit_that_renumbers_a_functions_mutants_voids_their_rows() -> None:
    before = mutants(SCALE)
    edited = mutants(SCALE.replace("if k > 1:", "if k > 1 and x:"))  # `and` -> `or` comes first
    rows = [key_row(name, d.key) for name, d in before.items()]
    refused = [r[0].rsplit("_", 1)[1] for r in rows if diffs.refusal(r, KEY, edited)]
    assert refused == ["1", "2", "3", "4", "5", "6"]  # every number names another mutation now
    last = "pkg.mod.x_scale__mutmut_6"
    assert before[last].gist == "- return x - k / + return x + k"
    assert edited[last].gist == "- k = k // 2 / + k = k // 3"  # the name now means another
    # the same mutation, far enough from the edit to keep its diff, has its key under a new name
    assert edited["pkg.mod.x_scale__mutmut_7"].key == before[last].key


def test_rekey_gives_a_renumbered_mutation_its_new_name_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mutation_diffs.py rekey`: a row whose exact mutation now goes by another name takes it;
    a row whose mutation the edit changed keeps its name and stays refused."""
    before = mutants(SCALE)
    edited = mutants(SCALE.replace("if k > 1:", "if k > 1 and x:"))
    moved, touched = "pkg.mod.x_scale__mutmut_6", "pkg.mod.x_scale__mutmut_5"
    checked, reviewed = tmp_path / "checked.tsv", tmp_path / "reviewed.tsv"
    kill = [moved, "killed", "2026-12-01", "abc1234", "tests/", before[moved].key, "- / +"]
    diffs.write_rows(checked, diffs.CHECKED_HEADER, [kill])
    rows = [key_row(moved, before[moved].key), key_row(touched, before[touched].key)]
    diffs.write_rows(reviewed, diffs.REVIEWED_HEADER, rows)
    monkeypatch.setattr(diffs, "current_diffs", lambda modules: edited)
    assert diffs.rekey(checked, reviewed) == 2  # the kill and the verdict of the moved one
    new = "pkg.mod.x_scale__mutmut_7"
    assert [r[0] for r in diffs.read_rows(checked)] == [new]
    assert [r[0] for r in diffs.read_rows(reviewed)] == [new, touched]
    assert diffs.refusal(diffs.read_rows(reviewed)[0], KEY, edited) == ""
    assert diffs.refusal(diffs.read_rows(reviewed)[1], KEY, edited) == "another mutation now"


def _table_script(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    return load_script("mutation_table")


def test_a_module_row_counts_kills_since_and_verdicts_of_its_survivors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = _table_script(monkeypatch)
    codes = {"m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "survived"}
    codes |= {"m.x_f__mutmut_3": "survived", "m.x_f__mutmut_4": "survived"}
    monkeypatch.setattr(table, "outcomes", lambda module: dict(codes))
    monkeypatch.setattr(table, "changed_since_run", lambda module, record: [])
    record = type("R", (), {})()
    record.kills = {"m.x_f__mutmut_2"}  # killed since by a recorded check
    record.review = {"m.x_f__mutmut_3": ("equivalent", "why")}  # _4 stays open
    row, alive, changed = table.module_row("m.py", record)
    # 4 mutants: 1 killed, 3 survived; 1 killed since, 1 equivalent: now 2 of 3
    assert row == "| m.py | 4 | 1 | 3 | 0 | 0 | 0 | 0 | 1 | 1 | 0 | 25.0% | 66.7% |"
    assert alive == ["m.x_f__mutmut_4"] and changed == []
    lines = table.added_modules(record, ["m.py"])
    assert "## Added to the scope since (m.py)" in lines and row in lines
    assert lines[-2:] == ["Survivors neither killed since nor reviewed: 1.", "- `m.x_f__mutmut_4`"]
    monkeypatch.setattr(table, "outcomes", lambda module: {})
    with pytest.raises(SystemExit, match="m.py: no outcomes of its current source"):
        table.added_modules(record, ["m.py"])


COMMITTED_TABLE = """\
# Mutation score per module (mutmut)

## Added to the scope since (m.py)

Run by `bash scripts/mutation_run.sh m` (mutmut's outcomes in mutants/), then each survivor ...

| module | mutants |
| m.py | 4 |

Survivors neither killed since nor reviewed: 0.

Record rows refused (a kill or a verdict ...): 0; 0 of them name no mutant of the current source.
"""


def test_a_module_without_outcomes_here_keeps_its_committed_section_while_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mutmut's outcomes are not in git: in a new checkout a module added to the scope earlier
    keeps the section its run wrote, as committed, unless its source changed since."""
    table = _table_script(monkeypatch)
    changed = {"m.py": ""}
    answers = {"log": "abc1234\n", "show": COMMITTED_TABLE}
    monkeypatch.setattr(
        table, "git", lambda *a: answers[a[0]] if a[0] in answers else changed[a[-1]]
    )
    monkeypatch.setattr(table, "outcomes", lambda module: {"m.x_f__mutmut_1": "not checked"})
    lines = table.added_modules(type("R", (), {})(), ["m.py"])
    assert lines[1:3] == ["## Added to the scope since (m.py)", ""]
    assert lines[3].startswith("(Kept as committed at abc1234: mutmut's outcomes are not in git")
    assert (
        "| m.py | 4 |" in lines and lines[-1] == "Survivors neither killed since nor reviewed: 0."
    )
    assert not any("Record rows refused" in line for line in lines)
    # kept again at a later commit, the line keeps naming the first keep
    answers["show"] = COMMITTED_TABLE.replace("\n\nRun by", "\n\n" + lines[3] + "\n\nRun by")
    answers["log"] = "def5678\n"
    assert table.added_modules(type("R", (), {})(), ["m.py"]) == lines
    changed["m.py"] = "diff --git a/m.py b/m.py"
    with pytest.raises(SystemExit, match="m.py: changed since def5678: run mutmut on it"):
        table.added_modules(type("R", (), {})(), ["m.py"])
