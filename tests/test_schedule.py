"""The learning-rate schedule and the stage lists of the curricula (vit/train/schedule.py)."""

from __future__ import annotations

import pytest
import torch

from vit.train.schedule import ScheduleConfig, WarmupCosine, check_stages, lr_scheduler, stage_value


def test_warmup_then_cosine_reaches_the_floor_at_the_end() -> None:
    f = WarmupCosine(total_steps=100, warmup_steps=10, min_ratio=0.1)
    values = [f(s) for s in range(101)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(values[:10], values[1:10], strict=False))  # rising
    assert all(a >= b for a, b in zip(values[10:], values[11:], strict=False))  # falling
    assert values[100] == pytest.approx(0.1)


def test_linear_decay_falls_in_a_straight_line_to_the_floor() -> None:
    linear = WarmupCosine(total_steps=110, warmup_steps=10, min_ratio=0.1, decay="linear")
    cosine = WarmupCosine(total_steps=110, warmup_steps=10, min_ratio=0.1)
    assert [linear(s) for s in range(10)] == [cosine(s) for s in range(10)]  # same warm-up
    steps = [linear(s) - linear(s + 1) for s in range(10, 110)]
    assert steps == pytest.approx([0.9 / 100] * 100)  # equal steps down, from 1 to the floor
    assert linear(35) == pytest.approx(0.1 + 0.9 * 0.75)  # a quarter of the way: 3/4 of the way up
    assert cosine(35) > linear(35) and cosine(85) < linear(85)  # cosine: higher, then lower
    assert linear(110) == pytest.approx(0.1) and linear(500) == pytest.approx(0.1)


def test_stage_value_is_the_last_stage_started() -> None:
    stages = check_stages(
        [[0, 16], [0.3, 24], [0.6, 32]], name="s", value="side", cast=int, example=""
    )
    assert [stage_value(stages, p) for p in (0, 0.29, 0.3, 0.59, 0.6, 1.0)] == [
        16,
        16,
        24,
        24,
        32,
        32,
    ]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(decay="step"), "decay='step' is not a schedule shape"),
        (dict(warmup_epochs=-1), "warmup_epochs=-1 must be >= 0"),
        (dict(warmup_fraction=1.0), "warmup_fraction=1.0 must be in \\[0, 1\\)"),
        (dict(min_lr=-1e-5), "min_lr=-1e-05 must be >= 0"),
    ],
)
def test_bad_schedule_values_fail_clearly(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScheduleConfig(**config)


def test_lr_scheduler_on_steps_warms_up_over_the_fraction_or_the_epochs() -> None:
    def lrs(config: ScheduleConfig) -> list[float]:
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        sched = lr_scheduler(opt, config, lr=1.0, total_steps=100, epochs=10)
        out = []
        for _ in range(100):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    by_epochs = lrs(ScheduleConfig(warmup_epochs=2.0))  # 2 of 10 epochs: 20 steps
    by_fraction = lrs(ScheduleConfig(warmup_fraction=0.2, warmup_epochs=0.0))
    assert by_epochs == by_fraction
    assert by_epochs.index(max(by_epochs)) == 19 and by_epochs[0] == pytest.approx(1 / 20)


def test_lr_scheduler_on_a_budget_follows_the_fraction_used() -> None:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    used = [0.0]
    config = ScheduleConfig(warmup_fraction=0.1, warmup_epochs=0.0, decay="linear")
    sched = lr_scheduler(opt, config, lr=1.0, total_steps=1, epochs=1, progress=lambda: used[0])
    seen = {}
    for fraction in (0.05, 0.1, 0.55, 1.0):
        used[0] = fraction
        sched.step()
        seen[fraction] = opt.param_groups[0]["lr"]
    assert seen[0.05] == pytest.approx(0.5, abs=1e-5)  # half-way up the warm-up
    assert seen[0.55] == pytest.approx(0.5, abs=1e-5)  # half-way down the linear decay
    assert seen[1.0] == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="set model.schedule.warmup_fraction"):
        lr_scheduler(opt, ScheduleConfig(), lr=1.0, total_steps=1, epochs=1, progress=lambda: 0.0)
