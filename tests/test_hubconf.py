"""hubconf.py: torch.hub lists an entry per preset and per shipped model and shows each one's
docstring; the presets build untrained, the shipped model gives vit.load_model's logits and its
recorded accuracy, and hubconf imports nothing before torch.hub has checked its dependencies."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vit
from tests.helpers import CIFAR_ARCHIVE, REPO, SHIPPED, recorded_test_metrics
from vit.io.pretrained import PRETRAINED
from vit.io.timm_interop import config_of
from vit.model.vision_transformer import PRESETS

ENTRY = "vit_tiny_d4_cifar10"


def hub_load(entry: str, **kwargs):
    return torch.hub.load(str(REPO), entry, source="local", trust_repo=True, **kwargs)


@pytest.fixture
def hub_repo(monkeypatch: pytest.MonkeyPatch) -> str:
    """torch.hub.list and torch.hub.help (torch 2.14) take a GitHub repository only, which they
    download: here they find this checkout instead, as a download of it would be."""
    monkeypatch.setattr(torch.hub, "_get_cache_or_reload", lambda *args, **kwargs: str(REPO))
    return "OWNER/vit"


def test_torch_hub_lists_an_entry_per_preset_and_per_shipped_model(hub_repo: str) -> None:
    entries = torch.hub.list(hub_repo, trust_repo=True)
    assert sorted(entries) == sorted({*PRESETS, ENTRY})
    doc = torch.hub.help(hub_repo, ENTRY, trust_repo=True)
    assert SHIPPED in doc and "pretrained=True" in doc
    assert SHIPPED in PRETRAINED


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_entry_builds_its_preset_and_says_so(preset: str, hub_repo: str) -> None:
    model = hub_load(preset, num_classes=100)
    assert config_of(model) == config_of(vit.create_model(preset, num_classes=100))
    assert isinstance(model, vit.VisionTransformer) and model.head.out_features == 100
    size = PRESETS[preset]
    params = sum(p.numel() for p in vit.create_model(preset).parameters()) / 1e6
    said = (
        f"width {size['embed_dim']}, depth {size['depth']}, {size['num_heads']} heads, MLP ratio "
        f"{size['mlp_ratio']:g} ({params:.1f} M parameters at 10 classes)"
    )
    assert said in torch.hub.help(hub_repo, preset, trust_repo=True)  # the docstring can't rot
    with pytest.raises(ValueError, match=re.escape(f"entries with weights: ['{ENTRY}']")):
        hub_load(preset, pretrained=True)


def test_hubconf_imports_nothing_before_torch_hub_checks_and_names_what_entries_need() -> None:
    """A missing package must be named by torch.hub's `dependencies` check, which runs after it
    imports hubconf.py: so hubconf's import loads nothing outside the standard library, and every
    one of vit's own requirements that an entry loads is in `dependencies`."""
    script = f"""
import importlib.util, json, sys, torch
tops = lambda: {{m.partition(".")[0] for m in sys.modules}} - set(sys.stdlib_module_names)
before = tops()
spec = importlib.util.spec_from_file_location("hubconf", {str(REPO / "hubconf.py")!r})
hubconf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hubconf)
on_import = tops() - before
torch.hub.load({str(REPO)!r}, {ENTRY!r}, source="local", trust_repo=True, pretrained=True)
print(json.dumps({{"on_import": sorted(on_import), "on_load": sorted(tops() - before),
                  "dependencies": hubconf.dependencies}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["on_import"] == []
    needed = {m for m in seen["on_load"] if _requirements() & _distributions(m)}
    assert {"einops", "safetensors"} <= needed  # the check below has something to check
    assert needed <= set(seen["dependencies"]), needed - set(seen["dependencies"])


def _requirements() -> set[str]:
    """vit's own requirements (no extras), by normalised distribution name."""
    from importlib.metadata import requires

    plain = [r for r in requires("vit") or [] if "extra ==" not in r]
    return {_normal(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in plain}


def _distributions(module: str) -> set[str]:
    from importlib.metadata import packages_distributions

    return {_normal(d) for d in packages_distributions().get(module, [])}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_shipped_entry_untrained_has_the_shipped_architecture() -> None:
    untrained, trained = hub_load(ENTRY), vit.load_model(SHIPPED)[0]
    assert config_of(untrained) == config_of(trained)
    assert untrained.training  # fresh, as torchvision's entries
    assert not torch.equal(untrained.head.weight, trained.head.weight)


def test_the_shipped_entry_with_other_classes_keeps_the_body_and_a_fresh_head() -> None:
    model, trained = hub_load(ENTRY, pretrained=True, num_classes=5), vit.load_model(SHIPPED)[0]
    assert model.head.weight.shape == (5, 192) and not model.training
    ours, theirs = model.state_dict(), trained.state_dict()
    body = [k for k in theirs if not k.startswith("head.")]
    assert body and all(torch.equal(ours[k], theirs[k]) for k in body)


def test_the_shipped_entry_scores_its_accuracy_on_1000_test_images(cifar10_cache: Path) -> None:
    from vit.data.datasets import preprocess
    from vit.data.folder_source import load_folder_source

    model = hub_load(ENTRY, pretrained=True)
    assert not model.training
    images, labels, _ = load_folder_source(CIFAR_ARCHIVE, split="test", cache_dir=cifar10_cache)
    images, labels = images[::10], labels[::10]  # the split is sorted by class: 100 of each
    assert labels.bincount().tolist() == [100] * 10
    x = preprocess(images)
    with torch.inference_mode():
        logits = model(x)
        assert torch.equal(logits, vit.load_model(SHIPPED)[0](x))  # same weights, same kernel
    top1 = (logits.argmax(dim=-1) == labels).float().mean().item()
    p = recorded_test_metrics()["top1"]  # over all 10,000 test images
    # 1,000 of them: within 4 binomial standard errors (a stratified sample varies less)
    assert abs(top1 - p) <= 4 * math.sqrt(p * (1 - p) / 1000), top1
