"""Checkpointing and its guards: last.ckpt by step and by epoch, last.ckpt at the current step on
SIGTERM or Ctrl-C, and a stop on a non-finite loss before any checkpoint can hold diverged
weights."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor

from vit.system.errors import CTRL_C_EXIT_STATUS

log = logging.getLogger(__name__)

# what a shell reports for a process that SIGTERM ended: schedulers read it as "terminated"
SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM


class LastCheckpoint(ModelCheckpoint):
    """`last.ckpt` every `every_n_train_steps` steps *and* at the end of every epoch.

    Lightning's ModelCheckpoint does one or the other: with a step interval it skips the epoch
    end, so the final weights of a run could be up to n steps older than the run.

    Args:
        every_n_train_steps: Save last.ckpt after every this many optimizer steps.
        dirpath: Folder of the checkpoints (None: the run's checkpoints/ folder).
    """

    def __init__(self, *, every_n_train_steps: int = 100, dirpath: str | None = None) -> None:
        super().__init__(
            dirpath=dirpath, every_n_train_steps=every_n_train_steps, save_top_k=0, save_last=True
        )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class SaveOnSigterm(L.Callback):
    """On SIGTERM (a preempted machine, a scheduler's time limit), finish the step under way, save
    last.ckpt at it, log the step's metrics and stop with exit status 143 (128 + SIGTERM, as a
    shell reports a process the signal ended; Lightning alone would save nothing and exit 0).
    `--ckpt_path last` resumes from there exactly. vit-train adds it to every fit
    (vit/commands/train.py); in a Trainer of your own, list it after the callbacks whose state a
    checkpoint holds (EMA, TimeBudget).

    last.ckpt is that of every ModelCheckpoint with `save_last: true` (LastCheckpoint among
    them); with none, last.ckpt in the first ModelCheckpoint's folder (the run's checkpoints/);
    with no ModelCheckpoint nothing is saved. Lightning's handler only notes the signal
    (`trainer.received_sigterm`), so a second SIGTERM during the save cannot break it off, and
    the save goes through a temporary file: last.ckpt is the old file or the whole new one.
    A SIGTERM during validation stops it at once (Lightning) with last.ckpt from its last save:
    half-way through validation the module holds the averaged weights, not a resumable state.
    Under DDP every rank stops at the same step, whichever got the signal (one all-reduce of a
    flag per step); rank 0 writes the file. (Lightning's handler broadcasts once per signal: a
    rank signalled twice, by the scheduler and by Lightning's launcher, hangs the fit.)

    The first Ctrl-C (SIGINT) during the fit does the same, with exit status 130; a second stops
    at once without saving, as Lightning does on any Ctrl-C. (Where SIGINT already has a handler
    other than Python's, or the fit runs outside the main thread, Ctrl-C is left as it was.)
    """

    def __init__(self) -> None:
        self._saved: tuple[int, str] | None = None  # (step, path) of this callback's save
        self._ctrl_c = False  # a first Ctrl-C came: stop at this step's end
        self._speaks = True  # this rank says so when it comes

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved, self._ctrl_c = None, False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # here, not at fit start: Lightning has noted the handlers it puts back as the fit ends
        # (any way it ends), so this one goes with them; before the first step (the compile),
        # a Ctrl-C has no step to save and stops at once
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            signal.signal(signal.SIGINT, self._on_ctrl_c)
        self._speaks = trainer.is_global_zero  # a terminal's Ctrl-C reaches every rank

    def _on_ctrl_c(self, signum: int, frame: FrameType | None) -> None:
        self._ctrl_c = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one stops at once
        if self._speaks:
            # not the logging module: this runs between any two lines of the fit, its lock's too
            sys.stderr.write(
                "\nCtrl-C: saving last.ckpt at the end of this step, then stopping. "
                "Ctrl-C again stops at once, without saving.\n"
            )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any
    ) -> None:
        # here the step is done and the callbacks before this one (EMA's average) have seen it:
        # the state a periodic save of last.ckpt holds, which resumes bitwise
        stop = trainer.received_sigterm or self._ctrl_c
        if not trainer.strategy.reduce_boolean_decision(stop, all=False):
            return
        self._save_last(trainer)
        self._log_step(trainer)
        # raised on every rank at once: Lightning would raise only where the signal arrived
        raise SIGTERMException(CTRL_C_EXIT_STATUS if self._ctrl_c else SIGTERM_EXIT_STATUS)

    @staticmethod
    def _log_step(trainer: L.Trainer) -> None:
        """Hand this step's metrics (train/loss_step, train/lr) to the loggers, as Lightning would
        after this hook: the stop skips that, and a resumed run starts at the next step, so they
        would be missing from the run's logs (Lightning writes the loggers out as it stops)."""
        trainer._logger_connector.update_train_step_metrics()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        if not exception.code:  # raised by Lightning itself: SystemExit() would exit with 0
            exception.code = SIGTERM_EXIT_STATUS
        if trainer.is_global_zero:
            log.warning("%s", self._report(trainer, exception.code))

    @staticmethod
    def _last_writers(trainer: L.Trainer) -> list[ModelCheckpoint]:
        """The ModelCheckpoints that write a last.ckpt of their own (a "link" is no file)."""
        return [
            c
            for c in trainer.checkpoint_callbacks
            if isinstance(c, ModelCheckpoint) and c.save_last is True
        ]

    def _save_last(self, trainer: L.Trainer) -> None:
        if trainer.fast_dev_run:  # a check of the code, not a run: Lightning saves nothing
            return
        checkpoints = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        writers = self._last_writers(trainer)
        for c in writers:  # each writes its own last.ckpt, as its periodic saves do
            c._save_last_checkpoint(trainer, c._monitor_candidates(trainer))
        if writers:
            self._saved = (trainer.global_step, writers[0].last_model_path)
        elif checkpoints and checkpoints[0].dirpath:
            path = os.path.join(checkpoints[0].dirpath, "last.ckpt")
            trainer.save_checkpoint(path)
            self._saved = (trainer.global_step, path)

    def _report(self, trainer: L.Trainer, code: int) -> str:
        """What was saved and how to go on, for the log; `code`: the exit status."""
        step, resume = trainer.global_step, "Resume with the same command and --ckpt_path last"
        by = "Ctrl-C" if code == CTRL_C_EXIT_STATUS else "SIGTERM"
        status = f"Exit status {code}."
        saves = [
            (c._last_global_step_saved, c.last_model_path)
            for c in self._last_writers(trainer)
            if c.last_model_path
        ]  # a save of the run's own at this step: the signal came during it, or at epoch end
        saved = self._saved or next(iter(saves), None)
        if saved is not None and saved[0] == step:
            return f"Stopped by {by}: saved {saved[1]} at step {step}. {resume}. {status}"
        if not trainer.checkpoint_callbacks or trainer.fast_dev_run:
            return f"Stopped by {by} at step {step}; checkpointing is off: nothing saved. {status}"
        return (
            f"Stopped by {by} at step {step} outside a training step (in validation, or "
            f"before the first step): last.ckpt is from its last save. {resume}. {status}"
        )


class FiniteLoss(L.Callback):
    """Stop on a training loss that is not finite, before the step and before any checkpoint
    can hold diverged weights. On a CPU the loss is read at once. On a GPU, reading it would
    make the host wait for the GPU on every step, so it is copied to the host without waiting
    and read at the start of the next step, before any checkpoint is saved, and when training
    ends: the error names the step of the loss all the same. vit-train adds it to every fit
    (vit/commands/train.py); add it to a Trainer of your own."""

    def __init__(self) -> None:
        self._pending: tuple[Tensor, Any, tuple[int, int]] | None = None

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor
    ) -> None:
        where = (trainer.global_step, trainer.current_epoch)
        if loss.device.type != "cuda":
            self._raise_if_not_finite(loss.detach(), where)
            return
        host = torch.empty((), dtype=loss.dtype, pin_memory=True)
        host.copy_(loss.detach(), non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        self._pending = (host, copied, where)

    def check_pending(self, *args: Any) -> None:
        if self._pending is not None:
            host, copied, where = self._pending
            self._pending = None
            copied.synchronize()  # the forward that made it is long done: no wait in practice
            self._raise_if_not_finite(host, where)

    on_train_batch_start = on_save_checkpoint = on_train_end = check_pending

    @staticmethod
    def _raise_if_not_finite(loss: Tensor, where: tuple[int, int]) -> None:
        if not torch.isfinite(loss):
            step, epoch = where
            raise FloatingPointError(
                f"training loss is {loss.item()} at step {step} (epoch {epoch}); stopping so "
                f"that no checkpoint holds diverged weights. Lower model.optimizer.lr, raise the "
                f"warm-up (model.schedule), or use precision 32-true; resume from the last good "
                f"checkpoint with --ckpt_path."
            )
