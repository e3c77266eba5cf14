"""docs/tutorial.ipynb runs top to bottom, every check in it passing, and the committed copy keeps
the outputs (its pictures included) that the repository page shows."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest

from tests.helpers import CIFAR_ARCHIVE, REPO
from tests.test_docs import relative_links

NOTEBOOK = REPO / "docs" / "tutorial.ipynb"
KERNEL = "vit-tutorial"  # a kernel spec written per run: this interpreter, whatever else is set up
CELL_TIMEOUT_S = 300  # per cell; the slowest, the whole test split, takes some 20 s on 2 idle cores


def code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def prose(nb: nbformat.NotebookNode) -> str:
    return "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")


def test_the_committed_notebook_keeps_its_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    cells = code_cells(nb)
    # run once, top to bottom, each cell in turn: 1, 2, 3, ...
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    outputs = [out for cell in cells for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    pictures = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(pictures) >= 15  # heat maps, mask, position tables, patches, maps over images
    sections = re.findall(r"^## ([a-z])\. ", prose(nb), flags=re.MULTILINE)
    assert sections == list("abcdefghi")  # every part of the lesson, in order


def test_the_notebook_links_lead_somewhere() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    targets = relative_links(prose(nb))
    assert "recipe.md" in targets  # part i links the evidence behind the recipe
    assert [t for t in targets if not (NOTEBOOK.parent / t.split("#")[0]).exists()] == []


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR_ARCHIVE.is_file(), reason=f"needs the JPEG copy at {CIFAR_ARCHIVE}")
def test_the_notebook_runs_top_to_bottom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbclient import NotebookClient

    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # the kernel's files, and the decoded CIFAR-10 (as a fresh clone decodes it), under tmp
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("VIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VIT_DATA_DIR", raising=False)

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},  # run in docs/, as a reader would
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any failure
    cells = code_cells(nb)
    assert all(cell.execution_count for cell in cells)
    assert not [out for cell in cells for out in cell.outputs if out.output_type == "error"]
