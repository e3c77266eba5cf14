"""scripts/kernel_matrix.sh runs every test file that compares floats under each kernel set."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import REPO as ROOT

FLOAT_CHECK = re.compile(r"assert_close|allclose|approx\(")


def _listed() -> set[str]:
    script = (ROOT / "scripts/kernel_matrix.sh").read_text()
    block = re.search(r"^NUMERICAL=\((.*?)^\)", script, flags=re.S | re.M)
    assert block, "scripts/kernel_matrix.sh has no NUMERICAL=( ... ) list"
    return set(re.findall(r"tests/\S+\.py", block.group(1)))


def test_every_file_that_compares_floats_is_in_the_matrix() -> None:
    comparing = {
        f"tests/{path.name}"
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        if path.name != Path(__file__).name and FLOAT_CHECK.search(path.read_text())
    }
    listed = _listed()
    assert comparing - listed == set(), "add these to NUMERICAL in scripts/kernel_matrix.sh"
    assert all((ROOT / name).is_file() for name in listed), "NUMERICAL names a missing file"
    assert "tests/test_inspection.py" in comparing  # the pattern still finds the float checks
