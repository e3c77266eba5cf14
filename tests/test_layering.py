"""The house's layers (README, Layout): each sub-package of vit imports only those below it, only
train/ and commands/ import Lightning, and nothing loads torch before the commands' MKL switch.
Read from the source with ast, so no import can hide (function-level imports count too)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGE = REPO / "vit"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
# sub-package -> the sub-packages it may import: the order the README draws, top to bottom
LAYERS = {
    "commands": {"train", "maps", "io", "data", "model", "system"},
    "train": {"maps", "io", "data", "model", "system"},
    "maps": {"data", "model"},
    "io": {"model"},
    "data": {"system"},
    "model": set(),
    "system": set(),
}
LIGHTNING = {"lightning", "pytorch_lightning", "torchmetrics"}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"


def imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """The modules path imports at run time: vit ones by full name (`from vit.system import
    mkl_amd` -> vit.system.mkl_amd), others by their top package. Imports under `if
    TYPE_CHECKING:` never run and do not count; function-level ones count unless top_level_only."""
    tree = ast.parse(path.read_text(), filename=str(path))
    tree.body = [n for n in tree.body if not _is_type_checking(n)]
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {_name(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: relative import; use the full vit.* name"
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else _name(node.module or ""))
    return found


def _name(module: str) -> str:
    return module if module.split(".")[0] == "vit" else module.split(".")[0]


def subpackage(module: str) -> str:
    """vit.train.callbacks.budget -> train; vit -> ''."""
    return module.split(".")[1] if module.count(".") else ""


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


def test_every_module_lives_in_a_layer() -> None:
    strays = sorted(m for m in MODULES if m != "vit" and subpackage(m) not in LAYERS)
    assert strays == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "vit"))
def test_each_subpackage_imports_only_those_below_it(module: str) -> None:
    own = subpackage(module)
    allowed = LAYERS[own] | {own}
    reached = {subpackage(i) for i in imports(MODULES[module]) if i.startswith("vit.")}
    assert reached <= allowed, f"{module} imports vit.{sorted(reached - allowed)}"


def test_the_layer_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """The check above can fail: a model file that imports the trainer is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from vit.train.module import ViTClassifier\n")
    reached = {subpackage(i) for i in imports(bad) if i.startswith("vit.")}
    assert not reached <= LAYERS["model"] | {"model"}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_train_and_commands_import_lightning(module: str) -> None:
    if subpackage(module) in {"train", "commands"}:
        return
    assert not imports(MODULES[module]) & LIGHTNING


def test_the_model_imports_only_torch_einops_and_itself() -> None:
    model = {m: p for m, p in MODULES.items() if subpackage(m) == "model"}
    allowed = {"torch", "einops"} | STDLIB | set(model)
    strays = {m: sorted(imports(p) - allowed) for m, p in model.items()}
    assert strays == {m: [] for m in model}


def test_the_map_math_imports_only_torch() -> None:
    """Capture and rollout read any model with torch alone; only the pictures need more."""
    for m in ("vit.maps.capture", "vit.maps.rollout"):
        outside = {i for i in imports(MODULES[m]) if not i.startswith("vit.")}
        assert outside <= {"torch"} | STDLIB, m


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_entry_points_import_the_commands(module: str) -> None:
    """vit.commands.entry reaches the commands inside its functions, after the MKL switch."""
    found = {i for i in imports(MODULES[module]) if subpackage(i) == "commands"}
    if module == "vit.commands.entry":
        assert "vit.commands.train" in found
        assert not {i for i in imports(MODULES[module], top_level_only=True) if i != "vit"} & {
            m for m in MODULES if subpackage(m) == "commands" and m != "vit.commands"
        }
    elif subpackage(module) != "commands":
        assert found == set(), f"{module} imports {sorted(found)}"


def test_the_commands_reach_the_switch_without_torch() -> None:
    """Importing vit.commands.entry (and with it the packages vit, vit.commands, vit.system) runs
    the standard library's imports only: torch loads after the switches (vit/system/mkl_amd.py,
    vit/system/malloc.py, vit/system/inductor_cache.py), and `import vit` defines nothing that loads it."""
    seen, todo = set(), ["vit.commands.entry"]
    while todo:
        module = todo.pop()
        seen.add(module)
        parents = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        found = imports(MODULES[module], top_level_only=True)
        assert found <= STDLIB | set(MODULES), (module, sorted(found - STDLIB - set(MODULES)))
        todo += sorted((found & set(MODULES) | parents) - seen)
    assert seen == {
        "vit",
        "vit.commands",
        "vit.commands.entry",
        "vit.system",
        "vit.system.errors",
        "vit.system.inductor_cache",
        "vit.system.malloc",
        "vit.system.mkl_amd",
        "vit.system.paths",
    }
    assert imports(MODULES["vit"]) <= STDLIB


def test_vit_imports_form_no_cycle() -> None:
    assert find_cycle(graph()) is None


def test_callbacks_reach_the_module_through_fit_controls_only() -> None:
    """What vit/train/callbacks/ use of the LightningModule they are handed: FitControls' methods
    (vit/train/controls.py), the network and the class names, and Lightning's own API; nothing
    else of ViTClassifier, so a change to it cannot silently break a callback."""
    import lightning as L

    from vit.train.controls import FitControls

    allowed = set(dir(FitControls)) | set(dir(L.LightningModule)) | {"model", "class_names"}
    used: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / "train" / "callbacks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            base = node.value  # pl_module.X, or _scheduled(pl_module).X (TimeBudget's check)
            if isinstance(base, ast.Call) and getattr(base.func, "id", None) == "_scheduled":
                base = base.args[0]
            if isinstance(base, ast.Name) and base.id == "pl_module":
                used.setdefault(node.attr, set()).add(path.name)
    assert {"schedule_on", "compiles_in_fit", "set_mix_prob", "model"} <= set(used)
    assert {k: v for k, v in used.items() if k not in allowed} == {}
