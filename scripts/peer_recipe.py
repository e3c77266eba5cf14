"""Time to accuracy against a standard recipe, on this CPU: a peer ViT trained as a user would
write it, then our 60-minute recipe compressed into a shorter budget, each scored on the test split.

    python scripts/peer_recipe.py --minutes 20 --ours-minutes 4 --name peer-recipe-amx

The peer: vit-pytorch's ViT at ViT-Tiny's size (width 192, depth 6, 3 heads, MLP 768, patch 4:
the model scripts/benchmark.py times), AdamW (lr 1e-3, weight decay 0.05), batch 128, random crop
(padding 4) and horizontal flip, a linear warm-up over the first 5% then a cosine to zero, plain
cross-entropy, bf16 autocast where the CPU multiplies bf16 natively (float32 elsewhere, as
vit-train falls back). It trains on all 50,000 training images, as cpu60.yaml does; two choices
favour it over a user's script: its schedule runs on the clock, so it ends its cosine exactly at
--minutes as ours does, and its crop and flip are our batched ones, so no data loader competes
with the step for the two cores. Its test accuracy is taken every --eval-every minutes with the
clock stopped.

Ours: `vit-train -c experiments/cpu60.yaml` with the TimeBudget at --ours-minutes and
`--test_after_fit true`, which scores the last checkpoint (no validation split: `data.val_size:
0`); a --config that holds images out validates every minute and scores its best checkpoint.
Writes experiments/record/benchmarks/<name>.{json,md}.

--peer-from takes the peer's side from an earlier run's json on the same kind of machine instead of
training it again (the report names that run); the two sides then ran on different days, so the
machine's pace may differ between them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))  # scripts/ is no package: benchmark.py's record writer

from vit.commands.entry import switch_mkl  # noqa: E402

if __name__ == "__main__":  # as vit-train: MKL's AVX2 kernels on AMD CPUs, before torch loads
    switch_mkl()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402
from benchmark import write_record  # noqa: E402

from vit.system.hardware import cpu_has_fast_bf16, cpu_name, vector_flags  # noqa: E402


def peer_model() -> torch.nn.Module:
    try:
        from vit_pytorch import ViT
    except ImportError as err:
        raise SystemExit('the peer needs vit-pytorch: pip install -e ".[bench]"') from err
    return ViT(image_size=32, patch_size=4, num_classes=10, dim=192, depth=6, heads=3,
               dim_head=64, mlp_dim=768)  # fmt: skip


def cifar10(split_val: int = 0) -> tuple:
    """(train images, train labels, test images, test labels) as uint8/int64 tensors, found
    as vit-train finds them (data.source auto)."""
    from vit.train.datamodule import CIFAR10DataModule

    dm = CIFAR10DataModule(val_size=split_val)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    train, test = dm.train_dataset, dm.test_dataset
    return train.images, train.labels, test.images, test.labels


@torch.no_grad()
def accuracy(model, images, labels, dtype) -> float:  # noqa: ANN001
    from vit.data.datasets import preprocess

    model.eval()
    correct = 0
    for i in range(0, len(images), 500):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            logits = model(preprocess(images[i : i + 500]))
        correct += int((logits.argmax(-1) == labels[i : i + 500]).sum())
    model.train()
    return correct / len(images)


def lr_factor(done: float, warm: float = 0.05) -> float:
    """The peer's learning rate over its peak at `done`, the fraction of the budget used: a
    linear warm-up over the first `warm`, then a cosine to zero at the end."""
    if done < warm:
        return done / warm
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (done - warm) / (1 - warm))))


def train_peer(minutes: float, eval_every: float, seed: int, dtype) -> dict:  # noqa: ANN001
    """The peer's fit on the clock; its test accuracy at every eval_every minutes and at the end."""
    from vit.data.augment import random_crop, random_hflip
    from vit.data.datasets import preprocess

    x_train, y_train, x_test, y_test = cifar10()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = peer_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    budget = 60.0 * minutes

    points, used, steps, next_eval = [], 0.0, 0, 60.0 * eval_every
    order, at = torch.randperm(len(x_train), generator=gen), 0
    model.train()
    while used < budget:
        start = time.perf_counter()
        if at + 128 > len(order):
            order, at = torch.randperm(len(x_train), generator=gen), 0
        idx = order[at : at + 128]
        at += 128
        x = preprocess(
            random_hflip(random_crop(x_train[idx], padding=4, generator=gen), generator=gen)
        )
        for group in opt.param_groups:
            group["lr"] = 1e-3 * lr_factor(used / budget)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(x).float(), y_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        used += time.perf_counter() - start
        if used >= next_eval or used >= budget:  # the clock stands still while it scores
            acc = accuracy(model, x_test, y_test, dtype)
            points.append({"minutes": round(used / 60, 2), "steps": steps, "test_acc": acc})
            print(f"peer: {used / 60:.2f} min, {steps} steps, test {acc:.2%}", flush=True)
            next_eval += 60.0 * eval_every
    return {"steps": steps, "test_acc": points[-1]["test_acc"], "curve": points}


