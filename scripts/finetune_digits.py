"""Fine-tuning measured on data the shipped weights never saw: scikit-learn's 8x8 digits (1,797
images, shipped inside scikit-learn) written out as an image folder with a fixed stratified
train/test split, then experiments/finetune.yaml run twice with the same number of steps, from
scratch and from the shipped weights (vit-tiny-d4-cifar10-cpu60); each best-validation
checkpoint is scored on the test split by vit-evaluate. The budget is steps, not wall-clock
time, so a busy machine changes the minutes but not the figures.

    pip install -e ".[finetune]"
    python scripts/finetune_digits.py --out experiments/record/results/DATE-CPU-finetune-digits

Writes OUT/README.md (command, machine, figures), OUT/metrics.json, and per arm OUT/<arm>/
(config.yaml, metrics.csv, metrics_test.json, confusion_matrix_test.png); data and runs go to
--work.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from vit.io.checkpoint import load_checkpoint
from vit.system import hardware

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "experiments" / "finetune.yaml"
ARMS = {"scratch": "null", "finetuned": "vit-tiny-d4-cifar10-cpu60"}  # --model.init_from


def write_digits(root: Path, *, test_size: int, seed: int) -> dict[str, int]:
    """root/{train,test}/<digit>/NNNN.png: the 8x8 digits as 8-bit grayscale PNGs (0-16 scaled
    to 0-255), split stratified by class with `seed`; returns the image count per split."""
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)  # (1797, 8, 8)
    index = np.arange(len(pixels))
    train, test = train_test_split(
        index, test_size=test_size, stratify=digits.target, random_state=seed
    )
    for split, chosen in (("train", train), ("test", test)):
        for i in chosen:
            folder = root / split / str(digits.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels[i]).save(folder / f"{i:04d}.png")  # 2-D uint8: mode L
    return {"train": len(train), "test": len(test)}


def cpu_name() -> str:
    """The CPU's model name, with the vector extensions that decide the speed and precision."""
    return f"{hardware.cpu_name()} ({', '.join(hardware.vector_flags()) or 'no AVX2'})"


def run_arm(arm: str, work: Path, data: Path, ns: argparse.Namespace) -> dict[str, object]:
    """One fit of the recipe (cwd work/arm: runs/finetune/version_0), then vit-evaluate."""
    cwd = work / arm
    cwd.mkdir(parents=True, exist_ok=True)
    fit = [
        *("fit", "-c", str(RECIPE), f"--model.init_from={ARMS[arm]}"),
        *(f"--data.data_dir={data}", f"--data.cache_dir={work / 'cache'}"),
        *(f"--data.image_size={ns.image_size}", "--data.hflip=false"),  # a mirrored 2 is no 2
        *(f"--trainer.max_epochs={ns.epochs}", "--test_after_fit=false"),
        "--trainer.enable_progress_bar=false",
    ]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vit.commands.entry", *fit], cwd=cwd, check=True)
    seconds = time.perf_counter() - start
    run = cwd / "runs" / "finetune" / "version_0"
    best = sorted((run / "checkpoints").glob("best-*.ckpt"))[-1]
    out = ns.out / arm
    evaluate = "from vit.commands.entry import evaluate; evaluate()"
    subprocess.run(
        [sys.executable, "-c", evaluate, str(best), "--output-dir", str(out)], cwd=cwd, check=True
    )
    for name in ("config.yaml", "metrics.csv"):
        shutil.copy(run / name, out / name)
    scored = json.loads((out / "metrics_test.json").read_text())
    config = yaml.safe_load((run / "config.yaml").read_text())
    return {
        "init_from": None if ARMS[arm] == "null" else ARMS[arm],
        "test_top1": scored["top1"],
        "test_images": scored["num_images"],
        "best_checkpoint": best.name,
        "steps": load_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"],
        "precision": config["trainer"]["precision"],
        "val_size": config["data"]["val_size"],
        "fit_seconds": round(seconds, 1),
        "fit_command": "vit-train "
        + " ".join(fit).replace(str(work), "WORK").replace(str(REPO) + "/", ""),
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the record folder to write")
    p.add_argument("--work", type=Path, default=Path("runs/finetune-digits"), help="data, runs")
    p.add_argument("--epochs", type=int, default=15, help="both arms (the recipe's 15)")
    p.add_argument("--image-size", type=int, default=16, help="side the 8x8 digits go to")
    p.add_argument("--test-size", type=int, default=360, help="test images (stratified)")
    p.add_argument("--seed", type=int, default=0, help="the train/test split's seed")
    ns = p.parse_args(argv)
    ns.out = ns.out.resolve()  # the arms run in their own folders
    if ns.work.exists():
        raise SystemExit(f"--work {ns.work} exists; remove it or choose another (runs restart).")
    data = ns.work / "digits"
    counts = write_digits(data, test_size=ns.test_size, seed=ns.seed)
    results = {arm: run_arm(arm, ns.work.resolve(), data.resolve(), ns) for arm in ARMS}
    record = {
        "data": f"scikit-learn {_sklearn_version()} load_digits: 8x8 grayscale, 10 classes",
        "split": {**counts, "seed": ns.seed, "stratified": True},
        "image_size": ns.image_size,
        "epochs": ns.epochs,
        "cpu": cpu_name(),
        "command": "python scripts/finetune_digits.py " + " ".join(argv or sys.argv[1:]),
        "arms": results,
    }
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "metrics.json").write_text(json.dumps(record, indent=2) + "\n")
    (ns.out / "README.md").write_text(readme(record))
    print(json.dumps({a: r["test_top1"] for a, r in results.items()}, indent=2))
    return record


