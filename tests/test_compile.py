"""What torch.compile sees of the network: one graph and no graph break in every shape the
curricula use (gpu8.yaml's network: SPT, LSA, learned positions; 32 px, 16 px with patch drop,
evaluation). A break would split the compiled step and add launches and host work."""

from __future__ import annotations

import pytest
import torch
import yaml

from tests.helpers import REPO
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