def train_ours(minutes: float, seed: int, config: Path) -> dict:
    """vit-train on the recipe with its budget at `minutes`; the test accuracy it reports."""
    cfg = yaml.safe_load(config.read_text())
    for cb in cfg["trainer"]["callbacks"]:
        if cb["class_path"].endswith(".TimeBudget"):
            cb["init_args"]["minutes"] = minutes
    from vit.commands.whole_split import holds_out_nothing

    if not holds_out_nothing(cfg):  # with a validation split: every minute
        cfg["trainer"]["val_check_interval"] = "00:00:01:00"
    cfg["trainer"]["enable_progress_bar"] = False
    with tempfile.TemporaryDirectory() as tmp:
        for logger in cfg["trainer"]["logger"]:
            logger["init_args"]["save_dir"] = tmp
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        cmd = [sys.executable, "-c", "from vit.commands.entry import train; train()", "-c", str(path),
               "--seed_everything", str(seed), "--data.seed", str(seed), "--test_after_fit", "true"]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=REPO)
        metrics = next(Path(tmp).glob("*/version_*/metrics.csv")).read_text().splitlines()
    return read_metrics(metrics)


def read_metrics(lines: list[str]) -> dict:
    """The steps and the test accuracy from a CSVLogger's metrics.csv; the best val/acc, None
    for a fit without a validation split."""
    import csv

    rows = list(csv.DictReader(lines))
    test = [float(r["test/acc"]) for r in rows if r.get("test/acc")]
    steps = max(int(r["step"]) for r in rows if r.get("step"))
    val = [float(r["val/acc"]) for r in rows if r.get("val/acc")]
    return {"steps": steps, "test_acc": test[-1], "best_val_acc": max(val) if val else None}


