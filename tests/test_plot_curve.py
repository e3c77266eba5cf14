"""scripts/plot_curve.py: reads a run's TensorBoard scalars and writes the picture and its points."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from tests.helpers import load_script

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


def test_earlier_curves_come_back_from_their_csv(tmp_path: Path, monkeypatch) -> None:
    """A curve.csv written once plots again beside a new run, after its run folder is gone."""
    write_run(tmp_path / "old", [0.3, 0.4])
    first = tmp_path / "first" / "curve.png"
    argv = ["plot_curve.py", str(tmp_path / "old"), str(tmp_path / "other")]
    write_run(tmp_path / "other", [0.9])
    monkeypatch.setattr(sys, "argv", [*argv, "--labels", "OLD", "OTHER", "--out", str(first)])
    plot_curve.main()
    assert set(plot_curve.read_points(first.with_suffix(".csv"))) == {"OLD", "OTHER"}

    write_run(tmp_path / "new", [0.5, 0.8])
    out = tmp_path / "second" / "curve.png"
    argv = ["plot_curve.py", str(tmp_path / "new"), "--labels", "NEW"]
    csv_args = ["--from-csv", str(first.with_suffix(".csv")), "--only", "OLD"]
    monkeypatch.setattr(sys, "argv", [*argv, *csv_args, "--out", str(out)])
    plot_curve.main()
    with out.with_suffix(".csv").open() as f:
        rows = [(r["run"], int(r["step"]), float(r["value"])) for r in csv.DictReader(f)]
    assert rows == [("NEW", 100, 0.5), ("NEW", 200, 0.8), ("OLD", 100, 0.3), ("OLD", 200, 0.4)]

    renamed = tmp_path / "third" / "curve.png"
    csv_args = ["--from-csv", str(first.with_suffix(".csv")), "--rename", "OLD", "BEFORE"]
    monkeypatch.setattr(sys, "argv", ["plot_curve.py", *csv_args, "--out", str(renamed)])
    plot_curve.main()
    assert set(plot_curve.read_points(renamed.with_suffix(".csv"))) == {"BEFORE", "OTHER"}


def test_from_csv_refuses_unknown_labels_and_foreign_files(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    points = tmp_path / "curve.csv"
    points.write_text("run,step,minutes,value\nA,100,1.00,0.5000\n")
    out = str(tmp_path / "o.png")
    monkeypatch.setattr(
        sys, "argv", ["plot_curve.py", "--from-csv", str(points), "--only", "B", "--out", out]
    )
    with pytest.raises(SystemExit):
        plot_curve.main()
    err = capsys.readouterr().err
    assert "no run ['B']" in err and "they have ['A']" in err
    monkeypatch.setattr(
        sys,
        "argv",
        ["plot_curve.py", "--from-csv", str(points), "--rename", "B", "C", "--out", out],
    )
    with pytest.raises(SystemExit):
        plot_curve.main()
    assert "--rename: no run ['B'] among the --from-csv curves; they have ['A']" in (
        capsys.readouterr().err
    )
    other = tmp_path / "metrics.csv"
    other.write_text("epoch,step,val/acc\n1,100,0.5\n")
    with pytest.raises(ValueError, match="expected run, step, minutes, value"):
        plot_curve.read_points(other)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_curve.read_points(tmp_path / "missing.csv")
    monkeypatch.setattr(sys, "argv", ["plot_curve.py", "--out", out])
    with pytest.raises(SystemExit):
        plot_curve.main()
    assert "at least one run folder or --from-csv file" in capsys.readouterr().err


def test_refuses_two_curves_under_one_label(tmp_path: Path, monkeypatch, capsys) -> None:
    """A run folder and a --from-csv curve (or a rename) sharing a label would hide one curve."""
    points = tmp_path / "curve.csv"
    points.write_text("run,step,minutes,value\nA,100,1.00,0.5000\nB,100,1.00,0.6000\n")
    write_run(tmp_path / "run", [0.7])
    out = tmp_path / "o.png"
    cases = {
        "folder vs csv": [str(tmp_path / "run"), "--labels", "A", "--from-csv", str(points)],
        "rename onto csv": ["--from-csv", str(points), "--rename", "A", "B"],
        "rename onto folder": [
            *[str(tmp_path / "run"), "--labels", "C", "--from-csv", str(points)],
            *["--rename", "A", "C"],
        ],
        "two folders": [str(tmp_path / "run"), str(tmp_path / "run"), "--labels", "D", "D"],
    }
    for name, args in cases.items():
        monkeypatch.setattr(sys, "argv", ["plot_curve.py", *args, "--out", str(out)])
        with pytest.raises(SystemExit):
            plot_curve.main()
        err = capsys.readouterr().err
        assert "two curves would be shown as" in err, name
        assert not out.exists(), name
    # Renaming out of the way is the fix the message names.
    args = [str(tmp_path / "run"), "--labels", "A", "--from-csv", str(points), "--rename", "A", "E"]
    monkeypatch.setattr(sys, "argv", ["plot_curve.py", *args, "--out", str(out)])
    plot_curve.main()
    assert set(plot_curve.read_points(out.with_suffix(".csv"))) == {"A", "B", "E"}


def test_x_steps_plots_against_steps(tmp_path: Path, monkeypatch) -> None:
    import vit.maps.plots

    write_run(tmp_path / "a", [0.1, 0.5])
    seen = {}

    def spy(curves, **kw):
        seen.update(curves=curves, **kw)
        return real(curves, **kw)

    real = vit.maps.plots.plot_learning_curves
    monkeypatch.setattr(plot_curve, "plot_learning_curves", spy)
    out = tmp_path / "steps.png"
    argv = ["plot_curve.py", str(tmp_path / "a"), "--labels", "A", "--x", "steps"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out)])
    plot_curve.main()
    assert seen["curves"] == {"A": ([100, 200], pytest.approx([0.1, 0.5]))}
    assert seen["xlabel"] == "training steps"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
