"""Learning curves from runs' own TensorBoard logs: a metric against wall-clock minutes.

python scripts/plot_curve.py runs/cifar10/version_0 [more runs] --out experiments/curve.png

Beside the picture it writes the points it plotted (curve.csv: run, step, minutes, value), so a
later session can compare its runs with these after the run folders are gone.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vit.plots import plot_learning_curves


def read_curve(run: Path, tag: str) -> tuple[list[float], list[float], list[int]]:
    """(minutes since the run's first logged event, values, steps) of one scalar tag."""
    events = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
    if tag not in events.Tags()["scalars"]:
        raise ValueError(f"{run} has no scalar {tag!r}; it has {sorted(events.Tags()['scalars'])}.")
    start = min(e.wall_time for t in events.Tags()["scalars"] for e in events.Scalars(t))
    points = events.Scalars(tag)
    minutes = [(p.wall_time - start) / 60 for p in points]
    return minutes, [p.value for p in points], [p.step for p in points]


def write_points(path: Path, curves: dict[str, tuple[list[float], list[float], list[int]]]) -> None:
    """Every plotted point as one CSV row: run label, step, minutes, value."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["run", "step", "minutes", "value"])
        for label, (minutes, values, steps) in curves.items():
            for m, v, s in zip(minutes, values, steps, strict=True):
                out.writerow([label, s, f"{m:.2f}", f"{v:.4f}"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", type=Path, nargs="+", help="run folders holding TensorBoard events")
    p.add_argument("--tag", default="val/acc")
    p.add_argument("--labels", nargs="*", default=None)
    p.add_argument("--title", default="")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    labels = args.labels or [str(r) for r in args.runs]
    curves = {
        label: read_curve(run, args.tag) for label, run in zip(labels, args.runs, strict=True)
    }
    fig = plot_learning_curves(
        {label: c[:2] for label, c in curves.items()}, title=args.title, ylabel=args.tag
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    write_points(args.out.with_suffix(".csv"), curves)
    for label, (minutes, values, _) in curves.items():
        print(f"{label}: {len(values)} points, last {values[-1]:.4f} at {minutes[-1]:.1f} min")


if __name__ == "__main__":
    main()
