"""Training behaviour that cuts across the steps (vit/train/callbacks/): the wall-clock budget, the
resolution and patch-drop curricula, and the finite-loss guard."""

from __future__ import annotations

import re
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import (
    BUDGET_SCHEDULE,
    budget,
    quiet_trainer,
    random_loader,
    tiny_classifier,
)
from vit.train.callbacks.budget import TimeBudget, fit_progress
from vit.train.callbacks.checkpointing import FiniteLoss
from vit.train.callbacks.curricula import MixSchedule, PatchDropSchedule, ResolutionSchedule

MIX_EXAMPLE = "e.g. [[0, 0.5], [0.85, 0]]: half the batches mixed until 85% of training, then none"
RESOLUTION_EXAMPLE = (
    "e.g. [[0, 16], [0.3, 24], [0.55, 32]]: 16x16 images for the first 30% of training, "
    "24x24 until 55%, then 32x32"
)
DROP_EXAMPLE = (
    "e.g. [[0, 0], [0.5, 0.5], [0.85, 0]]: every patch token until 50% of training, half of "
    "them (drawn per image) until 85%, then every token again"
)


class RecordLR(L.Callback):
    """The learning rate each training step runs with."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path) -> None:
    module = tiny_classifier()
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=2)
    trainer = quiet_trainer(tmp_path, max_epochs=3, callbacks=[ckpt], enable_checkpointing=True)
    trainer.fit(module, random_loader())  # 4 steps per epoch, a checkpoint every 2
    good = (tmp_path / "last.ckpt").read_bytes()
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    bad = torch.randn(16, 3, 32, 32)
    bad[0, 0, 0, 0] = float("nan")
    trainer = quiet_trainer(
        tmp_path, max_epochs=4, callbacks=[ckpt, FiniteLoss()], enable_checkpointing=True
    )
    with pytest.raises(FloatingPointError, match=r"loss is nan at step 12 \(epoch 3\)"):
        trainer.fit(
            module,
            DataLoader(TensorDataset(bad, torch.zeros(16, dtype=torch.long)), batch_size=16),
            ckpt_path=tmp_path / "last.ckpt",
        )
    assert (tmp_path / "last.ckpt").read_bytes() == good
    # stopped before the backward pass: the weights are the resumed ones, not NaN
    assert all(torch.equal(module.model.state_dict()[k], v) for k, v in before.items())


@pytest.mark.parametrize(
    "stages", [[[0.1, 16], [0.5, 32]], [[0, 16], [0, 32]], [[0, 16], [1.0, 32]]]
)
def test_bad_resolution_schedules_fail_clearly(stages: list) -> None:
    message = (
        f"ResolutionSchedule stages={stages!r}: the fractions must start at 0, rise, and stay "
        f"below 1; {RESOLUTION_EXAMPLE}"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ResolutionSchedule(stages=stages)
    message = (
        f"ResolutionSchedule stages=[[0]] must be a list of [fraction, side]; {RESOLUTION_EXAMPLE}"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ResolutionSchedule(stages=[[0]])


def test_resolution_side_must_be_whole_patches(tmp_path) -> None:
    trainer = quiet_trainer(
        tmp_path, max_epochs=1, callbacks=[ResolutionSchedule(stages=[[0, 12], [0.5, 32]])]
    )
    with pytest.raises(ValueError, match="side 12 is not a positive multiple of the patch size 8"):
        trainer.fit(tiny_classifier(), random_loader(32))


def test_resolution_curriculum_trains_on_smaller_images_then_full_size(tmp_path) -> None:
    module = tiny_classifier(optimizer={"fused": True})
    seen: list[tuple[bool, int]] = []
    module.model.patch_embed.register_forward_pre_hook(
        lambda m, args: seen.append((m.training, args[0].shape[-1]))
    )
    curriculum = ResolutionSchedule(stages=[[0, 16], [0.3, 24], [0.6, 32]])
    trainer = quiet_trainer(tmp_path, max_epochs=3, num_sanity_val_steps=0, callbacks=[curriculum])
    trainer.fit(module, random_loader(32), random_loader(16))
    train_sides = [side for training, side in seen if training]
    # 6 steps: progress 0, 1/6 -> 16; 2/6, 3/6 -> 24; 4/6, 5/6 -> 32
    assert train_sides == [16, 16, 24, 24, 32, 32]
    assert {side for training, side in seen if not training} == {32}  # validation: full size
    assert trainer.optimizers[0].defaults["fused"] is True
    assert module.train_side is None  # after the fit: nothing left that resizes


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        (
            [[0.2, 0.5]],
            "PatchDropSchedule stages=[[0.2, 0.5]]: the fractions must start at 0, rise, and stay "
            f"below 1; {DROP_EXAMPLE}",
        ),
        (
            [[0, 1.0]],
            "PatchDropSchedule rate 1.0 must be in [0, 1): the fraction of patch tokens dropped; "
            f"{DROP_EXAMPLE}",
        ),
        (
            [[0, "half"]],
            f"PatchDropSchedule stages=[[0, 'half']] must be a list of [fraction, rate]; {DROP_EXAMPLE}",
        ),
    ],
)
def test_bad_patch_drop_schedules_fail_clearly(stages: list, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        PatchDropSchedule(stages=stages)


def test_patch_drop_schedule_and_a_constant_rate_are_not_both_set(tmp_path) -> None:
    module = tiny_classifier(network={"patch_drop_rate": 0.5})
    trainer = quiet_trainer(
        tmp_path, max_epochs=1, callbacks=[PatchDropSchedule(stages=[[0, 0.5]])]
    )
    message = (
        "model.network.patch_drop_rate=0.5 and PatchDropSchedule both set the patch-drop rate: "
        "use one (a constant rate is the stages [[0, rate]])."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        trainer.fit(module, random_loader(32))


def test_patch_drop_setup_reads_the_plain_stage_names(monkeypatch) -> None:
    """Lightning passes setup a TrainerFn, which equals "fit" in any case; a loop of one's own
    passes Callback.setup's documented plain string, and gets the same check and plan."""
    drop = PatchDropSchedule(stages=[[0, 0.0], [0.5, 0.25]])
    constant = tiny_classifier(network={"patch_drop_rate": 0.5})
    message = (
        "model.network.patch_drop_rate=0.5 and PatchDropSchedule both set the patch-drop rate: "
        "use one (a constant rate is the stages [[0, rate]])."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        drop.setup(None, constant, "fit")
    drop.setup(None, constant, "validate")  # evaluation drops nothing: no conflict
    module, planned = tiny_classifier(), []
    monkeypatch.setattr(module, "plan_patch_drops", planned.append)
    drop.setup(None, module, "test")
    drop.setup(None, module, "fit")
    assert planned == [[(0.0, 0.0), (0.5, 0.25)]]


def test_patch_drop_stages_are_compiled_before_a_compiled_fit(tmp_path, monkeypatch) -> None:
    """With torch_compile, the fit's start compiles every patch-drop rate of the schedule, so
    that no stage compiles mid-training (the compiles are faked: only their plan is checked)."""
    module = tiny_classifier(torch_compile=True)
    monkeypatch.setattr(module.model, "compile", lambda **kwargs: None)
    monkeypatch.setattr("vit.train.module.check_cpp_compiler", lambda: None)
    planned: list[list] = []
    monkeypatch.setattr(
        "vit.train.module.compile_for_fit",
        lambda module, *, sides, drop_rates: planned.append(list(drop_rates)),
    )
    drop = PatchDropSchedule(stages=[[0, 0.0], [0.5, 0.25]])
    quiet_trainer(tmp_path, max_epochs=1, max_steps=1, callbacks=[drop]).fit(
        module, random_loader(16)
    )
    assert planned == [[(0.0, 0.0), (0.5, 0.25)]]


def test_patch_drop_schedule_cuts_training_tokens_by_stage_and_never_evaluation(tmp_path) -> None:
    assert tiny_classifier(network={"patch_drop_rate": 0.25}).model.patch_drop_rate == 0.25
    module = tiny_classifier()
    seen: list[tuple[bool, int]] = []
    module.model.blocks[0].register_forward_pre_hook(
        lambda m, args: seen.append((m.training, args[0].shape[1]))
    )
    drop = PatchDropSchedule(stages=[[0, 0.0], [0.3, 0.5], [0.6, 0.75]])
    trainer = quiet_trainer(tmp_path, max_epochs=3, num_sanity_val_steps=0, callbacks=[drop])
    trainer.fit(module, random_loader(32), random_loader(16))
    # 16 patches + CLS; 6 steps: progress 0, 1/6 -> all; 2/6, 3/6 -> 8 kept; 4/6, 5/6 -> 4 kept
    assert [n for training, n in seen if training] == [17, 17, 9, 9, 5, 5]
    assert {n for training, n in seen if not training} == {17}  # validation: every token


def test_time_budget_anneals_to_zero_and_stops_when_the_time_is_up(tmp_path) -> None:
    module = tiny_classifier(schedule=BUDGET_SCHEDULE)
    clock = budget(tick=1.0)  # each read is a second later: a few seconds per step
    sides: list[int] = []
    module.model.patch_embed.register_forward_pre_hook(
        lambda m, args: sides.append(args[0].shape[-1]) if m.training else None
    )
    record = RecordLR()
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=1000,  # an upper bound: the budget ends training
        num_sanity_val_steps=0,
        val_check_interval="01:00:00:00",  # only the last validation, the one the stop triggers
        callbacks=[record, clock, ResolutionSchedule(stages=[[0, 16], [0.5, 32]])],
    )
    trainer.fit(module, random_loader(32), random_loader(16))
    assert trainer.current_epoch < 999 and 10 <= trainer.global_step <= 40
    assert clock.fraction() == 1.0 and clock.elapsed_s() >= 60.0
    assert clock.state_dict()["off_clock_s"] == 0.0  # eager: every second is on the clock
    lrs = record.lrs
    assert max(lrs) == pytest.approx(1e-3, rel=0.1) and lrs[-1] < 1e-4  # warmed up, annealed
    assert trainer.optimizers[0].param_groups[0]["lr"] < 1e-6  # at zero when the time is up
    assert "val/acc" in trainer.callback_metrics  # the stop ran a final validation
    assert sides[0] == 16 and sides[-1] == 32


