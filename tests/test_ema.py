"""EMA of the weights: the average it keeps, what validation and checkpoints see, bad settings."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from tests.helpers import quiet_trainer, random_loader, sum_tol, tiny_classifier
from vit.io.checkpoint import load_checkpoint
from vit.io.load import load_model
from vit.train.callbacks.ema import EMA
from vit.train.module import ViTClassifier


def _weights(module: L.LightningModule) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


class Record(L.Callback):
    """The live weights after every optimizer step, and the weights validation runs with."""

    def __init__(self) -> None:
        self.steps: list[list[torch.Tensor]] = []
        self.validated: list[tuple[int, list[torch.Tensor]]] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.steps.append(_weights(pl_module))

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.validated.append((len(self.steps), _weights(pl_module)))


def _assert_average(got: torch.Tensor, want: torch.Tensor, decay: float) -> None:
    """The EMA's lerp against d e + (1 - d) w: each update rounds each way a few times (4 eps of
    the weights' size); earlier updates' errors shrink by d each, so they add up to 1 / (1 - d)."""
    tol = sum_tol(torch.float32, 4, want.abs().max()) / (1 - decay)
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


def _expected_ema(
    steps: list[list[torch.Tensor]], decay: float, cap: float = 1.0
) -> list[list[torch.Tensor]]:
    """The average after each step, computed by hand: a copy first, then the warmed-up decay
    (at most `cap`)."""
    ema, out = [w.clone() for w in steps[0]], []
    out.append([w.clone() for w in ema])
    for n, weights in enumerate(steps[1:], start=1):
        d = min(decay, (1 + n) / (10 + n), cap)
        ema = [d * e + (1 - d) * w for e, w in zip(ema, weights, strict=True)]
        out.append([w.clone() for w in ema])
    return out


def test_ema_is_the_warmed_up_average_and_validation_and_checkpoints_use_it(tmp_path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    decay = 0.8  # below the warm-up's (1 + n) / (10 + n) from n = 36 on: both regimes are seen
    module = tiny_classifier(optimizer={"lr": 3e-3}, schedule={"warmup_epochs": 0.0})
    record = Record()
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=10,  # 4 steps an epoch: 40 steps, a validation after each epoch
        callbacks=[EMA(decay=decay), record, ckpt],
        enable_checkpointing=True,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, random_loader(64), random_loader(16, seed=1))
    expected = _expected_ema(record.steps, decay)
    assert len(record.steps) == 40
    for step, seen in record.validated:  # validation scored the average, not the live weights
        for got, want in zip(seen, expected[step - 1], strict=True):
            _assert_average(got, want, decay)
        live = record.steps[step - 1]
        assert not all(torch.equal(a, b) for a, b in zip(seen, live, strict=True))
    for got, want in zip(_weights(module), expected[-1], strict=True):  # after fit: the average
        _assert_average(got, want, decay)
    # the checkpoint's state_dict is the average (what evaluate loads); the live weights beside it
    saved = load_checkpoint(tmp_path / "last.ckpt")
    names = [n for n, _ in module.named_parameters()]
    for name, want, live in zip(names, expected[-1], record.steps[-1], strict=True):
        _assert_average(saved["state_dict"][name], want, decay)
        assert torch.equal(saved["current_model_state"][name], live)  # a copy
    model, _ = load_model(tmp_path / "last.ckpt")
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(model.eval()(x), module.model.eval()(x))  # the same weights and kernels
    # a test after fit (what --test_after_fit does) scores the checkpoint's average too
    module.model.head.weight.data.zero_()
    trainer.test(module, random_loader(16, seed=1), ckpt_path=tmp_path / "last.ckpt")
    for got, want in zip(_weights(module), expected[-1], strict=True):
        _assert_average(got, want, decay)


def test_resume_continues_the_live_weights_and_the_average(tmp_path) -> None:
    """Stopping after 2 epochs and resuming for 2 more gives the same average as 4 in one go
    (a constant learning rate: the schedule of a 2-epoch run would differ)."""

    def fit(epochs: int, root, ckpt_path=None) -> ViTClassifier:
        from lightning.pytorch.callbacks import ModelCheckpoint

        torch.manual_seed(0)
        module = tiny_classifier(
            optimizer={"lr": 3e-3}, schedule={"min_lr": 3e-3, "warmup_epochs": 0.0}
        )
        trainer = quiet_trainer(
            root,
            max_epochs=epochs,
            callbacks=[EMA(decay=0.9), ModelCheckpoint(dirpath=root, save_last=True)],
            enable_checkpointing=True,
            num_sanity_val_steps=0,
        )
        trainer.fit(module, random_loader(64), ckpt_path=ckpt_path)
        return module

    whole = fit(4, tmp_path / "whole")
    fit(2, tmp_path / "part")
    resumed = fit(4, tmp_path / "part", ckpt_path=tmp_path / "part" / "last.ckpt")
    for a, b in zip(_weights(whole), _weights(resumed), strict=True):
        assert torch.equal(a, b)  # a resume: the same steps on the same kernels, bit for bit


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5, 1.5])
def test_ema_decay_outside_zero_one_is_refused(decay: float) -> None:
    with pytest.raises(ValueError, match=r"EMA decay=.* must be in \(0, 1\)"):
        EMA(decay=decay)


def test_ema_default_decay_is_the_documented_0_999() -> None:
    assert EMA().decay == 0.999
    assert EMA().fit_fraction is None  # a window of steps only, unless asked


def test_fit_fraction_caps_the_window_at_that_share_of_the_planned_steps(tmp_path) -> None:
    """40 planned steps and fit_fraction 0.1: a 4-step window (decay at most 0.75) from the step
    where the warm-up would pass it, though decay 0.99 alone would average over 100."""
    module = tiny_classifier(optimizer={"lr": 3e-3}, schedule={"warmup_epochs": 0.0})
    record = Record()
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=10,  # 4 steps an epoch
        callbacks=[EMA(decay=0.99, fit_fraction=0.1), record],
        num_sanity_val_steps=0,
    )
    trainer.fit(module, random_loader(64), random_loader(16, seed=1))
    assert len(record.steps) == 40
    expected = _expected_ema(record.steps, 0.99, cap=0.75)
    uncapped = _expected_ema(record.steps, 0.99)
    for got, want, other in zip(_weights(module), expected[-1], uncapped[-1], strict=True):
        _assert_average(got, want, 0.75)
        assert not torch.allclose(got, other)  # the cap made a difference a test can see


def test_a_window_under_one_step_keeps_the_live_weights(tmp_path) -> None:
    """fit_fraction x planned steps under one step (0.02 of 40): the cap allows no averaging, so
    after the fit the average is the last step's live weights, where decay 0.99 would lag."""
    module = tiny_classifier(optimizer={"lr": 3e-3}, schedule={"warmup_epochs": 0.0})
    record = Record()
    trainer = quiet_trainer(
        tmp_path, max_epochs=10, callbacks=[EMA(decay=0.99, fit_fraction=0.02), record]
    )
    trainer.fit(module, random_loader(64))
    assert len(record.steps) == 40
    last, before = record.steps[-1], record.steps[-2]
    assert not any(torch.equal(a, b) for a, b in zip(last, before, strict=True))  # still moving
    for got, want in zip(_weights(module), last, strict=True):
        _assert_average(got, want, 0.0)


