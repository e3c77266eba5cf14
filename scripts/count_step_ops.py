"""A CPU proxy for a training step's kernel launches: the aten ops dispatched by one optimizer step
of a recipe's model, counted by torch.profiler, phase by phase (augmentation, forward and loss,
backward, optimizer, weight average). On a GPU each dispatched op is about one kernel launch, and
a step the GPU waits for is one whose launches outnumber its work; the count is the same on any
machine, so it can be measured here and compared before and after a change.

    python scripts/count_step_ops.py                                  # gpu8.yaml, batch 512
    python scripts/count_step_ops.py --config experiments/cpu60.yaml --batch 128
    python scripts/count_step_ops.py --out experiments/record/benchmarks/step_ops.md --label NAME
    python scripts/count_step_ops.py --augment grouped     # the augmentation as on a CPU
    python scripts/count_step_ops.py --compile-model       # the network compiled, as in the fit

The augmentation runs as on a GPU: every op on the whole batch, eager, or compiled where the
config sets data.compile_augment. A compiled graph's fused loops are no aten ops: their count
(inductor's generated kernels, about one GPU launch each) is added to the phase's aten ops.
With --compile-model and a recipe whose compile_mode is reduce-overhead, the step is also
counted as a GPU fit launches it: the network's forward and backward graphs one CUDA-graph
replay each, everything outside them as counted.
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
from torch._inductor import metrics
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
NETWORK_PHASES = ("forward+loss", "backward")  # the compiled network's: CUDA graphs on a GPU


def build(config: dict, batch: int, augment_way: str = "config") -> tuple:
    """The recipe's module (eager, float32), optimizer, EMA and augmentation (with the way it
    runs: config = compiled where data.compile_augment is set, else ungrouped), and one batch."""
    data = config.get("data") or {}
    if augment_way == "config":
        augment_way = "compiled" if data.get("compile_augment") else "ungrouped"
    model_cfg = dict(config.get("model") or {})
    model_cfg["torch_compile"] = False  # eager: every op is dispatched where it can be counted
    module = ViTClassifier(**model_cfg)
    optimizer = build_optimizer(module.model, module.optimizer_config)
    if hasattr(optimizer, "ns_dtype"):  # Muon's iterations as on a GPU, whatever this CPU's
        optimizer.ns_dtype = torch.bfloat16  # bf16, and every shape in one padded stack
        optimizer.one_stack = True
    ema_args = next(
        (c.get("init_args", {}) for c in config["trainer"].get("callbacks", [])
         if c["class_path"].endswith(".EMA")),
        {"decay": 0.999},
    )  # fmt: skip
    ema = EMA(**ema_args)
    # what Lightning's WeightAveraging.setup builds; the fit's updates go through the callback
    ema._average_model = AveragedModel(module, multi_avg_fn=ema._update, use_buffers=True)
    augment = TrainAugment(
        padding=data.get("crop_padding", 4),
        hflip=data.get("hflip", True),
        trivial=data.get("trivial_augment", False),
        rand_ops=data.get("rand_augment_ops", 0),
        rand_magnitude=data.get("rand_augment_magnitude", 9),
        compiled=augment_way == "compiled",
    )
    generator = torch.Generator().manual_seed(0)
    side = module.model.patch_embed.img_size
    images = torch.randint(0, 256, (batch, 3, side, side), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, module.model.num_classes, (batch,), generator=generator)
    return module, optimizer, ema, (augment, augment_way), images, labels


def augmented(augment: TrainAugment, way: str, images: torch.Tensor) -> torch.Tensor:
    """The batch augmented `way` (grouped: per op on the images that drew it, as on a CPU)."""
    gen = torch.Generator().manual_seed(1)
    if way == "ungrouped":
        return augment.apply(images, augment.draw(len(images), generator=gen), grouped=False)
    return augment(images, generator=gen)  # grouped on a CPU; compiled: one graph


GRAPH_CALL = "## Call CompiledFxGraph"  # the profiler's range around a compiled graph's run


def top_level_ops(events: list) -> tuple[Counter, Counter, int]:
    """A phase's top-level aten ops (a foreach op counts once, as on a GPU, where it is one
    multi-tensor kernel; on a CPU it runs per tensor underneath), split into those dispatched
    outside any compiled graph and those a compiled graph's code dispatches (its extern kernels:
    matrix products, attention), and the number of compiled-graph runs: under CUDA graphs each
    run is one replay, whatever it holds."""
    outside, inside = Counter(), Counter()
    calls = 0
    for e in events:
        if e.name.startswith(GRAPH_CALL):
            calls += 1
        parent = e.cpu_parent
        if not e.name.startswith("aten::") or (parent and parent.name.startswith("aten::")):
            continue
        while parent is not None and not parent.name.startswith(GRAPH_CALL):
            parent = parent.cpu_parent
        (outside if parent is None else inside)[e.name] += 1
    return outside, inside, calls


def step(parts: tuple, record: dict[str, Counter], compiled: dict[str, int]) -> None:
    """One training step, each phase's top-level aten ops counted into `record`, and the kernels
    inductor generates for a phase into `compiled` (in the first step, where it compiles)."""
    module, optimizer, ema, (augment, way), images, labels = parts
    smoothing = module.hparams.label_smoothing

    def phase(name: str, run):  # noqa: ANN001, ANN202
        kernels_before = metrics.generated_kernel_count
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = run()
        if made := metrics.generated_kernel_count - kernels_before:
            compiled[name] = made  # each generated kernel runs once per call of its graph
        outside, inside, calls = top_level_ops(prof.events())
        record[name] = outside + inside
        if compiled.get(name):
            record[name]["inductor kernels"] = compiled[name]
        # on a GPU under CUDA graphs (the network's compile_mode reduce-overhead): the ops
        # outside its graphs, and one replay per graph run
        record[f"{name} (CUDA graphs)"] = outside + Counter({"graph replays": calls})
        return out

    x = phase("augment", lambda: preprocess(augmented(augment, way, images)))
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
    p.add_argument(
        "--augment",
        choices=("config", "ungrouped", "compiled", "grouped"),
        default="config",
        help="config: compiled where data.compile_augment is set, else ungrouped (as on a GPU)",
    )
    p.add_argument(
        "--compile-model",
        action="store_true",
        help="compile the network (inductor, static shapes): its forward and backward count "
        "their generated kernels (a GPU fit adds CUDA graphs: one replay for all of them)",
    )
    ns = p.parse_args()
    torch.manual_seed(0)
    config = yaml.safe_load(ns.config.read_text())
    parts = build(config, ns.batch, ns.augment)
    module, way = parts[0], parts[3][1]
    if ns.compile_model:
        module.model.compile(dynamic=False)
    # compiled afresh: from inductor's cache the backward's kernels would load with the forward's
    torch._inductor.config.force_disable_caches = True
    module.train()
    compiled: dict[str, int] = {}
    step(parts, {}, compiled)  # creates the optimizer's and the average's state; compiles
    record: dict[str, Counter] = {}
    step(parts, record, compiled)
    totals = {name: sum(record[name].values()) for name in PHASES}
    totals["step"] = sum(totals.values())
    for name in (*PHASES, "step"):
        top = ", ".join(f"{k} {v}" for k, v in record.get(name, Counter()).most_common(4))
        print(f"{name:>13}: {totals[name]:6d} aten ops" + (f"  ({top})" if top else ""))
    graphed = None  # the network's graphs as replays: what a GPU fit's launches come to
    if ns.compile_model and config["model"].get("compile_mode") == "reduce-overhead":
        network = {n: sum(record[f"{n} (CUDA graphs)"].values()) for n in NETWORK_PHASES}
        graphed = totals["step"] + sum(network[n] - totals[n] for n in NETWORK_PHASES)
        print(f"with CUDA graphs: {graphed} ({', '.join(f'{n} {v}' for n, v in network.items())})")
    if ns.out:
        row = {
            "date": str(datetime.date.today()),
            "label": ns.label,
            "config": str(ns.config.relative_to(REPO) if ns.config.is_absolute() else ns.config),
            "batch": ns.batch,
            "augment_way": way,
            "compiled_model": ns.compile_model,
            "torch": torch.__version__,
            **totals,
            "step_cuda_graphs": graphed,
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
            "bf16 as on a GPU (and, from the row that adds it, every shape in one padded stack, "
            "as on a GPU), one step after a warm-up step; the counts do not depend on the CPU. "
            "Rows from 2026-11-28 on augment as on a GPU (every op on the whole batch; compiled: "
            "aten ops plus inductor's generated kernels, about one launch each); earlier rows "
            "augmented as on a CPU (each op on the images that drew it). *With CUDA graphs*: "
            "where the network is compiled and the recipe's compile_mode is reduce-overhead, "
            "the step's ops with the network's forward and backward graphs counted as one "
            "replay each (their kernels and extern products inside them), as a GPU fit runs "
            "them; the other phases as counted.",
            "",
            "| date | what | config | batch | "
            + " | ".join(PHASES)
            + " | step | with CUDA graphs |",
            "|---|---|---|---|" + "---|" * (len(PHASES) + 2),
        ]
        lines += [
            f"| {r['date']} | {r['label']} | `{r['config']}` | {r['batch']} | "
            + " | ".join(str(r[k]) for k in PHASES)
            + f" | {r['step']} | {r.get('step_cuda_graphs') or '-'} |"
            for r in rows
        ]
        ns.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {ns.out} and {rows_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