def test_time_budget_with_linear_decay_steps_the_lr_down_evenly(tmp_path) -> None:
    module = tiny_classifier(schedule={**BUDGET_SCHEDULE, "decay": "linear"})
    record = RecordLR()
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=1000,
        num_sanity_val_steps=0,
        val_check_interval="01:00:00:00",
        callbacks=[record, budget(tick=0.5)],  # the same time per step: the same fall per step
    )
    trainer.fit(module, random_loader(32), random_loader(16))
    lrs = record.lrs
    peak = lrs.index(max(lrs))
    falls = [a - b for a, b in zip(lrs[peak:-1], lrs[peak + 1 :], strict=True)]
    assert len(falls) >= 15 and max(lrs) == pytest.approx(1e-3, rel=0.1)
    assert max(falls) - min(falls) < 0.1 * max(falls)  # a straight line (a cosine's vary 0-2x)
    assert lrs[-1] < 1.5 * max(falls)  # the last step ran at most one fall above zero


def test_time_budget_compiles_do_not_spend_the_warmup(tmp_path, monkeypatch) -> None:
    """With torch_compile, the first training step and the first validation of a fit (where it
    compiles: here 20 s and 10 s of a 60 s budget, faked) count toward the budget but not toward
    the schedule: the warm-up still ramps over the training steps around them."""
    module = tiny_classifier(
        schedule={"warmup_epochs": 0.0, "warmup_fraction": 0.3}, torch_compile=True
    )
    monkeypatch.setattr(module.model, "compile", lambda **kwargs: None)  # the compile's time: faked
    monkeypatch.setattr("vit.train.module.check_cpp_compiler", lambda: None)
    clock = budget(tick=0.5)
    compiled: set[bool] = set()

    def compile_once(m, args) -> None:
        if m.training not in compiled:  # the first training forward, the first eval forward
            compiled.add(m.training)
            clock.clock.now += 20.0 if m.training else 10.0

    module.model.register_forward_pre_hook(compile_once)
    record = RecordLR()
    trainer = quiet_trainer(
        tmp_path, max_epochs=1000, num_sanity_val_steps=0, callbacks=[record, clock]
    )
    trainer.fit(module, random_loader(64), random_loader(16))  # 4 steps, then validation
    lrs = record.lrs
    # the warm-up (30% of the ~30 s left) spans the first validation, rising
    assert lrs[1] < 0.2e-3 and all(a < b for a, b in zip(lrs[1:6], lrs[2:7], strict=True))
    off_clock = clock.state_dict()["off_clock_s"]
    assert 30.0 <= off_clock < 34.0
    assert max(lrs) == pytest.approx(1e-3, rel=0.05) and clock.fraction() == 1.0
    assert 60.0 <= clock.elapsed_s() < 66.0  # the stop: the whole budget, compiles included
    assert trainer.optimizers[0].param_groups[0]["lr"] < 1e-5  # and the lr ~zero there
    saved = clock.state_dict()
    resumed = TimeBudget(minutes=1.0)
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == saved  # a resume keeps the time used and the spans off it


