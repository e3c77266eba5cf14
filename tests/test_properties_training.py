"""Laws of the training side checked on generated inputs (hypothesis): batched crop and flip, the
learning-rate schedule on steps and on a wall-clock budget, and the validation split.

Inputs stay small and the examples few, so the file runs in seconds; `derandomize` makes every run
draw the same examples.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.helpers import FakeClock
from vit.data.augment import TrainAugment
from vit.train.callbacks.budget import TimeBudget
from vit.train.datamodule import CIFAR10DataModule
from vit.train.schedule import FINE, ScheduleConfig, WarmupCosine, lr_scheduler

# derandomize: CI draws the same examples every run; database=None: nothing written to the checkout
LAW = settings(max_examples=40, deadline=None, derandomize=True, database=None)

# ---- batched crop and flip (vit/data/augment.py) ------------------------------------------------


@st.composite
def image_batches(draw: st.DrawFn) -> torch.Tensor:
    """(B, C, H, W) images, uint8 as the pipeline's or float32, any values (zeros included)."""
    shape = tuple(draw(st.integers(1, top)) for top in (4, 3, 6, 6))
    if draw(st.booleans()):
        return torch.from_numpy(draw(hnp.arrays(np.uint8, shape)))
    elements = st.floats(-2.0, 2.0, width=32, allow_nan=False)
    return torch.from_numpy(draw(hnp.arrays(np.float32, shape, elements=elements)))


def _windows(image: torch.Tensor, padding: int, hflip: bool) -> list[torch.Tensor]:
    """Every H x W window of the zero-padded image, and each one mirrored when flips are on."""
    h, w = image.shape[-2:]
    padded = F.pad(image, (padding,) * 4)
    crops = [
        padded[:, top : top + h, left : left + w]
        for top in range(2 * padding + 1)
        for left in range(2 * padding + 1)
    ]
    return crops + [c.flip(-1) for c in crops] if hflip else crops


