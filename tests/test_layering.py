"""Imports run one way (DESIGN.md): read from the source with ast, so no import can hide."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "vit"
MODULES = {f"vit.{p.stem}": p for p in sorted(PACKAGE.glob("*.py")) if p.stem != "__init__"}
MODULES["vit"] = PACKAGE / "__init__.py"
MODEL_SIDE = {f"vit.{m}" for m in ("attention", "embed", "block", "model", "maps")}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """The modules path imports: vit ones by full name (`from vit import x` -> vit.x), others by
    their top package. Function-level imports count unless top_level_only."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {_name(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: inside the vit package
                base = "vit" + (f".{base}" if base else "")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else _name(base))
    return found


def _name(module: str) -> str:
    """A vit module by full name, anything else by its top package."""
    return module if module.split(".")[0] == "vit" else module.split(".")[0]


def graph() -> dict[str, set[str]]:
    """vit module -> the vit modules it imports, at the top or inside functions."""
    return {m: {i for i in imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_find_cycle_reports_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_model_side_imports_only_torch_einops_and_itself() -> None:
    assert MODEL_SIDE <= set(MODULES)
    allowed = {"torch", "einops"} | STDLIB | MODEL_SIDE
    strays = {m: sorted(imports(MODULES[m]) - allowed) for m in sorted(MODEL_SIDE)}
    assert strays == {m: [] for m in sorted(MODEL_SIDE)}


def test_hardware_imports_no_vit_module() -> None:
    assert not {i for i in imports(MODULES["vit.hardware"]) if i.startswith("vit")}


@pytest.mark.parametrize(
    "path", sorted([*PACKAGE.glob("*.py"), *(REPO / "scripts").glob("*.py")]), ids=str
)
def test_nothing_imports_the_cli(path: Path) -> None:
    """vit.entry alone reaches it, inside its functions, after the MKL switch."""
    if path == PACKAGE / "cli.py":
        return
    if path == PACKAGE / "entry.py":
        assert "vit.cli" in imports(path) and "vit.cli" not in imports(path, top_level_only=True)
    else:
        assert "vit.cli" not in imports(path)


def test_the_commands_reach_the_switch_without_torch() -> None:
    """vit.entry's module imports, and theirs, are the standard library's: torch loads only after
    the MKL switch (vit/mkl_amd.py), and `import vit` defines nothing that loads it."""
    seen, todo = set(), ["vit", "vit.entry"]
    while todo:
        module = todo.pop()
        seen.add(module)
        found = imports(MODULES[module], top_level_only=True)
        assert found <= STDLIB | set(MODULES), (module, sorted(found - STDLIB - set(MODULES)))
        todo += sorted(found & set(MODULES) - seen)
    assert seen == {"vit", "vit.entry", "vit.mkl_amd", "vit.paths"}
    assert imports(MODULES["vit"]) == set()


def test_vit_imports_form_no_cycle() -> None:
    assert find_cycle(graph()) is None
