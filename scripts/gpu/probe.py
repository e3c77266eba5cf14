"""The bare training step's throughput, part by part, outside Lightning's loop: what the GPU can
do at a recipe's batch, to set beside the fit's own img/s (scripts/gpu/summary.py). The gap
between them is the loop's host work; the gaps between the parts say which part the GPU waits on.

    python3 scripts/gpu/probe.py --seconds 60 --out probe.json     # gpu8.yaml on the GPU
    python3 scripts/gpu/probe.py --device cpu --batch 16 --seconds 6 --tiny   # the plumbing, here

The model compiles as in the fit (the recipe's compile_mode, bf16 autocast on a GPU); each part
runs for a share of `--seconds` after a warm-up, timed with a device sync at its ends only:
  forward+backward      the network and the loss, gradients dropped
  + optimizer           the same plus the optimizer's step (Muon + AdamW)
  + augment + EMA       the whole step as the fit runs it: batch augmentation on the device,
                        normalisation, and the weight average's update
  (eager augment)       the same with the augmentation eager, where the recipe compiles it
                        (data.compile_augment): what compiling it gains
The parts come from scripts/count_step_ops.py (its `build`), so the two measure one step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from count_step_ops import augmented, build  # noqa: E402

from vit.data.datasets import preprocess  # noqa: E402

PARTS = ("forward+backward", "+ optimizer", "+ augment + EMA", "(eager augment)")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "experiments" / "gpu8.yaml")
    p.add_argument("--batch", type=int, default=None, help="default: the recipe's")
    p.add_argument("--seconds", type=float, default=60.0, help="all parts, warm-ups included")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="depth 2, width 64: the plumbing only")
    p.add_argument("--out", type=Path)
    ns = p.parse_args()
    config = yaml.safe_load(ns.config.read_text())
    batch = ns.batch or config["data"]["batch_size"]
    if ns.tiny:
        config["model"]["network"] |= {"depth": 2, "embed_dim": 64, "num_heads": 4}
    device = torch.device(ns.device)
    t_start = time.perf_counter()
    module, optimizer, ema, (augment, way), images, labels = build(config, batch)
    module.to(device).train()
    ema._average_model.to(device)
    images, labels = images.to(device), labels.to(device)
    model_cfg = config["model"]
    compiled = device.type == "cuda" and model_cfg.get("torch_compile", False)
    if compiled:
        module.model.compile(dynamic=False, mode=model_cfg.get("compile_mode"))
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else contextlib.nullcontext()
    )
    smoothing = module.hparams.label_smoothing
    x_fixed = preprocess(images)

    parts = PARTS if way == "compiled" else PARTS[:3]

    def run(part: int) -> None:
        x = x_fixed
        if part >= 2:
            x = preprocess(augmented(augment, way if part == 2 else "ungrouped", images))
        with autocast:
            loss = F.cross_entropy(module.model(x).float(), labels, label_smoothing=smoothing)
        loss.backward()
        if part >= 1:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if part >= 2:
            ema.update_average(module)

    results: dict = {"config": str(ns.config.name), "batch": batch, "device": str(device)}
    if device.type == "cuda":
        results["card"] = torch.cuda.get_device_name(device)
    for part in range(len(parts)):  # each part's first step compiles or creates state
        run(part)
        run(part)
    sync(device)
    results["warm_up_s"] = round(time.perf_counter() - t_start, 1)
    share = max(0.5, (ns.seconds - results["warm_up_s"]) / len(parts))
    for part, name in enumerate(parts):
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < share:
            for _ in range(10):  # a sync only every 10 steps: the queue stays full
                run(part)
            steps += 10
            sync(device)
        seconds = time.perf_counter() - t0
        results[name] = {"steps": steps, "img_s": round(steps * batch / seconds)}
        print(f"{name:>18}: {results[name]['img_s']:8d} img/s ({steps} steps in {seconds:.1f} s)")
    print(f"warm-up (model build and compile): {results['warm_up_s']} s")
    if ns.out:
        ns.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