@LAW
@given(
    images=image_batches(),
    padding=st.integers(0, 3),
    hflip=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_crop_and_flip_only_move_pixels_or_pad(
    images: torch.Tensor, padding: int, hflip: bool, seed: int
) -> None:
    """Each output image is one window of its zero-padded input, mirrored or not: the dtype, the
    shape and the values (the input's, or the padding's 0) stay; nothing is mixed or rescaled."""
    out = TrainAugment(padding=padding, hflip=hflip)(
        images, generator=torch.Generator().manual_seed(seed)
    )
    assert out.dtype == images.dtype and out.shape == images.shape
    for i in range(images.shape[0]):
        windows = _windows(images[i], padding, hflip)
        assert any(torch.equal(out[i], window) for window in windows), f"image {i}"


# ---- the learning-rate schedule (vit/train/schedule.py) ----------------------------------------


def _rises_then_falls(values: list[float], peak_at: int) -> None:
    """Non-decreasing up to index peak_at, non-increasing from there."""
    up, down = values[: peak_at + 1], values[peak_at:]
    assert all(a <= b for a, b in zip(up, up[1:], strict=False)), up
    assert all(a >= b for a, b in zip(down, down[1:], strict=False)), down


def _step_lrs(config: ScheduleConfig, *, lr: float, total_steps: int, epochs: int) -> list[float]:
    """The learning rate of each of total_steps steps, and after the last one."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = lr_scheduler(opt, config, lr=lr, total_steps=total_steps, epochs=epochs)
    lrs = []
    for _ in range(total_steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return [*lrs, opt.param_groups[0]["lr"]]


@LAW
@given(
    total=st.integers(1, 300),
    data=st.data(),
    min_ratio=st.sampled_from([0.0, 0.1]) | st.floats(0.0, 0.5),
    decay=st.sampled_from(["cosine", "linear"]),
)
def test_schedule_rises_then_falls_to_the_floor_exactly_at_the_end(
    total: int, data: st.DataObject, min_ratio: float, decay: str
) -> None:
    warmup = data.draw(st.integers(0, total - 1))  # warm-up shorter than training: see below
    f = WarmupCosine(total_steps=total, warmup_steps=warmup, min_ratio=min_ratio, decay=decay)
    values = [f(step) for step in range(total + 3)]
    _rises_then_falls(values, peak_at=warmup)
    # min_ratio + (1 - min_ratio) * 1: one rounding from 1
    assert max(values) == pytest.approx(1.0, rel=1e-15, abs=1e-15)
    assert values[total:] == [min_ratio] * 3  # at the end and after: the floor, exactly
    assert all(v > min_ratio for v in values[warmup:total])  # not before the end


@LAW
@given(
    total_steps=st.integers(1, 120),
    epochs=st.integers(1, 10),
    lr=st.floats(1e-5, 1.0),
    data=st.data(),
    decay=st.sampled_from(["cosine", "linear"]),
)
def test_lr_scheduler_on_steps_ends_at_zero_after_the_last_step(
    total_steps: int, epochs: int, lr: float, data: st.DataObject, decay: str
) -> None:
    if data.draw(st.booleans()):
        config = ScheduleConfig(warmup_epochs=data.draw(st.floats(0.0, epochs)), decay=decay)
    else:
        fraction = data.draw(st.floats(0.0, 0.99))
        config = ScheduleConfig(warmup_epochs=0.0, warmup_fraction=fraction, decay=decay)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    schedule = lr_scheduler(opt, config, lr=lr, total_steps=total_steps, epochs=epochs)
    warmup = schedule.lr_lambdas[0].warmup  # the WarmupCosine's steps of warm-up
    # a warm-up as long as training is shortened: the example test below
    assume(warmup < total_steps)
    lrs = _step_lrs(config, lr=lr, total_steps=total_steps, epochs=epochs)
    _rises_then_falls(lrs, peak_at=warmup)
    assert lrs[-1] == 0.0 and all(v > 0 for v in lrs[:-1])


@LAW
@given(
    warmup_fraction=st.floats(0.0, 0.99),
    decay=st.sampled_from(["cosine", "linear"]),
    fractions=st.lists(st.floats(0.0, 1.0), max_size=30),
)
def test_lr_scheduler_on_a_budget_rises_then_falls_to_zero_at_the_budget(
    warmup_fraction: float, decay: str, fractions: list[float]
) -> None:
    """Driven by the fraction of the budget used (TimeBudget's clock), in any increasing order."""
    used = [0.0]
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    config = ScheduleConfig(warmup_epochs=0.0, warmup_fraction=warmup_fraction, decay=decay)
    sched = lr_scheduler(opt, config, lr=1.0, total_steps=1, epochs=1, progress=lambda: used[0])
    points = sorted({0.0, warmup_fraction, 1.0, *fractions})
    lrs = []
    for fraction in points:
        used[0] = fraction
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    _rises_then_falls(lrs, peak_at=points.index(warmup_fraction))
    assert lrs[-1] == 0.0
    # the schedule reads the fraction to 1/FINE: positive until the last of its FINE steps
    assert all(v > 0 for v, f in zip(lrs, points, strict=True) if f < 1 - 1 / FINE)


@pytest.mark.parametrize(
    ("warmup_epochs", "total_steps", "epochs"),
    [
        (1.0, 10, 1),  # the default warm-up of one epoch, in a one-epoch fit
        (0.9, 2, 1),  # shorter, but 0.9 of 2 steps rounds to 2
        (5.0, 20, 2),  # longer than the fit
    ],
)
def test_a_warmup_as_long_as_training_is_shortened_so_that_training_still_ends_at_zero(
    warmup_epochs: float, total_steps: int, epochs: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The rest of the law's domain (an example test: a failing hypothesis test writes a patch
    file on every run): the warm-up is cut to half of training, and the log says so."""
    config = ScheduleConfig(warmup_epochs=warmup_epochs)
    with caplog.at_level("WARNING", logger="vit.train.schedule"):
        lrs = _step_lrs(config, lr=1.0, total_steps=total_steps, epochs=epochs)
    assert lrs[-1] == 0.0
    _rises_then_falls(lrs, peak_at=total_steps // 2)
    assert "is not shorter than training" in caplog.text and "warmup_epochs" in caplog.text


# ---- the wall-clock budget (vit/train/callbacks/budget.py) ---------------------------------------


class _Module:
    """What TimeBudget needs of the LightningModule (ViTClassifier offers the same two)."""

    def __init__(self, compiles_in_fit: bool) -> None:
        self.compiles_in_fit = compiles_in_fit
        self.progress: Any = None

    def schedule_on(self, progress: Any) -> None:
        self.progress = progress


@st.composite
def budget_runs(draw: st.DrawFn) -> dict[str, Any]:
    """A budget, a resume point in it, a compile time, and steps and validations of any length."""
    minutes = draw(st.floats(0.05, 1.0))
    elapsed = draw(st.floats(0.0, 60.0 * minutes * 0.99)) if draw(st.booleans()) else 0.0
    events = st.tuples(st.sampled_from(["step", "val"]), st.floats(0.0, 20.0))
    return dict(
        minutes=minutes,
        resumed={"elapsed_s": elapsed, "off_clock_s": draw(st.floats(0.0, 1.0)) * elapsed},
        compiles_in_fit=draw(st.booleans()),
        compile_s=draw(st.floats(0.0, 30.0)),
        first_step_s=draw(st.floats(0.0, 20.0)),
        events=draw(st.lists(events, max_size=25)),
        warmup_fraction=draw(st.floats(0.0, 0.99)),
    )


@LAW
@given(run=budget_runs())
def test_budget_fraction_rises_and_the_fit_stops_at_the_budget_with_the_lr_at_zero(
    run: dict[str, Any],
) -> None:
    """Whatever the steps, validations, compiles and resume: the fraction of the budget used
    (the schedule's clock) only rises, within [0, 1]; the fit stops at the first step that ends
    with the budget spent, never before, with the fraction exactly 1: the learning rate is 0."""
    budget_s, clock, module = 60.0 * run["minutes"], FakeClock(0.0), _Module(run["compiles_in_fit"])
    trainer = SimpleNamespace(
        global_step=0,
        should_stop=False,
        sanity_checking=False,
        check_val_every_n_epoch=1,
        strategy=SimpleNamespace(broadcast=lambda obj, src=0: obj),
    )
    budget = TimeBudget(minutes=run["minutes"])
    budget.clock = clock
    budget.load_state_dict(run["resumed"])
    budget.setup(trainer, module, "fit")
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    config = ScheduleConfig(warmup_epochs=0.0, warmup_fraction=run["warmup_fraction"])
    sched = lr_scheduler(opt, config, lr=1.0, total_steps=1, epochs=1, progress=module.progress)
    budget.on_fit_start(trainer, module)
    clock.now += run["compile_s"]
    budget.on_train_start(trainer, module)

    def reading() -> tuple[float, float, float]:
        return budget.elapsed_s(), budget.state_dict()["off_clock_s"], budget.fraction()

    seen = [reading()]
    # a first step, as in any fit, the drawn events, then quarters of the budget until it is spent
    events = [("step", run["first_step_s"]), *run["events"], *[("step", budget_s / 4)] * 6]
    for kind, seconds in events:
        if kind == "val":
            budget.on_validation_start(trainer, module)
            clock.now += seconds
            budget.on_validation_end(trainer, module)
        else:
            budget.on_train_batch_start(trainer)
            clock.now += seconds
            trainer.global_step += 1
            opt.step()
            sched.step()
            budget.on_train_batch_end(trainer)
            spent = budget.elapsed_s() >= budget_s
            assert trainer.should_stop or not spent
            # not before the budget: up to the rounding of the clock's sums
            assert not trainer.should_stop or budget.elapsed_s() >= budget_s - 1e-9
        seen.append(reading())
        (e1, off1, f1), (e2, off2, f2) = seen[-2:]
        # rising, up to the rounding of the clock's sums (a few ulps of the seconds used)
        assert -1e-12 <= f1 <= f2 + 1e-12 and f2 <= 1.0, seen
        # after the first step (no span off the clock under way at either reading) and with no
        # time off the clock in between, what is left of the schedule and of the budget shrink
        # in proportion: the schedule spreads its rest over the time left
        if len(seen) > 2 and off1 == off2 and e2 < budget_s:
            assert abs((1 - f1) * (budget_s - e2) - (1 - f2) * (budget_s - e1)) <= 1e-9 * budget_s
        if trainer.should_stop:
            break
    assert trainer.should_stop and budget.fraction() == 1.0
    budget.on_train_batch_start(trainer)  # the step after: the schedule's clock reads 1
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.0


# ---- the validation split (vit/train/datamodule.py) ----------------------------------------------


@LAW
@given(
    n=st.integers(2, 300),
    seed=st.integers(0, 2**31),
    split_seed=st.none() | st.integers(0, 2**31),
    other_seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_validation_split_is_disjoint_and_the_same_for_the_same_seed(
    n: int, seed: int, split_seed: int | None, other_seed: int, data: st.DataObject
) -> None:
    val_size = data.draw(st.integers(0, n - 1))
    subset = data.draw(st.none() | st.integers(1, n - val_size))

    def split(seed: int, train_subset: int | None) -> tuple[list[int], list[int]]:
        dm = CIFAR10DataModule(
            val_size=val_size, seed=seed, split_seed=split_seed, train_subset=train_subset
        )
        train, val = dm.split_indices(n)
        return train.tolist(), val.tolist()

    train, val = split(seed, subset)
    assert len(val) == val_size and len(train) == (subset or n - val_size)
    assert train == sorted(set(train)) and val == sorted(set(val))  # sorted, no repeats
    assert set(train).isdisjoint(val) and set(train) | set(val) <= set(range(n))
    all_train, all_val = split(seed, None)
    assert sorted(all_train + all_val) == list(range(n))  # no subset: every image somewhere
    assert all_val == val and set(train) <= set(all_train)  # a subset is drawn from the rest
    assert split(seed, subset) == (train, val)  # a fresh module, the same seed: the same split
    if split_seed is not None:  # split_seed alone decides the split
        assert split(other_seed, subset) == (train, val)
