"""scripts/plot_curve.py: reads a run's TensorBoard scalars and writes the picture and its points."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from tests.conftest import load_script

plot_curve = load_script("plot_curve")


def write_run(folder: Path, values: list[float], *, start: float = 1000.0) -> None:
    """A run folder whose val/acc is logged every 100 steps, one minute apart."""
    with SummaryWriter(str(folder)) as w:
        for i, v in enumerate(values):
            w.add_scalar("val/acc", v, global_step=100 * (i + 1), walltime=start + 60.0 * i)


def test_read_curve_minutes_values_steps(tmp_path: Path) -> None:
    write_run(tmp_path / "a", [0.1, 0.5, 0.75])
    minutes, values, steps = plot_curve.read_curve(tmp_path / "a", "val/acc")
    assert minutes == pytest.approx([0.0, 1.0, 2.0])
    assert values == pytest.approx([0.1, 0.5, 0.75])
    assert steps == [100, 200, 300]


def test_unknown_tag_names_the_tags_the_run_has(tmp_path: Path) -> None:
    write_run(tmp_path / "a", [0.1])
    with pytest.raises(ValueError, match=r"no scalar 'val/acc5'.*'val/acc'"):
        plot_curve.read_curve(tmp_path / "a", "val/acc5")


def test_main_writes_the_picture_and_every_point(tmp_path: Path, monkeypatch) -> None:
    write_run(tmp_path / "a", [0.1, 0.5])
    write_run(tmp_path / "b", [0.2, 0.6, 0.7])
    out = tmp_path / "fig" / "curve.png"
    argv = ["plot_curve.py", str(tmp_path / "a"), str(tmp_path / "b"), "--labels", "A", "B"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out)])
    plot_curve.main()
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with out.with_suffix(".csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["run"], int(r["step"]), float(r["value"])) for r in rows] == [
        ("A", 100, 0.1),
        ("A", 200, 0.5),
        ("B", 100, 0.2),
        ("B", 200, 0.6),
        ("B", 300, 0.7),
    ]
    assert float(rows[-1]["minutes"]) == pytest.approx(2.0)
