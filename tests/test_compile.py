"""What torch.compile sees of the network: one graph and no graph break in every shape the
curricula use (gpu8.yaml's network: SPT, LSA, learned positions; 32 px, 16 px with patch drop,
evaluation). A break would split the compiled step and add launches and host work. The same of
the optimizer's update (optimizer.compile), whatever the schedule does to the learning rate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml

from tests.helpers import (
    REPO,
    mixed_groups,
    mixed_model,
    ns_tol,
    quiet_trainer,
    random_loader,
    schedule_lr,
    sum_tol,
    tiny_classifier,
)
from vit.data.augment import TrainAugment
from vit.data.datasets import preprocess
from vit.model.config import NetworkConfig
from vit.train.muon import MuonAdamW


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


@pytest.mark.compiles
def test_the_compiled_step_is_the_eager_arithmetic_in_one_graph_whatever_the_lr() -> None:
    """optimizer.compile: three steps at a new learning rate each (as the schedule sets them),
    with new gradient tensors each (as after zero_grad), land where the eager steps do, compile
    one graph and no more, and leave the state dict's learning rates numbers (a checkpoint reads
    the same either way)."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = mixed_model()
    twin = mixed_model()
    twin.load_state_dict(model.state_dict())
    kwargs = dict(lr=1e-2, weight_decay=0.1, ns_dtype=torch.float32)
    eager = MuonAdamW(mixed_groups(model), **kwargs)
    compiled = MuonAdamW(mixed_groups(twin), compiled=True, **kwargs)
    torch._dynamo.reset()
    counters.clear()
    lrs = []
    for step in range(3):
        grads = [torch.randn_like(p) for p in model.parameters()]
        for opt, m in ((eager, model), (compiled, twin)):
            opt.zero_grad(set_to_none=True)  # as a fit does: the old .grad tensors are freed
            for p, g in zip(m.parameters(), grads, strict=True):
                p.grad = g.clone()
            schedule_lr(opt, step)
            opt.step()
        lrs.append(compiled.param_groups[0]["lr"])
    assert len(set(lrs)) == 3  # the schedule moved every step
    assert counters["stats"]["unique_graphs"] == 1  # no break, no recompile on a new lr
    # per step: Muon's update is lr x scale x Newton-Schulz (float32 sums in another order, as
    # fused), the decay rounds the weight; AdamW's six operations round lr, the decay w twice
    top = max(lrs[0], 3e-3)
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        w = a.detach().abs().max()
        if a.dim() == 2:
            m, n = sorted((a.shape[0] // (3 if name == "0.weight" else 1), a.shape[1]))
            ns = ns_tol(torch.float32, m, n)
            tol = 3 * (top * 0.2 * n**0.5 * ns + sum_tol(torch.float32, 2, w))
        else:
            tol = sum_tol(torch.float32, 6 * 3, top) + sum_tol(torch.float32, 2 * 3, w)
        torch.testing.assert_close(b, a, atol=tol, rtol=0, msg=name)
    state = compiled.state_dict()
    assert all(isinstance(g["lr"], float) for g in state["param_groups"])
    assert state["param_groups"] == eager.state_dict()["param_groups"]


@pytest.mark.compiles
def test_optimizer_compile_reaches_the_fit_and_its_clock(tmp_path) -> None:
    """--model.optimizer.compile true: the fit's MuonAdamW compiles its update, and the fit
    counts as compiling (TimeBudget takes its first step off the clock)."""
    torch.manual_seed(0)
    module = tiny_classifier(optimizer={"name": "muon", "compile": True})
    start = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer = quiet_trainer(tmp_path, max_steps=2, max_epochs=1)
    trainer.fit(module, random_loader(32))
    opt = trainer.optimizers[0]
    assert isinstance(opt, MuonAdamW) and opt.compiled and opt._compiled_update is not None
    assert module.compiles_in_fit
    assert all((p - start[n]).abs().max() > 0 for n, p in module.named_parameters())
