"""A Lightning callback for device checks: training time per step over a window of steps, and
optionally a torch.profiler reading of a few steps (where the host's time goes, how long the GPU
is busy). Used by gpu_run.sh in this folder; prints its findings as lines starting with TIMER."""

from __future__ import annotations

import os
import time

import lightning as L
import torch


class StepTimer(L.Callback):
    def __init__(self, start: int = 100, stop: int = 600, profile: int = 0) -> None:
        self.start, self.stop, self.profile = start, stop, profile
        self.t0 = 0.0
        self.prof = None

    @staticmethod
    def _sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step  # steps done
        if step == self.start:
            self._sync()
            self.t0 = time.perf_counter()
        if self.profile and step == self.stop - self.profile:
            self._sync()
            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.__enter__()
            self.tp = time.perf_counter()
        if step == self.stop:
            self._sync()
            t1 = time.perf_counter()
            ms = 1000 * (t1 - self.t0) / (self.stop - self.start)
            batch_size = len(batch[1])
            label = os.environ.get("VARIANT", "?")
            print(
                f"TIMER {label}: steps {self.start}-{self.stop}: {ms:.2f} ms/step, "
                f"{1000 * batch_size / ms:.0f} img/s (batch {batch_size})",
                flush=True,
            )
            if self.prof is not None:
                self.prof.__exit__(None, None, None)
                self._report(label, 1000 * (t1 - self.tp) / self.profile)
            trainer.should_stop = True

    def _report(self, label: str, wall_ms: float) -> None:
        events = self.prof.key_averages()
        n = self.profile
        # as the table's "Self CUDA time total": GPU-side user annotations (a range around the
        # kernels of an optimizer step or a compiled graph) are left out, or kernels count twice.
        # (The run of 2026-11-26, H200 lacked this exclusion: its "GPU kernels busy" lines are too
        # high; the tables' totals, 5.8 and 3.8 ms/step, are the right figures.)
        gpu_us = sum(
            e.self_device_time_total
            for e in events
            if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False)
        )
        syncs = {
            e.key: (e.count, e.cpu_time_total)
            for e in events
            if "Synchronize" in e.key or e.key in ("cudaMemcpyAsync", "cudaLaunchKernel")
        }
        print(
            f"TIMER {label} profile: wall {wall_ms:.2f} ms/step under the profiler, "
            f"GPU kernels busy {gpu_us / 1000 / n:.2f} ms/step",
            flush=True,
        )
        for k, (count, us) in sorted(syncs.items()):
            print(
                f"TIMER {label} profile: {k}: {count / n:.1f} calls/step, "
                f"{us / 1000 / n:.2f} ms/step",
                flush=True,
            )
        print(
            events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60),
            flush=True,
        )
