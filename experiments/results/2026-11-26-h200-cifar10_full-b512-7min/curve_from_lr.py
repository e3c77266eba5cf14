"""curve.csv for this run: its TensorBoard events did not come back from the device, only metrics.csv.

The run's schedule (its hparams.yaml: lr, warmup_fraction, time_budget_min; cosine to 0) sets the
learning rate from the wall clock, so each logged lr gives the minutes since training started:
lr / peak = 0.5 * (1 + cos(pi * q)), q = (p - warmup) / (1 - warmup), minutes = budget * p. Each validation
point takes the minutes of the nearest logged lr at or before its step (logged every 50 steps,
about 2 s apart). Run from the repo root: python <this file>; then plot_curve.py --from-csv.
"""

import csv
import math
from pathlib import Path

import yaml

HERE = Path(__file__).parent
HP = yaml.safe_load((HERE / "hparams.yaml").read_text())
PEAK, WARM, BUDGET = HP["lr"], HP["warmup_fraction"], HP["time_budget_min"]
LABEL = "cifar10_full.yaml, batch 512, 7-min budget, H200, seed 0"

rows = list(csv.DictReader((HERE / "metrics.csv").open()))
lr = sorted((int(r["step"]), float(r["train/lr"])) for r in rows if r["train/lr"])


def minutes(step: int) -> float:
    _, value = max((s, v) for s, v in lr if s <= step)
    q = math.acos(max(-1.0, min(1.0, 2 * value / PEAK - 1))) / math.pi
    return BUDGET * (WARM + (1 - WARM) * q)


with (HERE / "curve.csv").open("w", newline="") as f:
    out = csv.writer(f)
    out.writerow(["run", "step", "minutes", "value"])
    for r in rows:
        if r["val/acc"]:
            out.writerow(
                [LABEL, r["step"], f"{minutes(int(r['step'])):.2f}", f"{float(r['val/acc']):.4f}"]
            )
