"""Learning curves from runs' own TensorBoard logs: a metric against wall-clock minutes.

python scripts/plot_curve.py runs/cifar10/version_0 [more runs] --out experiments/curve.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vit.plots import plot_learning_curves


def read_curve(run: Path, tag: str) -> tuple[list[float], list[float]]:
    """(minutes since the run's first logged event, values) of one scalar tag."""
    events = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
    if tag not in events.Tags()["scalars"]:
        raise ValueError(f"{run} has no scalar {tag!r}; it has {sorted(events.Tags()['scalars'])}.")
    start = min(e.wall_time for t in events.Tags()["scalars"] for e in events.Scalars(t))
    points = events.Scalars(tag)
    return [(p.wall_time - start) / 60 for p in points], [p.value for p in points]


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
    fig = plot_learning_curves(curves, title=args.title, ylabel=args.tag)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    for label, (minutes, values) in curves.items():
        print(f"{label}: {len(values)} points, last {values[-1]:.4f} at {minutes[-1]:.1f} min")


if __name__ == "__main__":
    main()
