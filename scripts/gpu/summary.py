"""summary.json of a time-budgeted fit: images/s over the whole fit beside the step's own.

python scripts/gpu/summary.py RUN_DIR --test metrics_test.json --out summary.json

How: the whole fit is global_step x batch_size / the TimeBudget's elapsed seconds in last.ckpt
(from the first training step to the last save: compiles, validations and checkpoints included).
The step's own rate comes from the TensorBoard events of train/lr, logged every
log_every_n_steps with their wall time: each interval between two is (steps x batch) / seconds;
the median over the fit (and per quarter of it, about the curriculum's stages) is the step's
rate, robust to the few intervals that hold a validation or a compile. Those slow intervals
(over 1.5x the median time of their quarter) are listed with their extra seconds: what eats
the gap. The time before the first and after the last logged step (the first step's compile,
the last validation) is `outside_logged_s`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vit.io.checkpoint import load_checkpoint


def scalars(run: Path, tag: str) -> list[tuple[int, float, float]]:
    """(step, wall time, value) of one scalar tag, in step order; [] when it was never logged."""
    events = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
    if tag not in events.Tags()["scalars"]:
        return []
    return sorted((e.step, e.wall_time, e.value) for e in events.Scalars(tag))


def step_rates(points: list[tuple[int, float, float]], batch: int) -> dict:
    """Median img/s of the intervals between logged steps, overall and per quarter of the fit."""
    pairs = zip(points, points[1:], strict=False)  # consecutive logged steps
    spans = [(s1, t1 - t0, (s1 - s0) * batch) for (s0, t0, _), (s1, t1, _) in pairs]
    spans = [s for s in spans if s[1] > 0]
    if not spans:
        return {"step_img_s": None, "step_img_s_by_quarter": [], "slow_intervals": []}
    first, last = spans[0][0], spans[-1][0]
    quarters: list[list[tuple[int, float, int]]] = [[], [], [], []]
    for span in spans:
        quarters[min(3, int(4 * (span[0] - first) / max(1, last - first + 1)))].append(span)
    slow = []
    for quarter in quarters:
        if quarter:
            typical = statistics.median(seconds for _, seconds, _ in quarter)
            slow += [(s, t - typical) for s, t, _ in quarter if t > 1.5 * typical]
    slow.sort(key=lambda x: -x[1])
    return {
        "step_img_s": round(statistics.median(n / t for _, t, n in spans)),
        "step_img_s_by_quarter": [
            round(statistics.median(n / t for _, t, n in q)) if q else None for q in quarters
        ],
        "slow_intervals": [{"until_step": s, "extra_s": round(x, 2)} for s, x in slow[:8]],
    }


def summarize(run: Path, test: Path | None, card: str, fit_exit: int) -> dict:
    config = yaml.safe_load((run / "config.yaml").read_text())
    batch = int(config["data"]["batch_size"])
    ckpt = load_checkpoint(run / "checkpoints" / "last.ckpt")
    budget = ckpt.get("callbacks", {}).get("TimeBudget", {})
    steps, fit_s = int(ckpt["global_step"]), float(budget.get("elapsed_s", 0.0))
    lr = scalars(run, "train/lr")
    rates = step_rates(lr, batch)
    fit_img_s = steps * batch / fit_s if fit_s else None
    gap = None
    if fit_img_s and rates["step_img_s"]:
        gap = round(100 * (1 - fit_img_s / rates["step_img_s"]), 1)
    val = scalars(run, "val/acc")
    start = val[-1][1] - fit_s if val else 0.0  # the fit ends with its last validation
    summary = {
        "card": card,
        "fit_exit": fit_exit,
        "steps": steps,
        "batch_size": batch,
        "epochs": ckpt.get("epoch"),
        "fit_s": round(fit_s, 1),
        "off_schedule_clock_s": round(float(budget.get("off_clock_s", 0.0)), 1),
        "fit_img_s": round(fit_img_s) if fit_img_s else None,
        **rates,
        "gap_pct": gap,
        "outside_logged_s": round(fit_s - (lr[-1][1] - lr[0][1]), 1) if len(lr) > 1 else None,
        "last_lr": lr[-1][2] if lr else None,
        "val_acc_by_minute": [(round((t - start) / 60, 2), round(v, 4)) for _, t, v in val],
    }
    if test is not None and test.is_file():
        result = json.loads(test.read_text())
        summary |= {"test_top1": result.get("top1"), "test_top5": result.get("top5")}
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="the fit's version folder (config.yaml, checkpoints/)")
    p.add_argument("--test", type=Path, default=None, help="vit-evaluate's metrics_test.json")
    p.add_argument("--card", default="")
    p.add_argument("--fit-exit", type=int, default=0)
    p.add_argument("--probe", type=Path, default=None, help="scripts/gpu/probe.py's --out, if run")
    p.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a JSON file to hold under NAME, if it exists (the device returns at most 8 files)",
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    summary = summarize(args.run, args.test, args.card, args.fit_exit)
    attached = [("probe", args.probe)] if args.probe is not None else []  # the bare step
    for item in args.attach:
        name, sep, path = item.partition("=")
        if not (name and sep and path):
            p.error(f"--attach {item!r}: expected NAME=PATH, e.g. diagnose=diagnose.json")
        attached.append((name, Path(path)))
    for name, path in attached:
        if path.is_file():
            summary[name] = json.loads(path.read_text())
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