def readme(record: dict) -> str:
    """The record's page: what was run, on what, and the two figures."""
    arms = record["arms"]
    rows = "\n".join(
        f"| {arm} | {r['init_from'] or 'random (timm init)'} | {r['steps']} | "
        f"**{r['test_top1']:.2%}** | {round((1 - r['test_top1']) * r['test_images'])} of "
        f"{r['test_images']} | {r['fit_seconds'] / 60:.1f} min |"
        for arm, r in arms.items()
    )
    split = record["split"]
    first = next(iter(arms.values()))
    side = record["image_size"]
    return f"""# Fine-tuning the shipped weights on 8x8 digits, against training from scratch

| arm | init_from | steps | test top-1 | test errors | fit time |
|---|---|---|---|---|---|
{rows}

- Data the shipped weights (CIFAR-10 photos) never saw: {record["data"]}.
- Split: stratified, seed {split["seed"]}: {split["train"]} training images ({first["val_size"]}
  of them held out to pick the best checkpoint) and {split["test"]} test images, written as
  PNGs and resized to {side}x{side} by the folder source; the weights' 8x8 position grid is
  resized to {side // 4}x{side // 4}.
- Recipe: experiments/finetune.yaml for {record["epochs"]} epochs ({first["steps"]} steps of 64
  images) in both arms, horizontal flips off; the arms differ only in `--model.init_from`. Its
  AdamW peak of 5e-4 suits starting from trained weights; a higher peak might serve the scratch
  arm better (not tried here).
- What init_from did (the fit's log): every tensor loaded but the head, which starts fresh
  (ten digits are other classes than CIFAR-10's ten), and the learned positions resized from
  the 8x8 patch grid to {side // 4}x{side // 4}.
- Score: each best-validation checkpoint on the test split, by vit-evaluate in float32.
- Machine: {record["cpu"]}, 2 cores, {first["precision"]}: the minutes vary with the machine
  and its load, the figures depend on the steps only.

Command (from the repository root, after `pip install -e ".[finetune]"`):

```bash
{record["command"]}
```

Each arm's `vit-train` command is in metrics.json; per arm: config.yaml (resolved), metrics.csv
(the curve), metrics_test.json and confusion_matrix_test.png from vit-evaluate.
"""


def _sklearn_version() -> str:
    import sklearn

    return sklearn.__version__


if __name__ == "__main__":
    main()
