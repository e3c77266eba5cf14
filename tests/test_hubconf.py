"""hubconf.py: torch.hub.load(".", ENTRY, source="local") gives every preset untrained and the
shipped model trained, equal to vit's own loaders; a preset without weights says which have."""

from __future__ import annotations

import importlib.util
import math
import re

import pytest
import torch

import vit
from tests.helpers import CIFAR_ARCHIVE, REPO
from tests.test_shipped_weights import NAME, recorded
from vit.io.timm_interop import config_of
from vit.model.vision_transformer import PRESETS


def hubconf():
    spec = importlib.util.spec_from_file_location("hubconf", REPO / "hubconf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hub_load(entry: str, **kwargs):
    return torch.hub.load(str(REPO), entry, source="local", trust_repo=True, **kwargs)


def test_one_entry_per_preset_and_one_per_shipped_model() -> None:
    module = hubconf()
    entries = {n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")}
    assert entries == set(PRESETS) | set(module.SHIPPED)
    assert module.SHIPPED == {"vit_tiny_d4_cifar10": NAME}
    for name in module.dependencies:  # torch.hub refuses to load when one is missing
        assert importlib.util.find_spec(name) is not None, name
    for entry in entries:
        assert getattr(module, entry).__doc__, f"{entry} needs a docstring: torch.hub.help shows it"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_entry_builds_that_preset_with_overrides(preset: str) -> None:
    model = hub_load(preset, num_classes=100)
    assert config_of(model) == config_of(vit.create_model(preset, num_classes=100))
    assert model.head.out_features == 100
    with pytest.raises(
        ValueError, match=re.escape("entries with weights: ['vit_tiny_d4_cifar10']")
    ):
        hub_load(preset, pretrained=True)


def test_the_shipped_entry_untrained_has_the_shipped_architecture() -> None:
    untrained, trained = hub_load("vit_tiny_d4_cifar10"), vit.load_model(NAME)[0]
    assert config_of(untrained) == config_of(trained)
    assert untrained.training  # fresh, as torchvision's entries
    assert not torch.equal(untrained.head.weight, trained.head.weight)


@pytest.mark.skipif(not CIFAR_ARCHIVE.is_file(), reason=f"needs the JPEG copy at {CIFAR_ARCHIVE}")
def test_the_shipped_entry_scores_its_accuracy_on_1000_test_images(tmp_path) -> None:
    from vit.data.datasets import preprocess
    from vit.data.folder_source import load_folder_source

    model = hub_load("vit_tiny_d4_cifar10", pretrained=True)
    reference = vit.load_model(NAME)[0]
    assert not model.training
    images, labels, _ = load_folder_source(CIFAR_ARCHIVE, split="test", cache_dir=tmp_path)
    x = preprocess(images[:1000])
    with torch.inference_mode():
        logits = model(x)
        assert torch.equal(logits, reference(x))  # the same weights, the same kernel
    top1 = (logits.argmax(dim=-1) == labels[:1000]).float().mean().item()
    p = recorded()["top1"]  # over all 10,000; 1,000 of them: within 4 binomial standard errors
    assert abs(top1 - p) <= 4 * math.sqrt(p * (1 - p) / 1000), top1
