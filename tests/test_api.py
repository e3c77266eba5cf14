"""`import vit` is the public API in one place: each name resolves, lazily, to its module."""

from __future__ import annotations

import subprocess
import sys

import pytest

import vit
from tests.helpers import REPO


@pytest.mark.parametrize("name", vit.__all__)
def test_each_public_name_resolves_to_the_module_that_defines_it(name: str) -> None:
    value = getattr(vit, name)
    assert value.__module__ == vit._API[name]
    assert name in dir(vit)


def test_an_unknown_name_fails_as_a_missing_attribute() -> None:
    with pytest.raises(AttributeError, match="no attribute 'VisionTransformers'"):
        vit.VisionTransformers  # noqa: B018


def test_import_vit_loads_nothing_until_a_name_is_used() -> None:
    code = (
        "import sys, vit; assert 'torch' not in sys.modules; "
        "vit.create_model; assert 'torch' in sys.modules and 'lightning' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_the_readme_uses_the_public_api() -> None:
    readme = (REPO / "README.md").read_text()
    assert "import vit\n" in readme
    for name in ("load_model", "attention_maps", "rollout_map", "grad_rollout", "create_model"):
        assert f"vit.{name}(" in readme, name
