"""The repository's words and links: runs are named by date and machine, and every relative
Markdown link leads somewhere (issue 42)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.helpers import REPO

# The banned word, spelled in two parts so that this file does not hold it.
WORD = "".join(("ses", "sion"))
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG_SRC = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def repo_files() -> list[Path]:
    """Tracked files and untracked ones git does not ignore, that exist in the work tree."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git work tree: the file list comes from git ls-files")
    names = [n for n in out.decode().split("\0") if n]
    return [REPO / n for n in names if (REPO / n).is_file()]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (not UTF-8)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


# libraries' names, not periods of work: onnxruntime's class (vit-export's check) and the field of
# TensorBoard's event that marks a writer's purge_step (tests/test_resume.py)
API_NAMES = ("onnxruntime.inference" + WORD, "event." + WORD + "_log")


def test_no_file_or_path_names_the_word():
    offending = []
    for path in repo_files():
        rel = path.relative_to(REPO).as_posix()
        if WORD in rel.lower():
            offending.append(f"{rel} (its path)")
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if WORD in re.sub("|".join(map(re.escape, API_NAMES)), "", line.lower()):
                offending.append(f"{rel}:{number}: {line.strip()[:100]}")
    assert not offending, (
        f"{len(offending)} places say {WORD!r}; name runs by date and machine kind instead:\n"
        + "\n".join(offending)
    )


def relative_links(markdown: str) -> list[str]:
    """Link targets in Markdown prose (code blocks and code spans left out), minus web links."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    targets = LINK.findall(prose) + IMG_SRC.findall(prose)
    return [
        t
        for t in targets
        if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE) and not t.startswith("#")
    ]


def test_relative_markdown_links_resolve():
    broken = []
    for path in repo_files():
        if path.suffix.lower() != ".md":
            continue
        text = text_of(path)
        if text is None:
            continue
        for target in relative_links(text):
            file_part = unquote(target.split("#", 1)[0].split("?", 1)[0])
            if not (path.parent / file_part).exists():
                broken.append(f"{path.relative_to(REPO).as_posix()}: {target}")
    assert not broken, "relative links that lead nowhere:\n" + "\n".join(broken)


def test_link_finder_reads_markdown_as_written():
    text = (
        "See [the recipe](docs/recipe.md#design), ![a curve](results/x/curve.png), "
        '[web](https://example.org), [top](#layout), <img src="a.png" width="5">, '
        "`[not](a-link.md)`\n```\n[also not](b.md)\n```\n"
    )
    assert relative_links(text) == ["docs/recipe.md#design", "results/x/curve.png", "a.png"]


def test_readme_stays_within_12_kb():
    # 12 KB read strictly (12,000 bytes, not 12,288): evidence and history belong in the record
    size = len((REPO / "README.md").read_bytes())
    assert size <= 12_000, (
        f"README.md is {size:,} bytes, over the 12,000 it may hold; move detail to docs/ or "
        "experiments/record/ and link to it"
    )
