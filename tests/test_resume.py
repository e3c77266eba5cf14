"""A run SIGKILLed mid-epoch resumes with --ckpt_path last and ends exactly like an uninterrupted
one, its metrics history whole; a finished run resumed for more epochs is refused (its schedule
has ended); SIGTERM saves last.ckpt at the step under way and exits 143, a first Ctrl-C too
(130), a second stops at once; a failed save leaves the previous last.ckpt; last.ckpt is written
by step and epoch."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import REPO, quiet_trainer, random_loader, tiny_classifier
from vit.commands.float32_overrides import without_compile
from vit.commands.train import train_main
from vit.io.checkpoint import load_checkpoint

CPU60 = REPO / "experiments" / "cpu60.yaml"
# the recipe's model at a test's size: every feature on (SPT, LSA, the 2-D position start,
# stochastic depth), only the width, depth and patch shrunk
TINY_NETWORK = dict(embed_dim=32, depth=2, num_heads=2, patch_size=8, num_classes=3)


def recipe_config(
    tmp_path: Path,
    data: Path,
    runs: Path,
    *,
    budget: float | None = None,
    kill: int | None = None,
    term: int | None = None,
    term_again: bool = False,
    signum: int = signal.SIGTERM,
    last_every: int = 1,
) -> Path:
    """cpu60.yaml as users run it (Muon with the patch projection, EMA, SPT, LSA, the resolution
    and patch-drop schedules, LastCheckpoint every `last_every` steps) at a tiny size, on a step
    budget unless `budget` (minutes) keeps its TimeBudget; `kill`: SIGKILL the process at that
    step; `term`: SIGTERM it during that step (`term_again`: and again inside the save;
    `signum`: another signal, SIGINT for Ctrl-C)."""
    config = yaml.safe_load(CPU60.read_text())
    trainer, callbacks = config["trainer"], []
    for callback in trainer["callbacks"]:
        name = callback["class_path"].rsplit(".", 1)[-1]
        if name == "ModelCheckpoint" or (name == "TimeBudget" and budget is None):
            continue
        args = callback.setdefault("init_args", {})
        if name == "LastCheckpoint":
            args["every_n_train_steps"] = last_every
        elif name == "ResolutionSchedule":
            args["stages"] = [[0, 16], [0.5, 32]]  # whole patches of 8
        elif name == "TimeBudget":
            args["minutes"] = budget
        callbacks.append(callback)
    if kill is not None:
        callbacks.append({"class_path": "tests.helpers.KillAtStep", "init_args": {"step": kill}})
    if term is not None:
        term_args = {"step": term, "again_in_save": term_again, "signum": int(signum)}
        callbacks.append({"class_path": "tests.helpers.TermAtStep", "init_args": term_args})
    trainer.update(
        callbacks=callbacks,
        max_epochs=3,
        precision="32-true",  # bitwise comparisons: no bf16 kernels that may choose per run
        deterministic=True,
        val_check_interval=1.0,
        log_every_n_steps=1,
        enable_progress_bar=False,
    )
    for logger in trainer["logger"]:
        logger["init_args"] = {"save_dir": str(runs), "name": "recipe"}
    config["model"]["network"].update(TINY_NETWORK)
    config["data"] = dict(
        data_dir=str(data), cache_dir=str(tmp_path / "cache"), batch_size=8, val_size=6, seed=0
    )
    config["test_after_fit"] = False
    # eager: the resume's bitwise guarantees are the loop's; the compiled network is
    # tests/test_warmup.py's, and its compile would add a minute to every process here
    if "float32_overrides" in config:
        config["float32_overrides"] = without_compile(config["float32_overrides"])
    path = tmp_path / f"recipe-{runs.name}-{kill}-{term}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_child(config: Path) -> subprocess.CompletedProcess:
    """vit-train fit -c config in a child process (which a callback of tests.helpers may stop)."""
    # Python's own Ctrl-C handler, as in a terminal: a child of a shell's background job starts
    # with SIGINT ignored, and Python keeps it so
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"from vit.commands.train import train_main; train_main(['fit', '-c', {str(config)!r}])"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # tests.helpers.KillAtStep, TermAtStep
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )


def run_killed(config: Path) -> None:
    """vit-train fit -c config in a child process, which SIGKILLs itself (KillAtStep)."""
    proc = run_child(config)
    assert proc.returncode == -9, proc.stderr[-3000:]  # killed, not finished


def run_terminated(config: Path, status: int = 143) -> str:
    """vit-train fit -c config in a child process, which SIGTERMs itself (TermAtStep): it exits
    with 143 (128 + SIGTERM, as a shell reports it; 130 for SIGINT). Its output (stdout and
    stderr)."""
    proc = run_child(config)
    assert proc.returncode == status, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def logged(run: Path) -> dict[tuple[str, str], str]:
    """Every value metrics.csv holds, by (step, metric); each (step, metric) is logged once."""
    rows = csv.DictReader((run / "metrics.csv").open())
    pairs = [
        ((r["step"], k), v) for r in rows for k, v in r.items() if v and k not in ("step", "epoch")
    ]
    assert len(pairs) == len(dict(pairs)), "a (step, metric) logged twice"
    return dict(pairs)


# Lightning's own scalars: "epoch" beside each metrics call (twice at a step with validation),
# hp_metric's placeholder at step 0 at each fit's start (its later values, val/acc's, count)
LIGHTNINGS = (("epoch", None), ("hp_metric", 0))


def tensorboard_scalars(run: Path) -> dict[tuple[str, str], float]:
    """The scalars of a run folder's TensorBoard event files, by (step, tag), read raw in the
    order written, as a reader honouring purge markers sees them: a writer's purge_step drops the
    events before it at that step and after. Each (step, tag) left, but LIGHTNINGS', must be
    there once."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    events: list[tuple[int, str, float]] = []
    for path in sorted(run.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        for event in LegacyEventFileLoader(str(path)).Load():  # as written
            if event.session_log.status == event.session_log.START:  # purge_step's marker
                events = [e for e in events if e[0] < event.step]
            for value in event.summary.value:  # add_scalar writes simple_value
                lightnings = {(value.tag, None), (value.tag, event.step)} & set(LIGHTNINGS)
                if value.WhichOneof("value") == "simple_value" and not lightnings:
                    events.append((event.step, value.tag, value.simple_value))
    pairs = [((str(step), tag), v) for step, tag, v in events]
    assert len(pairs) == len(dict(pairs)), "a (step, tag) in TensorBoard's events twice"
    return dict(pairs)


def test_recipe_killed_mid_epoch_resumes_bitwise(make_image_tree, tmp_path) -> None:
    """SIGKILL in the middle of an epoch of the recipe's configuration, a step after its last
    checkpoint, then --ckpt_path last: the live and averaged weights, the optimizer state and the
    logged metrics end bitwise as in a run never interrupted, each step's metrics once (the killed
    run had logged the step the resumed one takes again)."""
    data = make_image_tree(tmp_path / "data", train_per_class=30)  # 84 train images: 10 steps/epoch
    train_main(["fit", "-c", str(recipe_config(tmp_path, data, tmp_path / "a", last_every=4))])
    run_killed(recipe_config(tmp_path, data, tmp_path / "b", kill=14, last_every=4))
    last = tmp_path / "b" / "recipe" / "version_0" / "checkpoints" / "last.ckpt"
    killed_at = load_checkpoint(last)["global_step"]
    assert killed_at == 12 and killed_at % 10 != 0  # mid-epoch (epoch 1, batch 2)
    killed_run = tmp_path / "b" / "recipe" / "version_0"
    # the step after the checkpoint logged its metrics (under step 12) before the kill
    assert max(int(step) for step, _ in logged(killed_run)) == killed_at
    resume = recipe_config(tmp_path, data, tmp_path / "b", last_every=4)
    train_main(["fit", "-c", str(resume), "--ckpt_path=last"])
    assert_ends_as_the_unbroken_run(tmp_path, stopped_at=killed_at)


def assert_ends_as_the_unbroken_run(
    tmp_path: Path, *, stopped_at: int, by_sigterm: bool = False
) -> None:
    """The resumed run b (tmp_path/b) ends with the live and averaged weights, the optimizer state
    and the metrics logged from `stopped_at` on of the unbroken run a, bitwise, and its metrics.csv
    holds a's history before the stop too, every row of it. `by_sigterm`: the signal's own step's
    training metrics, which Lightning logs after the batch-end hook where the save stops the fit,
    were logged by the save (the run logs every step)."""
    a = load_checkpoint(tmp_path / "a" / "recipe" / "version_0" / "checkpoints" / "last.ckpt")
    # the resumed run kept writing into its own folder
    b = load_checkpoint(tmp_path / "b" / "recipe" / "version_0" / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == 30
    for key in ("state_dict", "current_model_state"):  # the EMA average, and the live weights
        assert a[key].keys() == b[key].keys()
        for name, value in a[key].items():
            assert torch.equal(value, b[key][name]), (key, name)
    assert a["hyper_parameters"]["optimizer"]["name"] == "muon"
    state_a, state_b = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    assert state_a.keys() == state_b.keys() and len(state_a) > 0
    for index, buffers in state_a.items():
        for name, value in buffers.items():
            assert torch.equal(value, state_b[index][name]), (index, name)
    run_a, run_b = (tmp_path / x / "recipe" / "version_0" for x in ("a", "b"))
    logged_a, logged_b = logged(run_a), logged(run_b)
    after_stop = {k: v for k, v in logged_a.items() if int(k[0]) >= stopped_at}
    differ = {k: (v, logged_b.get(k)) for k, v in after_stop.items() if logged_b.get(k) != v}
    assert after_stop and not differ
    assert any(metric == "val/acc" for _, metric in after_stop)
    # and the history before the stop is still there: metrics.csv holds the unbroken run's rows
    before_stop = {k: v for k, v in logged_a.items() if int(k[0]) < stopped_at}
    assert any(metric == "val/acc" for _, metric in before_stop)  # epoch 0's, among others
    signal_step = {metric for step, metric in logged_b if step == str(stopped_at - 1)}
    assert not by_sigterm or {"train/loss_step", "train/lr"} <= signal_step
    assert logged_b == logged_a
    # TensorBoard: the same values, the killed run's events from the stop on purged
    scalars_a, scalars_b = tensorboard_scalars(run_a), tensorboard_scalars(run_b)
    hp_metric = {int(step): v for (step, tag), v in scalars_a.items() if tag == "hp_metric"}
    before = [step for step in hp_metric if step < stopped_at]
    assert hp_metric and before  # val/acc's, after the placeholder; one before the stop
    # b's too, and the resumed fit's start gives it again after its own placeholder
    resumed = {(str(stopped_at), "hp_metric"): hp_metric[max(before)]}
    assert scalars_a and scalars_b == scalars_a | resumed


def test_a_finished_run_resumed_for_more_epochs_is_refused_not_trained_at_lr_zero(
    make_image_tree, tmp_path
) -> None:
    """The checkpoint's schedule comes back with it (LambdaLR restores WarmupCosine's fields), so a
    larger max_epochs does not stretch it: the extra steps would train at learning rate 0."""
    data = make_image_tree(tmp_path / "data", train_per_class=30)  # 10 steps an epoch
    config = recipe_config(tmp_path, data, tmp_path / "b")  # 3 epochs: the schedule ends at 30
    train_main(["fit", "-c", str(config)])
    with pytest.raises(ValueError, match="schedule ended at step 30") as refused:
        train_main(["fit", "-c", str(config), "--ckpt_path=last", "--trainer.max_epochs=4"])
    assert "--model.init_from" in str(refused.value)
    last = tmp_path / "b" / "recipe" / "version_0" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == 30  # nothing trained, the run's save kept


def test_budget_run_resumes_with_the_time_used_and_its_schedule_goes_on(
    make_image_tree, tmp_path, monkeypatch
) -> None:
    """A wall-clock-budget run killed mid-epoch resumes with the time it had used restored, and
    its learning rate goes on from there instead of warming up again."""
    from vit.train.callbacks.budget import TimeBudget

    data = make_image_tree(tmp_path / "data", train_per_class=30)
    # a long warm-up over a minute: the lr rises with the time used, so a clock started again
    # from zero would show as an lr far below the one the killed run had reached
    run_killed(recipe_config(tmp_path, data, tmp_path / "b", budget=1.0, kill=14))
    last = tmp_path / "b" / "recipe" / "version_0" / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(last)["callbacks"]["TimeBudget"]
    assert saved["elapsed_s"] > 0
    lr_before = load_checkpoint(last)["optimizer_states"][0]["param_groups"][-1]["lr"]
    restored: list[float] = []
    first_lr: list[float] = []

    class Watch(TimeBudget):
        def on_train_start(self, trainer, pl_module) -> None:
            restored.append(self.elapsed_s())  # before the clock starts: what was loaded
            super().on_train_start(trainer, pl_module)

        def on_train_batch_start(self, trainer, *args) -> None:
            super().on_train_batch_start(trainer, *args)
            if not first_lr:
                first_lr.append(trainer.optimizers[0].param_groups[-1]["lr"])

    monkeypatch.setattr("vit.train.callbacks.TimeBudget", Watch)
    config = recipe_config(tmp_path, data, tmp_path / "b", budget=1.0)
    train_main(["fit", "-c", str(config), "--ckpt_path=last", "--trainer.max_steps=16"])
    assert restored == [saved["elapsed_s"]]
    assert first_lr[0] >= lr_before > 0  # still warming up, from where it was


def test_recipe_stopped_by_sigterm_saves_its_step_and_resumes_bitwise(
    make_image_tree, tmp_path
) -> None:
    """SIGTERM during step 14 (mid-epoch) of the recipe's configuration: the step finishes, is
    saved as last.ckpt (the periodic saves are 1,000 steps apart and the last epoch end was step
    10: only the SIGTERM save explains it), the process exits 143 saying how to resume, and
    --ckpt_path last ends bitwise as a run never interrupted. The run's first config.yaml stays,
    the resumed run's beside it."""
    data = make_image_tree(tmp_path / "data", train_per_class=30)  # 84 train images: 10 steps/epoch
    train_main(["fit", "-c", str(recipe_config(tmp_path, data, tmp_path / "a", last_every=1000))])
    output = run_terminated(recipe_config(tmp_path, data, tmp_path / "b", last_every=1000, term=14))
    last = tmp_path / "b" / "recipe" / "version_0" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == 14
    assert f"Stopped by SIGTERM: saved {last} at step 14" in output
    assert "--ckpt_path last" in output and "Exit status 143" in output
    resume = recipe_config(tmp_path, data, tmp_path / "b", last_every=1000)
    train_main(["fit", "-c", str(resume), "--ckpt_path=last"])
    assert_ends_as_the_unbroken_run(tmp_path, stopped_at=14, by_sigterm=True)
    run = last.parent.parent
    configs = sorted(path.name for path in run.glob("config*.yaml"))
    assert configs == ["config-resumed-at-step-14.yaml", "config.yaml"]
    first, resumed = (yaml.safe_load((run / name).read_text()) for name in configs[::-1])
    assert first["ckpt_path"] is None and resumed["ckpt_path"] == str(last)


def test_budget_run_stopped_by_sigterm_resumes_with_the_time_used(
    make_image_tree, tmp_path, monkeypatch
) -> None:
    """A wall-clock-budget run stopped by SIGTERM saves its TimeBudget's clock with the step, and
    the resumed fit starts from the time it had used."""
    from vit.train.callbacks.budget import TimeBudget

    data = make_image_tree(tmp_path / "data", train_per_class=30)
    run_terminated(recipe_config(tmp_path, data, tmp_path / "b", budget=1.0, term=14))
    last = tmp_path / "b" / "recipe" / "version_0" / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(last)
    assert saved["global_step"] == 14 and saved["callbacks"]["TimeBudget"]["elapsed_s"] > 0
    restored: list[float] = []

    class Watch(TimeBudget):
        def on_train_start(self, trainer, pl_module) -> None:
            restored.append(self.elapsed_s())  # before the clock starts: what was loaded
            super().on_train_start(trainer, pl_module)

    monkeypatch.setattr("vit.train.callbacks.TimeBudget", Watch)
    config = recipe_config(tmp_path, data, tmp_path / "b", budget=1.0)
    train_main(["fit", "-c", str(config), "--ckpt_path=last", "--trainer.max_steps=16"])
    assert restored == [saved["callbacks"]["TimeBudget"]["elapsed_s"]]
    assert load_checkpoint(last)["global_step"] == 16


def test_a_second_sigterm_during_the_save_leaves_a_whole_last_checkpoint(
    make_image_tree, tmp_path
) -> None:
    """SIGTERM again half-way through writing the SIGTERM save: the signal is only noted, the
    write goes on, and last.ckpt is the whole new checkpoint; no temporary file is left."""
    data = make_image_tree(tmp_path / "data", train_per_class=30)
    config = recipe_config(tmp_path, data, tmp_path / "b", last_every=1000, term=4, term_again=True)
    output = run_terminated(config)
    assert output.count("Received SIGTERM") == 2  # Lightning's handler, once per signal
    folder = tmp_path / "b" / "recipe" / "version_0" / "checkpoints"
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == 4
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]


def test_a_first_ctrl_c_saves_its_step_and_exits_130(make_image_tree, tmp_path) -> None:
    """Ctrl-C (SIGINT) during step 14 of vit-train's fit: as SIGTERM, the step finishes and is
    saved as last.ckpt, and the process says so and how to resume, with exit status 130."""
    data = make_image_tree(tmp_path / "data", train_per_class=30)  # 10 steps an epoch
    config = recipe_config(tmp_path, data, tmp_path / "b", last_every=1000, term=14, signum=2)
    output = run_terminated(config, status=130)
    last = tmp_path / "b" / "recipe" / "version_0" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == 14
    assert "Ctrl-C again stops at once, without saving" in output
    assert f"Stopped by Ctrl-C: saved {last} at step 14" in output
    assert "--ckpt_path last" in output and "Exit status 130" in output


@pytest.fixture
def python_ctrl_c():
    """SIGINT with Python's own handler during the test (as in a terminal; a shell's background
    job starts with it ignored), and as it was after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_saves_in_a_trainer_of_one_s_own_and_gives_the_handler_back(
    tmp_path, caplog, python_ctrl_c
) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from tests.helpers import TermAtStep
    from vit.train.callbacks.checkpointing import SaveOnSigterm

    during: list[object] = []

    class Watch(L.Callback):
        def on_train_start(self, *args) -> None:
            during.append(signal.getsignal(signal.SIGINT))

    save = SaveOnSigterm()
    trainer = quiet_trainer(
        tmp_path,
        max_epochs=3,
        enable_checkpointing=True,
        callbacks=[
            TermAtStep(step=6, signum=signal.SIGINT),
            save,
            ModelCheckpoint(dirpath=tmp_path / "c"),
            Watch(),  # after the callback: its on_train_start has run
        ],
    )
    with pytest.raises(SIGTERMException) as stop:
        trainer.fit(tiny_classifier(), random_loader())
    assert stop.value.code == 130
    assert load_checkpoint(tmp_path / "c" / "last.ckpt")["global_step"] == 6
    assert f"Stopped by Ctrl-C: saved {tmp_path / 'c' / 'last.ckpt'} at step 6" in caplog.text
    assert during == [save._on_ctrl_c]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back

    # a fit that ends gives it back too (4 steps); a handler of the user's own is left in place
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[save, Watch()]).fit(
        tiny_classifier(), random_loader()
    )
    assert during[-1] == save._on_ctrl_c
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def own(signum, frame) -> None:
        pass

    signal.signal(signal.SIGINT, own)
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[save, Watch()]).fit(
        tiny_classifier(), random_loader()
    )
    assert during[-1] is own and signal.getsignal(signal.SIGINT) is own


def test_only_rank_zero_says_what_a_ctrl_c_will_do(capfd, python_ctrl_c) -> None:
    """A terminal's Ctrl-C reaches every rank of a DDP fit: each stops, one speaks."""
    from types import SimpleNamespace

    from vit.train.callbacks.checkpointing import SaveOnSigterm

    said = []
    for rank in (0, 1):
        save = SaveOnSigterm()
        save.on_train_start(SimpleNamespace(is_global_zero=rank == 0), None)
        os.kill(os.getpid(), signal.SIGINT)
        assert save._ctrl_c  # stops at the step's end
        said.append(capfd.readouterr().err.count("Ctrl-C again stops at once"))
    assert said == [1, 0]


def test_a_fit_outside_the_main_thread_leaves_ctrl_c_alone(tmp_path, python_ctrl_c) -> None:
    """Only the main thread may set a signal handler: a fit in another thread (a notebook's
    worker, a server's) trains as before, Ctrl-C left as it was."""
    import threading

    from vit.train.callbacks.checkpointing import SaveOnSigterm

    failed: list[BaseException] = []

    def fit() -> None:
        try:
            trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[SaveOnSigterm()])
            trainer.fit(tiny_classifier(), random_loader())
            assert trainer.global_step == 4
        except BaseException as err:
            failed.append(err)

    thread = threading.Thread(target=fit)
    thread.start()
    thread.join()
    assert not failed, failed
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def saving_at_epoch_ends(tmp_path: Path, signaller: object, **trainer_args: object):
    """A 3-epoch Trainer (4 steps an epoch with random_loader) whose last.ckpt, in
    tmp_path/ckpt, is saved at epoch ends only (and by SaveOnSigterm), `signaller` first."""
    from vit.train.callbacks.checkpointing import LastCheckpoint, SaveOnSigterm

    last = LastCheckpoint(every_n_train_steps=1000, dirpath=str(tmp_path / "ckpt"))
    callbacks = [signaller, SaveOnSigterm(), last]
    return quiet_trainer(
        tmp_path, max_epochs=3, enable_checkpointing=True, callbacks=callbacks, **trainer_args
    )


