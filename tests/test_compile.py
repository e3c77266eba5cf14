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
from vit.data.trivial_augment import trivial_augment_batch
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


def test_device_augmentation_breaks_only_at_its_host_draws() -> None:
    """The batch augmentation as on a GPU (every op on the whole batch): torch.compile splits it
    only where it draws from the host generator (crop, flip, TrivialAugment's op, bin and sign),
    never inside the pixel arithmetic. 4 breaks, 5 graphs: the number a draws-first rewrite would
    bring to one graph."""
    augment = TrainAugment(padding=4, hflip=True)

    def on_device(x: torch.Tensor) -> torch.Tensor:
        g = torch.Generator().manual_seed(0)
        return preprocess(
            trivial_augment_batch(augment(x, generator=g), generator=g, grouped=False)
        )

    torch._dynamo.reset()
    x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    explained = torch._dynamo.explain(on_device)(x)
    assert (explained.graph_count, explained.graph_break_count) == (5, 4)
    draws = {"random_crop", "random_hflip", "trivial_augment_batch"}
    for reason in explained.break_reasons:
        frame = reason.user_stack[-1]
        assert frame.name in draws and "generator=generator" in frame.line, (frame, reason.reason)
