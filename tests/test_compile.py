"""What torch.compile sees of the network: one graph and no graph break in every shape the
curricula use (gpu8.yaml's network: SPT, LSA, learned positions; 32 px, 16 px with patch drop,
evaluation). A break would split the compiled step and add launches and host work."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml

from tests.helpers import REPO
from vit.data.augment import TrainAugment
from vit.data.datasets import preprocess
from vit.model.config import NetworkConfig


@pytest.fixture(scope="module")
def network() -> torch.nn.Module:
    cfg = yaml.safe_load((REPO / "experiments" / "gpu8.yaml").read_text())["model"]["network"]
    return NetworkConfig(**{**cfg, "depth": 2}).build()


@pytest.mark.parametrize(
    ("side", "patch_drop", "training"),
    [(32, 0.0, True), (16, 0.5, True), (24, 0.0, True), (32, 0.0, False)],
)
def test_the_network_is_one_graph_without_breaks(
    network: torch.nn.Module, side: int, patch_drop: float, training: bool
) -> None:
    network.train(training)
    network.set_dynamic_img_size(side != 32)
    network.set_patch_drop(patch_drop)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(network)(torch.randn(2, 3, side, side))
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1


def test_forward_and_loss_are_one_graph(network: torch.nn.Module) -> None:
    """The loss as the module computes it (soft Mixup/CutMix targets, label smoothing) joins the
    network's graph: torch.compile of the step's forward part is one graph."""
    network.train()
    network.set_dynamic_img_size(False)
    network.set_patch_drop(0.0)

    def forward_and_loss(x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(network(x).float(), targets, label_smoothing=0.1)

    torch._dynamo.reset()
    targets = torch.softmax(torch.randn(2, network.num_classes), dim=-1)
    explained = torch._dynamo.explain(forward_and_loss)(torch.randn(2, 3, 32, 32), targets)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


@pytest.mark.parametrize(
    "kwargs", [dict(trivial=True), dict(rand_ops=2), dict(trivial=True, erase_prob=0.5)]
)
def test_the_device_augmentation_is_one_graph_once_its_draws_are_made(kwargs: dict) -> None:
    """The batch augmentation as on a GPU (every op on the whole batch), its draws made first on
    the host: torch.compile takes the pixel work and the normalization as one graph. (Drawn inside,
    each draw from a generator would break it: 5 graphs for crop, flip and TrivialAugment.)"""
    augment = TrainAugment(padding=4, hflip=True, **kwargs)
    x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    draws = augment.draw(4, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(
        lambda x, draws: preprocess(augment.apply(x, draws, grouped=False))
    )(x, draws)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), [
        str(b.reason) for b in explained.break_reasons
    ]


@pytest.mark.compiles
def test_the_compiled_augmentation_gives_the_eager_images() -> None:
    """compile_augment's TrainAugment (inductor, one graph) gives, draw for draw, the images of
    the eager augmentation, pixel for pixel, on the CPU."""
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    settings = dict(trivial=True, erase_prob=0.5)  # every pixel op, random erasing included
    eager, compiled = TrainAugment(**settings), TrainAugment(**settings, compiled=True)
    torch._dynamo.reset()
    for seed in range(3):
        out = compiled(x, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(out, eager(x, generator=torch.Generator().manual_seed(seed))), seed