def test_time_budget_refuses_validation_every_other_epoch(tmp_path) -> None:
    module = tiny_classifier(schedule={"warmup_epochs": 0.0, "warmup_fraction": 0.0})
    trainer = quiet_trainer(tmp_path, max_epochs=5, check_val_every_n_epoch=2, callbacks=[budget()])
    with pytest.raises(
        ValueError, match="check_val_every_n_epoch=2 with vit.train.callbacks.TimeBudget"
    ):
        trainer.fit(module, random_loader(32), random_loader(16))


def test_time_budget_needs_a_warmup_fraction_and_positive_minutes(tmp_path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=5, callbacks=[budget()])
    with pytest.raises(ValueError, match="set model.schedule.warmup_fraction"):
        trainer.fit(tiny_classifier(schedule={"warmup_epochs": 2.0}), random_loader(32))
    with pytest.raises(ValueError, match="minutes=0 must be positive"):
        TimeBudget(minutes=0)


def test_mix_schedule_mixes_by_stage_then_stops(tmp_path, monkeypatch) -> None:
    """[[0, 1], [0.5, 0]]: every batch mixed for the first half of training, none after."""
    import vit.train.module

    probs: list[float] = []
    real = vit.train.module.mix_batch
    monkeypatch.setattr(
        vit.train.module, "mix_batch", lambda *a, **kw: probs.append(kw["prob"]) or real(*a, **kw)
    )
    module = tiny_classifier(mixup_alpha=0.8, cutmix_alpha=1.0)
    mix = MixSchedule(stages=[[0, 1.0], [0.5, 0.0]])
    trainer = quiet_trainer(tmp_path, max_epochs=3, num_sanity_val_steps=0, callbacks=[mix])
    trainer.fit(module, random_loader(32))
    assert probs == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # 6 steps: progress 0..5/6


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([[0, 1.5]], f"MixSchedule share 1.5 must be in [0, 1]; {MIX_EXAMPLE}"),
        (
            [[0.2, 0.5]],
            "MixSchedule stages=[[0.2, 0.5]]: the fractions must start at 0, rise, and stay "
            f"below 1; {MIX_EXAMPLE}",
        ),
        (
            [[0, "half"]],
            f"MixSchedule stages=[[0, 'half']] must be a list of [fraction, share]; {MIX_EXAMPLE}",
        ),
    ],
)
def test_bad_mix_schedules_fail_clearly(stages: list, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        MixSchedule(stages=stages)


def test_mix_schedule_needs_a_model_that_mixes(tmp_path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[MixSchedule(stages=[[0, 0.5]])])
    message = (
        "MixSchedule sets the share of batches mixed, but the model mixes none: set "
        "model.mixup_alpha or model.cutmix_alpha > 0 (0.8 and 1.0 are DeiT's)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        trainer.fit(tiny_classifier(), random_loader(32))


def test_time_budget_counts_the_fit_start_compiles_off_the_schedule(tmp_path, monkeypatch) -> None:
    """The curricula's shapes compile at fit start (faked here: 15 s): before training, yet on
    the budget, and off the schedule's clock like the first step's compile."""
    module = tiny_classifier(
        schedule={"warmup_epochs": 0.0, "warmup_fraction": 0.3}, torch_compile=True
    )
    monkeypatch.setattr(module.model, "compile", lambda **kwargs: None)
    monkeypatch.setattr("vit.train.module.check_cpp_compiler", lambda: None)
    clock = budget(tick=0.0)

    def warm_up(*args, **kwargs) -> None:
        clock.clock.now += 15.0

    monkeypatch.setattr("vit.train.module.compile_for_fit", warm_up)
    trainer = quiet_trainer(tmp_path, max_epochs=1, max_steps=2, callbacks=[clock])
    trainer.fit(module, random_loader(64))
    state = clock.state_dict()
    assert state["elapsed_s"] == pytest.approx(15.0) and state["off_clock_s"] == pytest.approx(15.0)


def test_time_budget_needs_a_module_that_can_run_its_schedule(tmp_path) -> None:
    class Plain(L.LightningModule):  # trains, but has no schedule_on() nor compiles_in_fit
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3 * 32 * 32, 10)

        def training_step(self, batch, batch_idx) -> torch.Tensor:
            return self.layer(batch[0].flatten(1)).logsumexp(1).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    message = (
        "TimeBudget needs a LightningModule with schedule_on() and compiles_in_fit, as "
        "vit.train.module.ViTClassifier has; Plain has not."
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[budget()]).fit(Plain(), random_loader(32))


def test_time_budget_reads_its_fraction_outside_a_fit_and_from_older_checkpoints() -> None:
    fresh = TimeBudget(minutes=2.0)
    assert fresh.fraction() == 0.0
    assert fresh.state_dict() == {"elapsed_s": 0.0, "off_clock_s": 0.0}
    older = TimeBudget(minutes=2.0)
    older.load_state_dict({})  # a state saved before the budget kept these: nothing used yet
    assert older.state_dict() == {"elapsed_s": 0.0, "off_clock_s": 0.0}
    older.load_state_dict({"elapsed_s": 60.0})  # before spans off the clock were kept
    assert older.state_dict() == {"elapsed_s": 60.0, "off_clock_s": 0.0}
    assert older.fraction() == 0.5
    # a budget spent compiling to its end: used up, not 0 / 0 of the schedule's clock
    compiled = TimeBudget(minutes=1.0)
    compiled.load_state_dict({"elapsed_s": 60.0, "off_clock_s": 60.0})
    assert compiled.fraction() == 1.0


def test_under_ddp_every_rank_runs_on_rank_zeros_time() -> None:
    """Each rank's clock differs a little; the stop and the schedule follow rank 0's, so that
    every rank stops at the same step."""

    class TwoRanks:  # a strategy's broadcast, as rank 1 of two sees it
        def broadcast(self, obj: float, src: int = 0) -> float:
            return {0: 30.0, 1: obj}[src]

    callback = TimeBudget(minutes=1.0)
    callback.load_state_dict({"elapsed_s": 45.0})  # this rank's own time
    callback.setup(SimpleNamespace(strategy=TwoRanks()), tiny_classifier(), "validate")
    assert callback.fraction() == 0.5


def test_time_budget_runs_the_schedule_during_its_fit_only(tmp_path) -> None:
    """Without a warm-up the budget's first step runs at the peak; once the fit is over the
    module's schedule is on the steps again, for a later fit without a budget."""
    module = tiny_classifier(schedule={"warmup_epochs": 0.0, "warmup_fraction": 0.0})
    timed = RecordLR()
    trainer = quiet_trainer(
        tmp_path, max_epochs=1000, num_sanity_val_steps=0, callbacks=[timed, budget(tick=20.0)]
    )
    trainer.fit(module, random_loader(32))
    assert timed.lrs[0] == pytest.approx(1e-3) and len(timed.lrs) < 5
    stepped = RecordLR()
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[stepped]).fit(module, random_loader(64))
    # 4 steps of a cosine from 1e-3 to 0: step k at (1 + cos(pi k / 4)) / 2
    assert stepped.lrs == pytest.approx([1e-3, 0.853553e-3, 0.5e-3, 0.146447e-3], rel=1e-5)


