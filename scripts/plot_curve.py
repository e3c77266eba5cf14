"""Learning curves from runs' own TensorBoard logs: a metric against wall-clock minutes.

(--x steps plots it against training steps instead: runs on machines of different speed, or with
a step of different cost, compared at equal work.)

python scripts/plot_curve.py runs/cifar10/version_0 [more runs] --out experiments/curve.png

Beside the picture it writes the points it plotted (curve.csv: run, step, minutes, value), so
later runs can be compared with these after the run folders are gone:

python scripts/plot_curve.py runs/cpu60/version_0 --labels "today's run" \
    --from-csv experiments/record/results/2026-11-25-avx512bf16-depth4-curve/curve.csv \
    --only "cpu60.yaml (depth 4), seed 0" --rename "cpu60.yaml (depth 4), seed 0" "the recipe, seed 0" \
    --out experiments/record/results/today/curve.png

(--only picks curves from the --from-csv files; --rename shows one under a new label.)
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vit.maps.plots import plot_learning_curves, save_figure

Curve = tuple[list[float], list[float], list[int]]  # minutes, values, steps


def read_curve(run: Path, tag: str) -> Curve:
    """(minutes since the run's first logged event, values, steps) of one scalar tag."""
    events = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
    if tag not in events.Tags()["scalars"]:
        raise ValueError(f"{run} has no scalar {tag!r}; it has {sorted(events.Tags()['scalars'])}.")
    start = min(e.wall_time for t in events.Tags()["scalars"] for e in events.Scalars(t))
    points = events.Scalars(tag)
    minutes = [(p.wall_time - start) / 60 for p in points]
    return minutes, [p.value for p in points], [p.step for p in points]


def read_points(path: Path) -> dict[str, Curve]:
    """The curves of a curve.csv this script wrote earlier, by label."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a curve.csv written by this script.")
    curves: dict[str, Curve] = {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != ["run", "step", "minutes", "value"]:
            raise ValueError(
                f"{path} has columns {reader.fieldnames}; expected run, step, minutes, value "
                "(a curve.csv written by this script)."
            )
        for row in reader:
            minutes, values, steps = curves.setdefault(row["run"], ([], [], []))
            minutes.append(float(row["minutes"]))
            values.append(float(row["value"]))
            steps.append(int(row["step"]))
    return curves


def write_points(path: Path, curves: dict[str, Curve]) -> None:
    """Every plotted point as one CSV row: run label, step, minutes, value."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["run", "step", "minutes", "value"])
        for label, (minutes, values, steps) in curves.items():
            for m, v, s in zip(minutes, values, steps, strict=True):
                out.writerow([label, s, f"{m:.2f}", f"{v:.4f}"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", type=Path, nargs="*", help="run folders holding TensorBoard events")
    p.add_argument("--tag", default="val/acc")
    p.add_argument("--labels", nargs="*", default=None)
    p.add_argument(
        "--from-csv",
        type=Path,
        action="append",
        default=[],
        help="also plot the curves of a curve.csv written earlier (repeatable)",
    )
    p.add_argument(
        "--only", nargs="+", default=None, help="labels to take from the --from-csv files"
    )
    p.add_argument(
        "--rename",
        nargs=2,
        action="append",
        default=[],
        metavar=("OLD", "NEW"),
        help="show a --from-csv curve under a new label (repeatable)",
    )
    p.add_argument(
        "--x",
        choices=("minutes", "steps"),
        default="minutes",
        help="the horizontal axis: wall-clock minutes (default) or training steps",
    )
    p.add_argument("--title", default="")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if not args.runs and not args.from_csv:
        p.error("give at least one run folder or --from-csv file")
    labels = args.labels or [str(r) for r in args.runs]
    if len(labels) != len(args.runs):
        p.error(
            f"--labels has {len(labels)} labels for {len(args.runs)} run folders; give one per folder"
        )
    earlier: dict[str, Curve] = {}
    for path in args.from_csv:
        earlier.update(read_points(path))  # points of the --tag it was written with

    def require(flag: str, labels) -> None:
        if missing := [label for label in labels if label not in earlier]:
            p.error(
                f"{flag}: no run {missing} among the --from-csv curves; they have {sorted(earlier)}"
            )

    if args.only is not None:
        require("--only", args.only)
        earlier = {label: earlier[label] for label in args.only}
    renames = dict(args.rename)
    require("--rename", renames)
    renamed = [(renames.get(label, label), curve) for label, curve in earlier.items()]
    shown = [*labels, *(label for label, _ in renamed)]
    if clashes := sorted({label for label in shown if shown.count(label) > 1}):
        p.error(
            f"two curves would be shown as {clashes}; give each its own label "
            "(--labels for run folders, --rename or --only for --from-csv curves)"
        )
    # The run folders' event files are read only once every label check has passed.
    curves = {
        label: read_curve(run, args.tag) for label, run in zip(labels, args.runs, strict=True)
    }
    curves.update(renamed)
    by_steps = args.x == "steps"
    fig = plot_learning_curves(
        {label: (c[2] if by_steps else c[0], c[1]) for label, c in curves.items()},
        title=args.title,
        ylabel=args.tag,
        xlabel="training steps" if by_steps else "wall-clock minutes of training",
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, args.out, dpi=110)
    write_points(args.out.with_suffix(".csv"), curves)
    for label, (minutes, values, _) in curves.items():
        print(f"{label}: {len(values)} points, last {values[-1]:.4f} at {minutes[-1]:.1f} min")


if __name__ == "__main__":
    main()