def test_under_a_time_budget_the_window_follows_the_projected_steps(tmp_path) -> None:
    """cpu60.yaml's pairing: under a TimeBudget (a clock a second later at each read) the first
    update has no projection yet and keeps no cap; from the second on, 0.02 of the projected
    10-40 steps is under one step, so the average ends on the last step's live weights."""
    from tests.helpers import BUDGET_SCHEDULE, budget

    clock = budget(minutes=1.0, tick=1.0)
    module = tiny_classifier(schedule=BUDGET_SCHEDULE)
    record = Record()
    trainer = quiet_trainer(
        tmp_path, max_epochs=1000, callbacks=[clock, EMA(decay=0.99, fit_fraction=0.02), record]
    )
    trainer.fit(module, random_loader(64))
    assert 10 <= len(record.steps) <= 40 and clock.fraction() == 1.0
    for got, want in zip(_weights(module), record.steps[-1], strict=True):
        _assert_average(got, want, 0.0)


def test_expected_steps_project_the_budget_from_the_time_used() -> None:
    """Under a TimeBudget: the steps made before the current one over the share of time they
    took; none before a step and some time; without one, the planned steps."""
    from types import SimpleNamespace

    from vit.train.callbacks.budget import TimeBudget, expected_steps

    budget = TimeBudget(minutes=60.0)
    trainer = SimpleNamespace(callbacks=[budget], global_step=101, estimated_stepping_batches=7)
    budget.progress = 0.25  # read as step 101 began, after 100 steps
    assert expected_steps(trainer) == 400.0
    budget.progress = 0.0
    assert expected_steps(trainer) is None
    budget.progress, trainer.global_step = 0.25, 1
    assert expected_steps(trainer) is None
    budget.progress, trainer.global_step = 0.5, 2  # one step made: already a projection
    assert expected_steps(trainer) == 2.0
    trainer.callbacks = []
    assert expected_steps(trainer) == 7.0


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_ema_fit_fraction_outside_zero_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match=r"EMA fit_fraction=.* must be in \(0, 1\]"):
        EMA(fit_fraction=fraction)


def test_ema_fit_fraction_one_the_whole_fit_is_accepted() -> None:
    assert EMA(fit_fraction=1.0).fit_fraction == 1.0


