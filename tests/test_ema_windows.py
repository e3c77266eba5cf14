"""scripts/ema_windows.py: averages of any window rebuilt from snapshots of the live weights."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import load_script
from vit.train.callbacks.ema import EMA

ema_windows = load_script("ema_windows")


def kept_by_the_callback(states: list[dict[str, torch.Tensor]], decay: float) -> torch.Tensor:
    """What vit.train.callbacks.EMA keeps after an update at every step 1..len(states), run
    through its own update on float64 copies."""
    ema = EMA(decay=decay)
    average = [states[0]["w"].clone()]  # the first update copies
    for n, state in enumerate(states[1:], start=1):
        ema._update(average, [state["w"]], n)
    return average[0]


def test_snapshots_at_every_step_rebuild_the_callback_average() -> None:
    torch.manual_seed(0)
    states = [{"w": torch.randn(7, dtype=torch.float64)} for _ in range(300)]
    steps = list(range(1, 301))
    rebuilt = ema_windows.rebuilt_average(states, ema_windows.snapshot_masses(steps, 50))
    # float64 throughout: 300 terms of size ~3 round far below 1e-12 both ways
    torch.testing.assert_close(
        rebuilt["w"], kept_by_the_callback(states, 1 - 1 / 50), rtol=0, atol=1e-12
    )


def test_sparse_snapshots_are_exact_for_weights_constant_between_them() -> None:
    """A snapshot every 10 steps stands for the 10 steps it ends: exact when they were equal."""
    torch.manual_seed(1)
    held = [torch.randn(5, dtype=torch.float64) for _ in range(20)]
    every_step = [{"w": held[(g - 1) // 10]} for g in range(1, 201)]  # steps 1-10, 11-20, ...
    steps = list(range(10, 201, 10))
    rebuilt = ema_windows.rebuilt_average(
        [every_step[g - 1] for g in steps], ema_windows.snapshot_masses(steps, 40)
    )
    torch.testing.assert_close(
        rebuilt["w"], kept_by_the_callback(every_step, 1 - 1 / 40), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("window", [0, 3, 1000])
def test_masses_sum_to_one_and_window_zero_is_the_live_weights(window: float) -> None:
    masses = ema_windows.snapshot_masses([1, 50, 100, 150, 180], window)
    assert math.fsum(masses) == pytest.approx(1.0, abs=1e-12)
    if window == 0:
        assert masses == [0.0, 0.0, 0.0, 0.0, 1.0]
    else:  # every snapshot counts; of two 50-step spans the later one counts more
        assert min(masses) > 0
        assert masses[3] > masses[2]


def test_integer_buffers_come_from_the_last_snapshot() -> None:
    states = [{"n": torch.tensor(i), "w": torch.full((2,), float(i))} for i in range(3)]
    rebuilt = ema_windows.rebuilt_average(states, [0.25, 0.25, 0.5])
    assert rebuilt["n"].item() == 2
    assert rebuilt["w"].tolist() == [1.25, 1.25]


@pytest.mark.parametrize(
    ("steps", "window"), [([1, 50, 50], 10), ([0, 50], 10), ([1, 50], -1), ([1, 50], 0.5)]
)
def test_unordered_steps_or_a_negative_window_are_refused(steps: list[int], window: float) -> None:
    with pytest.raises(ValueError, match="increase|window"):
        ema_windows.snapshot_masses(steps, window)


def test_from_a_fit_with_snapshots_window_zero_scores_the_live_weights(
    image_tree, tmp_path
) -> None:
    """The docstring's recipe on a tiny fit: the table's window 0 is what `vit-evaluate --weights
    live` scores, and the fit's own average is rebuilt from snapshots at every step."""
    import json

    from tests.helpers import train_args
    from vit.commands.evaluate import run_evaluate
    from vit.commands.train import train_main

    runs = tmp_path / "runs"
    extra = (
        "--trainer.callbacks+=vit.train.callbacks.EMA",
        "--trainer.callbacks.decay=0.9",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps=1",
        "--trainer.callbacks.save_top_k=-1",
        "--trainer.callbacks.filename=snap-{step}",
    )
    train_main(train_args(image_tree, runs, *extra))
    folder = runs / "tiny" / "version_0" / "checkpoints"
    out = tmp_path / "windows.json"
    ema_windows.main([str(folder), "--windows", "0", "10", "--decay", "0.9", "--out", str(out)])
    table = json.loads(out.read_text())
    live = run_evaluate(
        [
            str(folder / "last.ckpt"),
            "--split",
            "val",
            "--weights",
            "live",
            "--no-flip",
            "--output-dir",
            str(tmp_path / "eval"),
        ]
    )
    assert table["windows"][0] == {"window_steps": 0, "top1": live["top1"], "nll": live["nll"]}
    assert table["snapshots"] == table["final_step"]  # one per step, from step 1
    # the kept average went through float32 lerps, one rounding of eps32 x its size per step;
    # the rebuild sums in float64 and rounds once
    bound = (table["final_step"] + 1) * 2**-24 * table["largest_weight"]
    assert table["rebuilt_fit_average_max_abs_diff"] <= bound