def test_a_second_ctrl_c_stops_at_once_without_saving(tmp_path, python_ctrl_c) -> None:
    """Ctrl-C twice in step 6: the second interrupts the step (KeyboardInterrupt; Lightning
    shuts down and exits 1, which a console command reports as 130, as the first), nothing is
    saved at step 6: last.ckpt is the epoch end's, step 4."""
    import lightning as L

    from vit.system.errors import interruptible

    class CtrlCTwice(L.Callback):
        def on_before_backward(self, trainer, *args) -> None:
            if trainer.global_step == 5:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)

    trainer = saving_at_epoch_ends(tmp_path, CtrlCTwice())
    with pytest.raises(SystemExit) as stop:  # 4 steps an epoch
        interruptible(lambda: trainer.fit(tiny_classifier(), random_loader()))()
    assert stop.value.code == 130
    assert load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["global_step"] == 4


def test_sigterm_during_validation_exits_143_and_keeps_the_last_save(tmp_path, caplog) -> None:
    """SIGTERM half-way through a validation: Lightning stops it at once; nothing half-validated
    is saved, last.ckpt keeps its last save (the end of epoch 1), and the exit status is 143."""
    import lightning as L
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    class TermInValidation(L.Callback):
        def on_validation_batch_start(self, trainer, *args) -> None:
            if trainer.global_step == 8:  # the validation at the end of epoch 2
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = saving_at_epoch_ends(tmp_path, TermInValidation(), num_sanity_val_steps=0)
    with pytest.raises(SIGTERMException) as stop:  # 4 steps an epoch, 2 validation batches
        trainer.fit(tiny_classifier(), random_loader(), random_loader(32))
    assert stop.value.code == 143
    assert load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["global_step"] == 4
    assert "Stopped by SIGTERM at step 8 outside a training step" in caplog.text


