"""Record what a short, fixed-seed float32 run of the cpu60 recipe does: loss per step, final
weights (live and averaged) and optimizer state. Run it before and after a refactor on the same
machine and compare the two records with --compare: a refactor keeps behaviour when they agree to
float32 rounding.

    python scripts/behaviour_record.py --out /tmp/before        # writes record.json, final.pt
    python scripts/behaviour_record.py --out /tmp/after
    python scripts/behaviour_record.py --compare /tmp/before /tmp/after
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "experiments" / "cpu60.yaml"
# The recipe's model, optimizer, EMA, SPT, LSA and both curricula, on a step budget instead of
# the clock (a time budget is not reproducible), in float32, on a small real subset.
# fmt: off
OVERRIDES = [
    "--trainer.precision", "32-true",
    "--trainer.max_steps", "48",
    "--trainer.val_check_interval", "1.0",
    "--trainer.log_every_n_steps", "1",
    "--trainer.enable_progress_bar", "false",
    "--data.train_subset", "1024",
    "--data.val_size", "256",
    "--data.batch_size", "64",
    "--test_after_fit", "false",
    "--seed_everything", "0",
]
# fmt: on
# how each layout turns the clock budget off: a model option before the options were grouped
# (the layout the pre-refactor record was made with), a callback to leave out since
LAYOUT_OVERRIDES = {"flat": ["--model.time_budget_min", "null"], "nested": []}


def step_budget_config(tmp: Path) -> Path:
    """cpu60.yaml without its TimeBudget callback: the schedules then run on the steps."""
    from vit.commands.float32_overrides import without_compile

    config = yaml.safe_load(CONFIG.read_text())
    callbacks = config["trainer"].get("callbacks", [])
    config["trainer"]["callbacks"] = [
        c for c in callbacks if not c["class_path"].endswith("TimeBudget")
    ]
    # eager, as the record always ran: the refactor oracle compares the code's own arithmetic,
    # which inductor's generated kernels need not keep through an equivalent rewrite
    if "float32_overrides" in config:
        config["float32_overrides"] = without_compile(config["float32_overrides"])
    path = tmp / "cpu60-steps.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(out: Path, layout: str) -> None:
    from vit.commands.train import train_main

    out.mkdir(parents=True, exist_ok=True)
    data = REPO.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        config = CONFIG if layout == "flat" else step_budget_config(Path(tmp))
        args = ["fit", "-c", str(config), *OVERRIDES, *LAYOUT_OVERRIDES[layout]]
        args += ["--data.data_dir", str(data)]
        cwd = Path.cwd()
        os.chdir(tmp)  # the YAML's loggers and checkpoints write to runs/ under it
        try:
            train_main(args)
        finally:
            os.chdir(cwd)
        run_dir = next(Path(tmp).glob("runs/cpu60/version_*"))
        losses = {}
        with open(run_dir / "metrics.csv") as f:
            for row in csv.DictReader(f):
                if row.get("train/loss_step"):
                    losses[int(row["step"])] = float(row["train/loss_step"])
        val = [
            float(row["val/acc"])
            for row in csv.DictReader(open(run_dir / "metrics.csv"))
            if row.get("val/acc")
        ]
        ckpt = torch.load(
            run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False
        )
    torch.save(
        {
            "state_dict": ckpt["state_dict"],
            "current_model_state": ckpt.get("current_model_state"),
            "optimizer": ckpt["optimizer_states"][0]["state"],
        },
        out / "final.pt",
    )
    record = {
        "config": str(CONFIG.relative_to(REPO)),
        "overrides": OVERRIDES,
        "layout": layout,
        "global_step": ckpt["global_step"],
        "train_loss": losses,
        "val_acc": val,
    }
    (out / "record.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {out}/record.json and final.pt: {len(losses)} losses, val/acc {val}")


def flatten(tree: object, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {
            k: v for key, sub in tree.items() for k, v in flatten(sub, f"{prefix}/{key}").items()
        }
    return {}


def compare(a: Path, b: Path) -> int:
    ra, rb = (json.loads((p / "record.json").read_text()) for p in (a, b))
    la, lb = ra["train_loss"], rb["train_loss"]
    worst_loss = max(abs(la[k] - lb[k]) for k in la) if la.keys() == lb.keys() else float("inf")
    ta, tb = (flatten(torch.load(p / "final.pt", weights_only=False)) for p in (a, b))
    same_keys = ta.keys() == tb.keys()
    worst = (
        max(((x - tb[k]).abs().max().item() for k, x in ta.items()), default=0.0)
        if same_keys
        else float("inf")
    )
    print(
        f"steps: {len(la)} vs {len(lb)}; largest loss difference {worst_loss:.3g}; "
        f"tensors: {len(ta)} vs {len(tb)}, same names {same_keys}; largest weight/state "
        f"difference {worst:.3g}; val/acc {ra['val_acc']} vs {rb['val_acc']}"
    )
    ok = worst_loss <= 1e-5 and worst <= 1e-5 and ra["val_acc"] == rb["val_acc"]
    print("same behaviour" if ok else "DIFFERENT")
    return 0 if ok else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path)
    p.add_argument("--layout", choices=tuple(LAYOUT_OVERRIDES), default="nested")
    p.add_argument("--compare", nargs=2, type=Path)
    ns = p.parse_args()
    sys.exit(compare(*ns.compare) if ns.compare else run(ns.out, ns.layout))