def test_with_gradient_accumulation_the_average_updates_once_per_optimizer_step(tmp_path) -> None:
    """Two batches per optimizer step: the average is taken of the weights after each step
    (a copy, then d = 2/11), never of the untouched weights between the two batches."""
    record = Record()
    module = tiny_classifier(optimizer={"lr": 3e-3}, schedule={"warmup_epochs": 0.0})
    start = _weights(module)
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=1,  # 4 batches: 2 optimizer steps
        accumulate_grad_batches=2,
        callbacks=[EMA(decay=0.5), record],
    )
    trainer.fit(module, random_loader(64))
    assert trainer.global_step == 2
    after_steps = record.steps[1::2]  # the weights after each step's second batch
    assert not any(torch.equal(a, b) for a, b in zip(after_steps[0], start, strict=True))
    expected = _expected_ema(after_steps, decay=0.5)[-1]
    for got, want in zip(_weights(module), expected, strict=True):  # after fit: the average
        _assert_average(got, want, 0.5)
    path = tmp_path / "accumulated.ckpt"
    trainer.save_checkpoint(path)
    assert int(load_checkpoint(path)["averaging_state"]["n_averaged"]) == 2


def test_ema_from_the_command_line_as_the_readme_shows(image_tree: Path, tmp_path: Path) -> None:
    """`--trainer.callbacks+=vit.train.callbacks.EMA --trainer.callbacks.decay 0.99` appends EMA to
    the config's callbacks: the checkpoint holds the average, the live weights beside it."""
    from tests.helpers import train_args
    from vit.commands.train import train_main

    runs = tmp_path / "runs"
    extra = ("--trainer.callbacks+=vit.train.callbacks.EMA", "--trainer.callbacks.decay=0.99")
    train_main(train_args(image_tree, runs, *extra))
    ckpt = load_checkpoint(runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt")
    assert "current_model_state" in ckpt and "averaging_state" in ckpt
    averaged = ckpt["averaging_state"]["n_averaged"]
    assert int(averaged) == ckpt["global_step"]  # one update per optimizer step
    live, saved = ckpt["current_model_state"], ckpt["state_dict"]
    assert not torch.equal(live["model.head.weight"], saved["model.head.weight"])
    # vit-evaluate scores the average by default and the live weights on request, in its own files
    from vit.commands.evaluate import run_evaluate

    out = tmp_path / "eval"
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    average = run_evaluate([str(last), "--output-dir", str(out)])
    live_result = run_evaluate([str(last), "--weights", "live", "--output-dir", str(out)])
    assert (average["weights"], live_result["weights"]) == ("average", "live")
    assert {p.name for p in out.glob("metrics_*.json")} == {
        "metrics_test.json",
        "metrics_test_live.json",
    }
    live_model, _ = load_model(last, weights="live")
    average_model, _ = load_model(last)
    # loading copies the weights: bit for bit
    assert torch.equal(
        live_model.head.weight, live["model.head.weight"].to(live_model.head.weight.dtype)
    )
    assert torch.equal(average_model.head.weight, saved["model.head.weight"])


def test_asking_a_checkpoint_without_ema_for_its_average_is_an_error(tiny_checkpoint) -> None:
    model, _ = load_model(tiny_checkpoint, weights="live")  # live weights: its state_dict
    same, _ = load_model(tiny_checkpoint)
    assert torch.equal(model.head.weight, same.head.weight)  # the same tensors, loaded twice
    with pytest.raises(ValueError, match="trained without vit.train.callbacks.EMA"):
        load_model(tiny_checkpoint, weights="average")
    with pytest.raises(ValueError, match="expected 'average', 'live' or None"):
        load_model(tiny_checkpoint, weights="ema")


def test_the_update_reads_nothing_back_from_the_device(tmp_path) -> None:
    """After its first update (which reads the count once: 0, or a resumed fit's), the EMA's
    update dispatches no host read (item, is_nonzero): on a GPU each would wait for the queue."""
    from torch.optim.swa_utils import AveragedModel
    from torch.profiler import ProfilerActivity, profile

    module = tiny_classifier()
    ema = EMA(decay=0.99)
    ema._average_model = AveragedModel(module, multi_avg_fn=ema._update, use_buffers=True)
    ema.update_average(module)  # the first: a copy, and the one read of the count
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ema.update_average(module)
        ema.update_average(module)
    names = {e.name for e in prof.events()}
    assert not names & {"aten::item", "aten::is_nonzero", "aten::_local_scalar_dense"}
    assert int(ema._average_model.n_averaged) == 3
    # the warm-up rule with n = 1, then n = 2: d = 2/11, then 3/12 of the way kept
    first = next(iter(ema._average_model.module.parameters()))
    live = next(iter(module.parameters()))
    # two lerps of weights up to |live|, a few roundings each, and the subtraction
    tol = sum_tol(torch.float32, 2 * 3 + 1, live.detach().abs().max())
    expected = torch.full_like(live, (2 / 11) * (3 / 12))
    torch.testing.assert_close(live - first, expected, rtol=0, atol=tol)