def test_sigterm_without_a_last_checkpoint_writer_saves_last_ckpt_in_the_checkpoint_folder(
    tmp_path, caplog
) -> None:
    """With no ModelCheckpoint that keeps last.ckpt, the SIGTERM save is last.ckpt in the first
    ModelCheckpoint's folder, where --ckpt_path last looks."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from tests.helpers import TermAtStep
    from vit.train.callbacks.checkpointing import SaveOnSigterm

    trainer = quiet_trainer(
        tmp_path,
        max_epochs=3,
        enable_checkpointing=True,
        callbacks=[TermAtStep(step=6), SaveOnSigterm(), ModelCheckpoint(dirpath=tmp_path / "c")],
    )
    with pytest.raises(SIGTERMException) as stop:
        trainer.fit(tiny_classifier(), random_loader())
    assert stop.value.code == 143
    assert load_checkpoint(tmp_path / "c" / "last.ckpt")["global_step"] == 6
    assert f"saved {tmp_path / 'c' / 'last.ckpt'} at step 6" in caplog.text


def test_sigterm_in_a_fast_dev_run_saves_nothing(tmp_path, caplog, monkeypatch) -> None:
    """fast_dev_run checks the code and saves no checkpoint (Lightning's rule); SIGTERM in it
    stops it with 143 and saves nothing either, into ./checkpoints or elsewhere."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from tests.helpers import TermAtStep
    from vit.train.callbacks.checkpointing import SaveOnSigterm

    monkeypatch.chdir(tmp_path)
    trainer = quiet_trainer(
        tmp_path,
        fast_dev_run=True,
        enable_checkpointing=True,
        callbacks=[TermAtStep(step=1), SaveOnSigterm(), ModelCheckpoint(dirpath=tmp_path / "c")],
    )
    with pytest.raises(SIGTERMException) as stop:
        trainer.fit(tiny_classifier(), random_loader())
    assert stop.value.code == 143
    assert list(tmp_path.iterdir()) == []
    assert "Stopped by SIGTERM at step 1; checkpointing is off: nothing saved" in caplog.text


def test_disk_full_during_a_save_leaves_the_previous_last_checkpoint(image_tree, tmp_path) -> None:
    """A save that dies half-way (ENOSPC) raises, and last.ckpt still holds the previous save."""
    import errno

    import lightning as L
    from fsspec.implementations.local import LocalFileOpener
    from lightning.pytorch.callbacks import ModelCheckpoint

    from vit.train.datamodule import CIFAR10DataModule

    dm = CIFAR10DataModule(
        data_dir=str(image_tree), cache_dir=str(tmp_path / "cache"), batch_size=8, val_size=6
    )
    # a floor under the learning rate: the second fit, longer than the first's schedule, trains
    # on at min_lr (with a floor of 0 it would be refused: vit/train/schedule.py)
    module = tiny_classifier(network={"num_classes": 3}, schedule={"min_lr": 1e-5})
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=1)
    trainer = L.Trainer(max_epochs=1, logger=False, callbacks=[ckpt], enable_progress_bar=False)
    trainer.fit(module, dm)
    last = tmp_path / "ckpt" / "last.ckpt"
    good = last.read_bytes()

    real_write = LocalFileOpener.write

    def write_half_then_fail(self, data, *args, **kwargs):
        real_write(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    LocalFileOpener.write = write_half_then_fail
    try:
        trainer = L.Trainer(max_epochs=2, logger=False, callbacks=[ckpt], enable_progress_bar=False)
        with pytest.raises(OSError, match="No space left on device"):
            trainer.fit(module, dm, ckpt_path=last)
    finally:
        LocalFileOpener.write = real_write
    assert last.read_bytes() == good  # not half-written: the write went to a temporary file
    assert load_checkpoint(last)["global_step"] == 3


def test_last_checkpoint_is_written_by_step_and_at_every_epoch_end(tmp_path) -> None:
    """every_n_train_steps=3 with 4 steps an epoch: last.ckpt still ends at the final step (8)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from vit.train.callbacks.checkpointing import LastCheckpoint

    steps_seen = []

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            path = tmp_path / "ckpt" / "last.ckpt"
            if path.exists():
                steps_seen.append(load_checkpoint(path)["global_step"])

    data = DataLoader(
        TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 3, (64,))), batch_size=16
    )
    module = tiny_classifier(network={"num_classes": 3})
    trainer = L.Trainer(
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        callbacks=[Watch(), LastCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=3)],
    )
    trainer.fit(module, data)
    assert 3 in steps_seen and 6 in steps_seen  # by step, mid-epoch
    assert load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["global_step"] == 8  # and at the end
