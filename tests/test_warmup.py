"""Every shape the curricula train on is compiled at fit start, before the first step
(vit/train/warmup.py), and the warm-up leaves the RNG, the gradients and the model as they were."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import (
    TINY,
    GraphCount,
    compile_with_eager_backend,
    quiet_trainer,
    tiny_classifier,
    tiny_datamodule,
)
from vit.model.vision_transformer import VisionTransformer
from vit.train.callbacks.curricula import PatchDropSchedule, ResolutionSchedule
from vit.train.warmup import compile_planned_shapes, stage_pairs

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def test_each_side_and_rate_runs_once_and_nothing_is_left_changed() -> None:
    model = VisionTransformer(**TINY, dynamic_img_size=True)  # patch 8: 16 patches at 32 px
    seen: list[tuple[bool, int, int]] = []
    model.blocks[0].register_forward_pre_hook(
        lambda m, args: seen.append((m.training, args[0].shape[0], args[0].shape[1]))
    )
    rng = torch.get_rng_state()
    ran = compile_planned_shapes(
        model, shapes=[(16, 0.0), (16, 0.5), (32, 0.0), (32, 0.5), (16, 0.0)], batch_size=4,
        eval_batch_sizes=[6],
        in_chans=3, full_side=32,
    )  # fmt: skip
    assert ran == 5
    # (training, batch, tokens): 16 px -> 4 patches (2 kept at 0.5), 32 px -> 16 (8 kept), + CLS
    assert seen == [(True, 4, 5), (True, 4, 3), (True, 4, 17), (True, 4, 9), (False, 6, 17)]
    assert torch.equal(torch.get_rng_state(), rng)  # dropout draws of the fit are unchanged
    assert all(p.grad is None for p in model.parameters())
    assert model.training and model.patch_drop_rate == 0.0


@pytest.mark.compiles
def test_a_compiled_fit_meets_no_new_shape_after_it_starts(
    image_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fit with both curricula: the graphs compiled by the time training starts are all the
    graphs it compiles (dynamo's count does not grow during the steps or the validation). With
    dynamo's eager backend: the same graphs and guards as inductor's, without code generation."""
    compile_with_eager_backend(monkeypatch)
    count = GraphCount()
    curricula = [
        ResolutionSchedule(stages=[[0, 16], [0.5, 32]]),
        PatchDropSchedule(stages=[[0, 0.0], [0.5, 0.5]]),
    ]
    trainer = quiet_trainer(
        None, accelerator="cpu", max_epochs=2, num_sanity_val_steps=0, callbacks=[*curricula, count]
    )
    module = tiny_classifier(torch_compile=True, network={"num_classes": 3})
    trainer.fit(module, datamodule=tiny_datamodule(image_tree))  # 30 images: 3 steps an epoch
    assert count.graphs[0] > 0 and count.graphs[1] == count.graphs[0]


@pytest.mark.compiles
@pytest.mark.parametrize("drop_last", [True, False])
def test_a_compiled_augmentation_meets_no_new_batch_size_after_the_fit_starts(
    image_tree: Path, monkeypatch: pytest.MonkeyPatch, drop_last: bool
) -> None:
    """compile_augment: the augmentation's graphs (full batches, and without drop_last the last
    partial one) are compiled at fit start, with the network eager and no compiler asked of the
    CPU beyond dynamo (the eager backend)."""
    compile_with_eager_backend(monkeypatch)
    count = GraphCount()
    trainer = quiet_trainer(
        None, accelerator="cpu", max_epochs=2, num_sanity_val_steps=0, callbacks=[count]
    )
    module = tiny_classifier(network={"num_classes": 3})
    # 30 training images in batches of 8: three full batches and, without drop_last, one of 6
    dm = tiny_datamodule(image_tree, batch_size=8, drop_last=drop_last, compile_augment=True)
    assert module.compiles_in_fit is False  # outside a fit: no data module to ask
    trainer.fit(module, datamodule=dm)
    assert module.compiles_in_fit  # the budget's clock then leaves the first step's compile out
    assert count.graphs[0] > 0 and count.graphs[1] == count.graphs[0]  # none once training ran


def test_stage_pairs_are_the_shapes_the_curricula_make_together() -> None:
    sides = [(0.0, 16), (0.25, 24), (0.5, 32)]  # gpu8.yaml's curricula
    rates = [(0.0, 0.0), (0.25, 0.5), (0.85, 0.0)]
    assert stage_pairs(sides, rates) == [(16, 0.0), (24, 0.5), (32, 0.5), (32, 0.0)]
    assert stage_pairs([(0.0, 32)], [(0.0, 0.0)]) == [(32, 0.0)]
    assert stage_pairs([(0.0, 16), (0.5, 32)], [(0.0, 0.0), (0.25, 0.5)]) == [
        (16, 0.0), (16, 0.5), (32, 0.5)
    ]  # fmt: skip
