"""The learning-rate schedule and the stage lists of the curricula (vit/train/schedule.py)."""

from __future__ import annotations

import pytest
import torch

from vit.train.schedule import (
    ScheduleConfig,
    WarmupCosine,
    check_resumed_schedule,
    check_stages,
    lr_scheduler,
    stage_value,
)

# Learning rates are Python floats (float64 on the host): pytest.approx's default (1e-6 relative)
# is far above their rounding, and no CPU kind changes them.


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


def _lr_at(config: ScheduleConfig, fraction: float, *, lr: float = 1.0) -> float:
    """The learning rate a budget's schedule gives once `fraction` of the time is used."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    used = [0.0]
    sched = lr_scheduler(opt, config, lr=lr, total_steps=1, epochs=1, progress=lambda: used[0])
    used[0] = fraction
    sched.step()
    return opt.param_groups[0]["lr"]


def test_a_budget_refuses_warmup_epochs_word_for_word_and_takes_none() -> None:
    with pytest.raises(ValueError) as error:
        _lr_at(ScheduleConfig(warmup_epochs=0.5), 0.0)
    assert str(error.value) == (
        "with a wall-clock budget (vit.train.callbacks.TimeBudget) the number of epochs is not "
        "known in advance: set model.schedule.warmup_fraction (e.g. 0.05 of the budget) "
        "and model.schedule.warmup_epochs: 0."
    )
    # no warm-up at all is fine: the schedule starts at the peak
    assert _lr_at(ScheduleConfig(warmup_epochs=0.0), 0.0) == pytest.approx(1.0)


def test_a_budget_decays_to_min_lr() -> None:
    config = ScheduleConfig(warmup_fraction=0.1, warmup_epochs=0.0, min_lr=0.02)
    assert _lr_at(config, 1.0, lr=0.2) == pytest.approx(0.02)
    assert _lr_at(config, 0.55, lr=0.2) == pytest.approx(0.11)  # half-way down the cosine


def test_a_budgets_warmup_always_leaves_its_last_step_to_decay() -> None:
    """A warm-up fraction that rounds to the whole table (FINE steps) is cut one step short:
    the peak is reached one step before the end, and the end is the floor."""
    config = ScheduleConfig(warmup_fraction=0.9999996, warmup_epochs=0.0)
    assert _lr_at(config, 1.0 - 1e-6) == pytest.approx(1.0)
    assert _lr_at(config, 1.0) == pytest.approx(0.0)


def test_a_warmup_as_long_as_training_is_halved_with_a_warning_that_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with caplog.at_level("WARNING", logger="vit.train.schedule"):
        lr_scheduler(opt, ScheduleConfig(warmup_epochs=3.0), lr=1.0, total_steps=10, epochs=2)
    assert [r.getMessage() for r in caplog.records] == [
        "the warm-up (15 steps) is not shorter than training (10 steps): warming up for 5 "
        "so that the learning rate still decays; lower model.schedule.warmup_epochs or "
        "raise trainer.max_epochs"
    ]


def test_warmup_cosine_decays_to_zero_unless_told_a_floor() -> None:
    assert WarmupCosine(total_steps=10, warmup_steps=0)(10) == 0.0
    assert WarmupCosine(total_steps=10, warmup_steps=0, min_ratio=0.1)(10) == pytest.approx(0.1)


def test_lr_scheduler_on_steps_takes_the_configured_decay() -> None:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    config = ScheduleConfig(warmup_fraction=0.0, warmup_epochs=0.0, decay="linear")
    sched = lr_scheduler(opt, config, lr=1.0, total_steps=10, epochs=1)
    for _ in range(3):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.7)  # a cosine: 0.794 here


def test_a_halved_warmup_is_a_whole_number_of_steps() -> None:
    """11 steps with a warm-up at least as long: 5 steps of warm-up, the peak at the sixth."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = lr_scheduler(opt, ScheduleConfig(warmup_epochs=3.0), lr=1.0, total_steps=11, epochs=2)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:6] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])


def test_an_unknown_decay_is_refused_word_for_word() -> None:
    with pytest.raises(ValueError) as error:
        ScheduleConfig(decay="step")
    assert str(error.value) == (
        "decay='step' is not a schedule shape: use one of ('cosine', 'linear') "
        "(cosine is the default; linear decays to min_lr in a straight line)."
    )


def _step_schedule(total: int, min_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    schedule = WarmupCosine(total_steps=total, warmup_steps=2, min_ratio=min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def test_a_resumed_schedule_that_ended_with_more_steps_planned_is_refused_at_lr_zero() -> None:
    with pytest.raises(ValueError) as refused:
        check_resumed_schedule(_step_schedule(10), planned_steps=15, step=10, ckpt="a.ckpt")
    assert str(refused.value) == (
        "the checkpoint's learning-rate schedule ended at step 10 (the max_epochs it was trained "
        "with); resumed at step 10, the 5 more steps of this fit would train at learning rate 0 "
        "and change nothing. To train these weights further, start a new run from them with a "
        "schedule of its own: --model.init_from a.ckpt instead of --ckpt_path."
    )
    # the same length, or a resume before the end: the fit goes on as saved
    check_resumed_schedule(_step_schedule(10), planned_steps=10, step=10, ckpt="a.ckpt")


def test_a_resumed_schedule_shorter_than_the_fit_is_said_where_training_goes_on(caplog) -> None:
    caplog.set_level("WARNING", logger="vit.train.schedule")
    # before its end, or at a floor above 0: the extra steps train, at min_lr; the log says so
    check_resumed_schedule(_step_schedule(10), planned_steps=15, step=4, ckpt="a.ckpt")
    check_resumed_schedule(_step_schedule(10, 0.1), planned_steps=15, step=10, ckpt="a.ckpt")
    said = [r.getMessage() for r in caplog.records]
    assert said == 2 * [
        "the resumed learning-rate schedule ends at step 10 (the checkpoint's max_epochs), not at "
        "this fit's 15: the steps after it train at min_lr. --model.init_from a.ckpt instead of "
        "--ckpt_path starts a new run from the weights with a schedule of its own."
    ]


def test_a_time_budget_or_a_users_own_schedule_is_not_checked_on_resume() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    on_time = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 0.0)  # a TimeBudget's
    check_resumed_schedule(on_time, planned_steps=100, step=50, ckpt="a.ckpt")  # no error
    own = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5)  # no lr_lambdas at all
    check_resumed_schedule(own, planned_steps=100, step=50, ckpt="a.ckpt")  # no error