def test_an_eager_budget_starts_with_training_not_with_the_sanity_check(tmp_path) -> None:
    clock = budget(tick=0.0)

    class Took(L.Callback):  # the sanity check takes 30 s, each training step 10 s
        def on_sanity_check_end(self, *args) -> None:
            clock.clock.now += 30.0

        def on_train_batch_end(self, *args) -> None:
            clock.clock.now += 10.0

    trainer = quiet_trainer(
        tmp_path, max_epochs=1, num_sanity_val_steps=1, callbacks=[Took(), clock]
    )
    trainer.fit(tiny_classifier(schedule=BUDGET_SCHEDULE), random_loader(32), random_loader(16))
    assert trainer.global_step == 2 and clock.elapsed_s() == 20.0


def test_without_a_budget_progress_is_the_share_of_planned_steps_capped_at_one() -> None:
    """fit_progress is global_step / planned steps, in [0, 1]: 1 at the last planned step of a
    one-step fit, and still 1 past the plan (a resume with a shorter max_steps)."""

    def trainer(step: int, planned: int) -> SimpleNamespace:
        return SimpleNamespace(callbacks=[], global_step=step, estimated_stepping_batches=planned)

    assert fit_progress(trainer(1, 1)) == 1.0
    assert fit_progress(trainer(1, 4)) == 0.25
    assert fit_progress(trainer(3, 2)) == 1.0
    assert fit_progress(trainer(0, 0)) == 0.0  # nothing planned: no division by zero
