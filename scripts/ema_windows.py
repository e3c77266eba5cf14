"""The EMA's window chosen after the fit: averages of other lengths rebuilt from snapshots of the
live weights, each scored on the validation split.

The EMA never touches the trajectory, so one fit saved every k steps holds every average it could
have kept: an average over W steps (decay d = 1 - 1/W, with the callback's warm-up) gives the
weights of step t the mass (1 - d) d^(N - t), and the snapshot at step t_j stands for the steps
since the one before it. W = 0 is the live weights. The fit's own average (its decay) is
rebuilt too and compared with the one it kept, which says how close the rebuild is at this
spacing.

Snapshots: add to the fit `--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint
--trainer.callbacks.every_n_train_steps=50 --trainer.callbacks.save_top_k=-1
'--trainer.callbacks.filename=snap-{step}'` (15 MB each with the recipe's model), then

python scripts/ema_windows.py runs/cpu60/version_N/checkpoints --windows 0 200 400 700 1000 \
    --out experiments/record/results/FOLDER/ema_windows.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vit.commands.evaluate import run_evaluate
from vit.io.checkpoint import load_checkpoint
from vit.train.callbacks.ema import warmed_up_decay

SNAPSHOT = re.compile(r"snap-step=(\d+)\.ckpt$")


def step_decays(last_step: int, window: float) -> list[float]:
    """The decay vit.train.callbacks.EMA applies at each global step 1..last_step (index 0
    unused) for an average over `window` steps: the update at step g is the average's n = g - 1
    (the first, at step 1, copies)."""
    decay = 1.0 - 1.0 / window
    return [0.0, 0.0] + [warmed_up_decay(decay, g - 1) for g in range(2, last_step + 1)]


def snapshot_masses(steps: Sequence[int], window: float) -> list[float]:
    """The share of the weights that each snapshot carries in an EMA over `window` steps (0:
    the live weights) at the last step, for snapshots at the increasing global `steps` (from 1).
    Each stands for the steps since the one before (the first for all up to it): exact when the
    weights held still between snapshots, and for a snapshot at every step. They sum to 1."""
    if steps[0] < 1 or any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError(f"snapshot steps must increase from 1; got {list(steps)}")
    if not (window == 0 or window > 1):
        raise ValueError(f"window={window}: expected 0 (the live weights) or more than 1 step")
    if window == 0:
        return [0.0] * (len(steps) - 1) + [1.0]
    d = step_decays(steps[-1], window)
    # the weight of step g at the end: (1 - d_g) times every later decay (step 1 copies: 1 - 0)
    coefficient, later = [0.0] * (steps[-1] + 1), 1.0
    for g in range(steps[-1], 0, -1):
        coefficient[g] = (1.0 - d[g]) * later
        later *= d[g]
    masses, start = [], 1
    for step in steps:
        masses.append(math.fsum(coefficient[start : step + 1]))
        start = step + 1
    return masses


def rebuilt_average(states: Sequence[dict[str, torch.Tensor]], masses: Sequence[float]) -> dict:
    """The snapshots' weights mixed by `masses` (float64 sums); integer buffers from the last."""
    out = {}
    for name, last in states[-1].items():
        if last.is_floating_point():
            total = sum(m * s[name].double() for m, s in zip(masses, states, strict=True))
            out[name] = total.to(last.dtype)
        else:
            out[name] = last.clone()
    return out


def read_snapshots(folder: Path) -> tuple[list[int], list[dict[str, torch.Tensor]], dict[str, Any]]:
    """The live weights of every snap-step=N.ckpt in `folder` up to its last.ckpt's step, and of
    last.ckpt, by step; and last.ckpt itself."""
    last = load_checkpoint(folder / "last.ckpt")
    if not isinstance(last.get("current_model_state"), dict):
        raise ValueError(f"{folder}/last.ckpt has no live weights: the fit ran without an EMA")
    found = {}
    for path in folder.glob("snap-step=*.ckpt"):
        ckpt = load_checkpoint(path)
        found[int(SNAPSHOT.search(path.name).group(1))] = ckpt["current_model_state"]
    if not found:
        raise ValueError(f"{folder} holds no snap-step=N.ckpt: see this script's docstring")
    end = int(last["global_step"])
    found[end] = last["current_model_state"]
    # the average last.ckpt kept is of its own step: later snapshots have no part in it
    steps = sorted(step for step in found if step <= end)
    return steps, [found[s] for s in steps], last


def score(last: dict[str, Any], weights: dict[str, torch.Tensor], split: str, tmp: Path) -> dict:
    """vit-evaluate's top-1 and NLL of `weights` on `split`, through a checkpoint like last.ckpt."""
    ckpt = {k: v for k, v in last.items() if k not in ("current_model_state", "optimizer_states")}
    ckpt["state_dict"] = weights
    path = tmp / "weights.ckpt"
    torch.save(ckpt, path)
    result = run_evaluate([str(path), "--split", split, "--no-flip", "--output-dir", str(tmp)])
    return {"top1": result["top1"], "nll": result["nll"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", type=Path, help="a run's checkpoints folder")
    parser.add_argument("--windows", type=float, nargs="+", default=[0, 200, 400, 700, 1000])
    parser.add_argument(
        "--decay",
        type=float,
        default=0.999,
        help="the fit's EMA decay (a fit_fraction cap is not rebuilt)",
    )
    parser.add_argument("--split", choices=("val", "test"), default="val")
    parser.add_argument("--out", type=Path, required=True, help="the table, as JSON")
    ns = parser.parse_args(argv)

    steps, states, last = read_snapshots(ns.checkpoints)
    spacing = sorted({b - a for a, b in zip(steps, steps[1:], strict=False)})
    print(f"{len(steps)} snapshots, steps {steps[0]}-{steps[-1]}, spacing {spacing[:3]}")
    kept = last["state_dict"]
    own = rebuilt_average(states, snapshot_masses(steps, 1.0 / (1.0 - ns.decay)))
    floats = [k for k in kept if kept[k].is_floating_point()]  # not the metrics' counts
    gap = max((own[k].double() - kept[k].double()).abs().max().item() for k in floats)
    size = max(kept[k].double().abs().max().item() for k in floats)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        kept_score = score(last, kept, ns.split, Path(tmp))
        print(
            f"the fit's own average (decay {ns.decay}): {kept_score}; rebuilt: max |diff| "
            f"{gap:.3g} (largest weight {size:.3g})"
        )
        for window in ns.windows:
            weights = rebuilt_average(states, snapshot_masses(steps, window))
            row = {"window_steps": window, **score(last, weights, ns.split, Path(tmp))}
            print(row)
            rows.append(row)
    table = {
        "checkpoints": str(ns.checkpoints),
        "split": ns.split,
        "final_step": steps[-1],
        "snapshots": len(steps),
        "fit_decay": ns.decay,
        "fit_average": kept_score,
        "rebuilt_fit_average_max_abs_diff": gap,
        "largest_weight": size,
        "windows": rows,
    }
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
