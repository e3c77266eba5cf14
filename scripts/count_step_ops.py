"""A CPU proxy for a training step's kernel launches: the aten ops dispatched by one optimizer step
of a recipe's model, counted by torch.profiler, phase by phase (augmentation, forward and loss,
backward, optimizer, weight average). On a GPU each dispatched op is about one kernel launch, and
a step the GPU waits for is one whose launches outnumber its work; the count is the same on any
machine, so it can be measured here and compared before and after a change.

    python scripts/count_step_ops.py                                  # gpu8.yaml, batch 512
    python scripts/count_step_ops.py --config experiments/cpu60.yaml --batch 128
    python scripts/count_step_ops.py --out experiments/record/benchmarks/step_ops.md --label NAME
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch.optim.swa_utils import AveragedModel
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vit.data.augment import TrainAugment  # noqa: E402
from vit.data.datasets import preprocess  # noqa: E402
from vit.train.callbacks.ema import EMA  # noqa: E402
from vit.train.module import ViTClassifier  # noqa: E402
from vit.train.optim import build_optimizer  # noqa: E402

PHASES = ("augment", "forward+loss", "backward", "optimizer", "ema")


def build(config: dict, batch: int) -> tuple:
    """The recipe's module (eager, float32), optimizer, EMA and augmentation, and one batch."""
    model_cfg = dict(config.get("model") or {})
    model_cfg["torch_compile"] = False  # eager: every op is dispatched where it can be counted
    module = ViTClassifier(**model_cfg)
    optimizer = build_optimizer(module.model, module.optimizer_config)
    if hasattr(optimizer, "ns_dtype"):
        optimizer.ns_dtype = torch.bfloat16  # as on a GPU, whatever this CPU's bf16
    ema_args = next(
        (c.get("init_args", {}) for c in config["trainer"].get("callbacks", [])
         if c["class_path"].endswith(".EMA")),
        {"decay": 0.999},
    )  # fmt: skip
    ema = EMA(**ema_args)
    # what Lightning's WeightAveraging.setup builds; the fit's updates go through the callback
    ema._average_model = AveragedModel(module, multi_avg_fn=ema._update, use_buffers=True)
    data = config.get("data") or {}
    augment = TrainAugment(
        padding=data.get("crop_padding", 4),
        hflip=data.get("hflip", True),
        trivial=data.get("trivial_augment", False),
        rand_ops=data.get("rand_augment_ops", 0),
        rand_magnitude=data.get("rand_augment_magnitude", 9),
    )
    generator = torch.Generator().manual_seed(0)
    side = module.model.patch_embed.img_size
    images = torch.randint(0, 256, (batch, 3, side, side), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, module.model.num_classes, (batch,), generator=generator)
    return module, optimizer, ema, augment, images, labels


def step(parts: tuple, record: dict[str, Counter] | None) -> None:
    """One training step; with `record`, each phase's aten ops counted into it."""
    module, optimizer, ema, augment, images, labels = parts
    smoothing = module.hparams.label_smoothing

    def phase(name: str, run):  # noqa: ANN001, ANN202
        if record is None:
            return run()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = run()
        # top-level ops only: what the step dispatches (a foreach op counts once, as on a GPU,
        # where it is one multi-tensor kernel; on a CPU it runs per tensor underneath)
        record[name] = Counter(
            e.name
            for e in prof.events()
            if e.name.startswith("aten::")
            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
        )
        return out

    gen = torch.Generator().manual_seed(1)
    x = phase("augment", lambda: preprocess(augment(images, generator=gen)))
    loss = phase(
        "forward+loss",
        lambda: F.cross_entropy(module.model(x).float(), labels, label_smoothing=smoothing),
    )
    phase("backward", loss.backward)
    phase("optimizer", lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=True)))
    phase("ema", lambda: ema.update_average(module))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "experiments" / "gpu8.yaml")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--out", type=Path, help="append a row to this Markdown table (and .json)")
    p.add_argument("--label", default="", help="what this row measures (e.g. the change)")
    ns = p.parse_args()
    torch.manual_seed(0)
    parts = build(yaml.safe_load(ns.config.read_text()), ns.batch)
    module = parts[0]
    module.train()
    step(parts, None)  # the first step creates the optimizer's and the average's state
    record: dict[str, Counter] = {}
    step(parts, record)
    totals = {name: sum(record[name].values()) for name in PHASES}
    totals["step"] = sum(totals.values())
    for name in (*PHASES, "step"):
        top = ", ".join(f"{k} {v}" for k, v in record.get(name, Counter()).most_common(4))
        print(f"{name:>13}: {totals[name]:6d} aten ops" + (f"  ({top})" if top else ""))
    if ns.out:
        row = {
            "date": str(datetime.date.today()),
            "label": ns.label,
            "config": str(ns.config.relative_to(REPO) if ns.config.is_absolute() else ns.config),
            "batch": ns.batch,
            "torch": torch.__version__,
            **totals,
        }
        rows_path = ns.out.with_suffix(".json")
        rows = json.loads(rows_path.read_text()) if rows_path.exists() else []
        rows.append(row)
        rows_path.write_text(json.dumps(rows, indent=1))
        lines = [
            "# aten ops dispatched per optimizer step (a CPU proxy for GPU kernel launches)",
            "",
            "Command: `python scripts/count_step_ops.py --config CONFIG --batch B --out "
            f"{ns.out.relative_to(REPO) if ns.out.is_absolute() else ns.out} --label LABEL`. "
            "Top-level aten ops (a foreach op counts once); eager float32 with Muon's iterations in "
            "bf16 as on a GPU, one step after a warm-up step; the counts do not depend on the CPU.",
            "",
            "| date | what | config | batch | " + " | ".join(PHASES) + " | step |",
            "|---|---|---|---|" + "---|" * (len(PHASES) + 1),
        ]
        lines += [
            f"| {r['date']} | {r['label']} | `{r['config']}` | {r['batch']} | "
            + " | ".join(str(r[k]) for k in PHASES)
            + f" | {r['step']} |"
            for r in rows
        ]
        ns.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {ns.out} and {rows_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