def load_peer(path: Path, dtype: str) -> dict:
    """The peer's side of an earlier run's json, refused unless it trained in `dtype` (a bf16 peer
    against a float32 fit, or back, compares the arithmetic, not the recipes)."""
    try:
        earlier = json.loads(path.read_text())
        peer, minutes = earlier["peer"], float(earlier["peer_minutes"])
        trained = peer["steps"] > 0 and bool(peer["curve"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--peer-from {path}: not a peer_recipe.py json with the peer's fit "
                         f"({err}); give one that experiments/record/benchmarks holds, e.g. "
                         "peer-recipe-amx.json") from err  # fmt: skip
    if not trained:
        raise ValueError(f"--peer-from {path}: its peer did not train (--skip peer there); give a "
                         "json whose peer ran")  # fmt: skip
    if earlier.get("dtype") != dtype:
        raise ValueError(f"--peer-from {path}: its peer trained in {earlier.get('dtype')}, this "
                         f"run trains in {dtype}; take a peer of the same precision, or drop "
                         "--peer-from to train the peer here")  # fmt: skip
    source = {k: earlier.get(k) for k in ("date", "cpu", "flags")}
    return {"peer": peer, "peer_minutes": minutes, "peer_from": {"file": path.name, **source}}


def markdown(result: dict) -> str:
    peer, ours = result["peer"], result["ours"]
    # the peer scores at the first step past each mark, so its 4-minute score reads 4.02 min: the
    # point nearest our budget, if within 5% of it
    budget = result["ours_minutes"]
    near = min(peer["curve"], key=lambda p: abs(p["minutes"] - budget), default=None)
    if near is not None and abs(near["minutes"] - budget) > 0.05 * budget:
        near = None
    scored = (
        f"best val {ours['best_val_acc']:.2%}"
        if ours.get("best_val_acc") is not None
        else "all 50,000 images, the last checkpoint"
    )
    lines = [
        f"`{result['command']}`",
        "",
        f"{result['date']}, {result['cpu']} ({' '.join(result['flags'])}), torch "
        f"{result['torch']}, {result['dtype']}, seed {result['seed']}.",
        "",
        "| recipe | budget (min) | steps | test top-1 |",
        "|---|---|---|---|",
        f"| peer: vit-pytorch ViT-Tiny, AdamW, crop + flip, warm-up + cosine | "
        f"{result['peer_minutes']:g} | {peer['steps']:,} | {peer['test_acc']:.2%} |",
        f"| ours: cpu60.yaml, budget {result['ours_minutes']:g} min ({scored}) | "
        f"{result['ours_minutes']:g} | {ours['steps']:,} | {ours['test_acc']:.2%} |",
        "",
        "The peer's test top-1 on its clock: "
        + ", ".join(f"{p['minutes']:.1f} min {p['test_acc']:.2%}" for p in peer["curve"]),
        "",
        f"Ours in {result['ours_minutes']:g} minutes against the peer's "
        f"{result['peer_minutes']:g}: {ours['test_acc'] - peer['test_acc']:+.2%} "
        f"({'reached' if ours['test_acc'] >= peer['test_acc'] else 'not reached'}); "
        + (f"the peer at {near['minutes']:.1f} min had {near['test_acc']:.2%}." if near else ""),
    ]
    if not peer["steps"]:
        lines[-1] = "The peer was not run (--skip peer): nothing to compare ours against."
    elif source := result.get("peer_from"):
        lines += ["", f"The peer's side is {source['file']}'s fit ({source['date']}, "
                  f"{source['cpu']}, {' '.join(source['flags'] or [])}), not trained in this run: "
                  "the machine's pace may differ between the two days."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=None, help="the peer's budget (20)")
    p.add_argument("--ours-minutes", type=float, default=4.0, help="our recipe's budget")
    p.add_argument("--eval-every", type=float, default=2.0, help="minutes between peer scores")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", type=Path, default=REPO / "experiments" / "cpu60.yaml")
    p.add_argument("--skip", choices=["peer", "ours"], default=None, help="run one side only")
    p.add_argument("--peer-from", type=Path, default=None,
                   help="take the peer's fit from an earlier run's json instead of training it")  # fmt: skip
    p.add_argument(
        "--name", default=None, help="write experiments/record/benchmarks/NAME.{json,md}"
    )
    ns = p.parse_args(argv)
    given_minutes = ns.minutes
    ns.minutes = 20.0 if ns.minutes is None else ns.minutes
    for name, value in (("--minutes", ns.minutes), ("--ours-minutes", ns.ours_minutes),
                        ("--eval-every", ns.eval_every)):  # fmt: skip
        if not value > 0:
            p.error(f"{name} must be a positive number of minutes, got {value}")
    if ns.skip != "ours" and not ns.config.is_file():  # before the peer's minutes, not after
        p.error(f"--config {ns.config} is not a file; give a vit-train config, e.g. "
                "experiments/cpu60.yaml")  # fmt: skip
    dtype = torch.bfloat16 if cpu_has_fast_bf16() else None
    precision = "bf16-mixed" if dtype else "float32"
    earlier = None
    if ns.peer_from is not None:
        if ns.skip is not None:
            p.error("--peer-from takes the peer from a file and runs ours: drop --skip")
        try:  # before our minutes, not after
            earlier = load_peer(ns.peer_from, precision)
        except ValueError as err:
            p.error(str(err))
        if given_minutes is not None and given_minutes != earlier["peer_minutes"]:
            p.error(f"--minutes {given_minutes:g}, but the peer in {ns.peer_from} trained "
                    f"{earlier['peer_minutes']:g} minutes; drop --minutes (the file gives it)")  # fmt: skip
    empty = {"steps": 0, "test_acc": float("nan"), "best_val_acc": float("nan"), "curve": []}
    result = {
        "command": "python scripts/peer_recipe.py "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_name(),
        "flags": sorted(vector_flags()),
        "torch": torch.__version__,
        "dtype": precision,
        "seed": ns.seed,
        "peer_minutes": ns.minutes,
        "ours_minutes": ns.ours_minutes,
    }
    if earlier is not None:
        result.update(earlier)
    else:
        result["peer"] = (empty if ns.skip == "peer"
                          else train_peer(ns.minutes, ns.eval_every, ns.seed, dtype))  # fmt: skip
    result["ours"] = empty if ns.skip == "ours" else train_ours(ns.ours_minutes, ns.seed, ns.config)
    text = markdown(result)
    print(text)
    if ns.name:
        write_record(REPO / "experiments" / "record" / "benchmarks", ns.name, result, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
