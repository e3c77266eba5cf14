"""The 60-minute recipe's own training step, timed phase by phase at each of its shapes: what the
hour spends its time on, and how many steps a variant of the step would make in it.

    python scripts/recipe_step.py --name recipe-step-amx              # every variant, one run
    python scripts/recipe_step.py --variants baseline compiled --rounds 3
    python scripts/recipe_step.py --against-fit 5 --name fit-vs-bare-amx  # the fit's own step

One step as the fit runs it on a CPU: the batch augmented on the host (crop + flip, grouped),
resized to the curriculum's side, forward and loss under bf16 autocast where the CPU has native
bf16 (float32 elsewhere, as vit-train falls back), backward, Muon with AdamW, zero_grad, the EMA.
The curricula's stages are cpu60.yaml's (side, patch-drop rate) pairs, each holding a share of
the budget's minutes; steps in the hour = 3600 s x sum(share / step time). Variants and the
baseline are timed interleaved, round by round, so a machine's drift hits all alike; compare
them within one run only. Writes experiments/record/benchmarks/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import importlib.util
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
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
from lightning.pytorch.callbacks import Callback  # noqa: E402

from vit.system import malloc  # noqa: E402
from vit.system.hardware import cpu_has_fast_bf16, cpu_name, vector_flags  # noqa: E402

PHASES = ("augment", "forward+loss", "backward", "optimizer", "ema")


def _script(name: str):  # noqa: ANN202  (scripts/ is no package: reuse its recipe builder)
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stages(config: dict) -> list[tuple[float, int, float]]:
    """(share of the budget, side, patch-drop rate) for each span between the curricula's
    boundaries, from the config's ResolutionSchedule and PatchDropSchedule."""
    callbacks = {c["class_path"].rsplit(".", 1)[-1]: c.get("init_args", {})
                 for c in config["trainer"]["callbacks"]}  # fmt: skip
    sides = callbacks.get("ResolutionSchedule", {}).get("stages", [[0, 32]])
    drops = callbacks.get("PatchDropSchedule", {}).get("stages", [[0, 0.0]])
    cuts = sorted({0.0, *(s[0] for s in sides), *(d[0] for d in drops)}) + [1.0]
    out = []
    for start, end in zip(cuts, cuts[1:], strict=False):
        side = [s for f, s in sides if f <= start][-1]
        drop = [d for f, d in drops if f <= start][-1]
        out.append((end - start, int(side), float(drop)))
    return out


def variant_config(config: dict, variant: str) -> dict:
    """A copy of the config; for KEY.PATH=VALUE, with that one setting changed (VALUE as YAML)."""
    cfg = json.loads(json.dumps(config))
    if "=" in variant:
        path, value = variant.split("=", 1)
        *parents, leaf = path.split(".")
        node = cfg
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = yaml.safe_load(value)
    return cfg


def split_compiled(variant: str) -> tuple[str, bool]:
    """compiled+KEY.PATH=VALUE -> (KEY.PATH=VALUE, True): that setting, the network compiled;
    any other variant -> (variant, False)."""
    if variant.startswith("compiled+"):
        return variant.removeprefix("compiled+"), True
    return variant, False


def variant_batch(variant: str, batch: int) -> int:
    """batch-N: the step at batch N instead of the config's."""
    return int(variant.removeprefix("batch-")) if variant.startswith("batch-") else batch


def embed_every_patch_then_drop(model: torch.nn.Module) -> None:
    """Patch dropout in timm's order, the model's own until it drew the kept patches first:
    every patch embedded and positioned, then a random part of the tokens dropped (the variants
    drop-after and compiled-drop-after)."""
    from vit.model.embed import keep_index, resize_pos_embed, take_patches

    def embed(x: torch.Tensor) -> torch.Tensor:
        grid, prefix = model.patch_embed.grid(x), model.num_prefix_tokens
        tokens, pos = model.patch_embed(x), model.pos_embed
        if grid != model.patch_embed.grid_size:
            pos = resize_pos_embed(pos, new_grid=grid, num_prefix_tokens=prefix)
        if model.cls_token is not None:
            tokens = torch.cat([model.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)
        tokens = model.pos_drop(tokens + pos)
        rate = model.patch_drop_rate if model.training else 0.0
        keep = keep_index(x.shape[0], grid * grid, rate, device=x.device)
        if keep is None:
            return tokens
        return torch.cat([tokens[:, :prefix], take_patches(tokens[:, prefix:], keep)], dim=1)

    model.embed = embed


def malloc_thresholds(variant: str) -> tuple[int, int, int] | None:
    """The malloc thresholds a variant's steps run under: glibc-malloc (alone, or after another
    variant: compiled-glibc-malloc), glibc's starting 128 KiB held fixed, and every free page
    handed back before each step (the state in which glibc's defaults fault a step's memory in
    again; whether a fit falls into it depends on its heap's layout); any other variant, those of
    vit.system.malloc where its switch is on; None (left alone) where it is off."""
    if variant.endswith("glibc-malloc"):
        return 128 << 10, 128 << 10, 0
    return malloc.KEPT if malloc.status().startswith("on") else None


def split_suffix(variant: str, suffix: str) -> tuple[str, bool]:
    """A variant named with a suffix that modifies another (compiled-drop-after,
    compiled-glibc-malloc): the other variant (baseline where none is named), and whether the
    suffix was there."""
    return variant.removesuffix(suffix).removesuffix("-") or "baseline", variant.endswith(suffix)


def make_step(config: dict, batch: int, variant: str, dtype: torch.dtype | None) -> Callable:
    """A function (side, drop) -> {phase: seconds} running one training step of `variant`."""
    ops = _script("count_step_ops")
    thresholds = malloc_thresholds(variant)
    variant, trim_first = split_suffix(variant, "glibc-malloc")
    variant, drop_after = split_suffix(variant, "drop-after")
    setting, compiled_with = split_compiled(variant)
    cfg = variant_config(config, setting)
    batch = variant_batch(variant, batch)
    module, optimizer, ema, _, images, labels = ops.build(cfg, batch, augment_way="ungrouped")
    if hasattr(optimizer, "ns_dtype"):  # build() sets a GPU's; the fit's, on this CPU
        from vit.train.muon import iteration_dtype

        optimizer.ns_dtype = iteration_dtype(module.model.parameters())
        optimizer.one_stack = variant == "one-stack"  # every shape in one padded stack
    from vit.data.augment import TrainAugment
    from vit.data.datasets import preprocess

    data = cfg.get("data") or {}
    augment = TrainAugment(padding=data.get("crop_padding", 4), hflip=data.get("hflip", True))
    module.model.set_dynamic_img_size(True)
    if drop_after:
        embed_every_patch_then_drop(module.model)
    module.train()
    network = module.model
    if variant == "compiled-step":  # the network compiled, and the optimizer's arithmetic
        network = torch.compile(module.model, dynamic=False)
        optimizer.compiled = True  # optimizer.compile: true (MuonAdamW's compiled update)
    elif variant == "compiled-optimizer":  # the optimizer's arithmetic only
        optimizer.compiled = True
    elif variant.startswith("compiled"):  # compiled, compiled-MODE (max-autotune...), compiled+SET
        mode = "" if compiled_with else variant.removeprefix("compiled").removeprefix("-")
        network = torch.compile(module.model, dynamic=False, mode=mode or None)
    smoothing = module.hparams.label_smoothing
    ema_every = int(variant.split("-")[-1]) if variant.startswith("ema-every-") else 1
    count = {"steps": 0}
    gen = torch.Generator().manual_seed(0)

    def one(side: int, drop: float) -> dict[str, float]:
        if thresholds is not None:  # interleaved variants may differ: each sets its own
            malloc.set_thresholds(*thresholds)
        if trim_first:
            malloc.trim()
        module.model.set_patch_drop(drop)
        times: dict[str, float] = {}
        t = time.perf_counter()

        def mark(name: str) -> None:
            nonlocal t
            now = time.perf_counter()
            times[name] = times.get(name, 0.0) + now - t
            t = now

        x = preprocess(augment(images, generator=gen))
        if side != x.shape[-1]:
            x = F.interpolate(x, size=(side, side), mode="bilinear", antialias=True)
        mark("augment")
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(network(x).float(), labels, label_smoothing=smoothing)
        mark("forward+loss")
        loss.backward()
        mark("backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mark("optimizer")
        count["steps"] += 1
        if count["steps"] % ema_every == 0:
            ema.update_average(module)
        mark("ema")
        return times

    return one


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "experiments" / "cpu60.yaml")
    p.add_argument("--batch", type=int, default=None, help="default: the config's batch_size")
    p.add_argument("--variants", nargs="+", default=["baseline", "compiled", "ema-every-4"],
                   help="baseline, compiled (the network under torch.compile), compiled-step (the "
                   "optimizer's update too: optimizer.compile), compiled-optimizer (the update "
                   "only), one-stack (Muon's shapes in one padded stack, as on a GPU), compiled-MODE "
                   "(max-autotune, ...), ema-every-K, batch-N, glibc-malloc (the baseline under glibc's "
                   "malloc thresholds as they start, free pages handed back before each step: "
                   "vit/system/malloc.py; VARIANT-glibc-malloc, another variant so), drop-after or "
                   "compiled-drop-after (every "
                   "patch embedded, then dropped: the order before), KEY.PATH=VALUE (one config "
                   "setting changed, e.g. model.network.mlp_ratio=4), or compiled+KEY.PATH=VALUE "
                   "(that setting, the network compiled)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--alternate", action="store_true",
                   help="reverse the variants' order every other round: where a step's speed "
                   "depends on what ran before it (the heap's state), each variant runs first "
                   "as often as last")  # fmt: skip
    p.add_argument("--steps", type=int, default=8, help="timed steps per stage, variant, round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per stage first")
    p.add_argument(
        "--name", default=None, help="write experiments/record/benchmarks/NAME.{json,md}"
    )
    p.add_argument("--profile", nargs=2, metavar=("SIDE", "DROP"), default=None,
                   help="instead: torch.profiler's table of the first variant's steps at one "
                   "stage (e.g. 16 0.0), the ops by their own time, written to --name's .txt")  # fmt: skip
    p.add_argument("--fit-log", type=Path, default=None,
                   help="a cpu60 fit's TensorBoard folder (runs/cpu60/version_N): its median "
                   "time per step in each stage, beside the timed steps of the first variant")  # fmt: skip
    p.add_argument("--spy", type=Path, default=None,
                   help="instead: the share of a running fit's samples in each part of its loop, "
                   "from py-spy's raw output, or its .gz (py-spy record --pid PID --duration 20 "
                   "--rate 40 --nonblocking --format raw -o FILE)")  # fmt: skip
    p.add_argument("--against-fit", type=int, default=0, metavar="ROUNDS",
                   help="instead: ROUNDS times, a short vit-train fit of the config (its first "
                   "stage) for each --fit-args, then the bare step at that stage: each one's "
                   "median ms per step, and the fit's ratio to the bare step beside it")  # fmt: skip
    p.add_argument("--fit-args", nargs="+", default=[""],
                   help="with --against-fit, one fit per string of extra vit-train options, e.g. "
                   "'' '--trainer.enable_progress_bar false'")  # fmt: skip
    p.add_argument("--fit-steps", type=int, default=150, help="with --against-fit")
    ns = p.parse_args(argv)
    config = yaml.safe_load(ns.config.read_text())
    batch = ns.batch or config["data"]["batch_size"]
    dtype = torch.bfloat16 if cpu_has_fast_bf16() else None
    plan = stages(config)
    torch.manual_seed(0)
    if ns.profile:
        import torch._inductor.config as inductor

        inductor.cpp.enable_kernel_profile = True  # a compiled variant's kernels, each by name
        return profile_stage(make_step(config, batch, ns.variants[0], dtype), ns)
    if ns.spy:
        print(spy_shares(ns.spy))
        return 0
    if ns.against_fit:
        return against_fit(config, batch, dtype, plan[0], ns)
    steps = {v: make_step(config, batch, v, dtype) for v in ns.variants}
    for run in steps.values():  # compile each shape and warm the allocator, untimed
        for _, side, drop in plan:
            for _ in range(ns.warmup):
                run(side, drop)
    # per variant and stage: each round's mean phase times
    rounds: dict[str, dict[str, list[dict[str, float]]]] = {v: {} for v in ns.variants}
    for r in range(ns.rounds):
        order = round_order(list(steps), r, alternate=ns.alternate)
        for _, side, drop in plan:
            for v in order:
                run = steps[v]
                total: dict[str, float] = dict.fromkeys(PHASES, 0.0)
                for _ in range(ns.steps):
                    for k, s in run(side, drop).items():
                        total[k] += s / ns.steps
                rounds[v].setdefault(f"{side}px drop {drop}", []).append(total)
    result = summarize(plan, rounds, batch=batch, dtype=dtype)
    if ns.fit_log:
        result["fit"] = fit_step_times(ns.fit_log, plan, minutes=budget_minutes(config))
    text = markdown(result, ns)
    print(text)
    if ns.name:
        write_record(REPO / "experiments" / "record" / "benchmarks", ns.name, result, text)
    return 0


def round_order(variants: list[str], r: int, *, alternate: bool) -> list[str]:
    """The order the variants run in round r (from 0): as given, or reversed in odd rounds."""
    return variants[::-1] if alternate and r % 2 else variants


def profile_stage(run: Callable, ns: argparse.Namespace) -> int:
    """Five profiled steps at one (side, drop), after `--warmup` untimed ones: the ops' own
    time and counts (a compiled variant's generated kernels among them, named after the ops
    they fuse), with the phases' wall times for scale."""
    from torch.profiler import ProfilerActivity, profile

    side, drop = int(ns.profile[0]), float(ns.profile[1])
    for _ in range(ns.warmup):
        run(side, drop)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        phases = [run(side, drop) for _ in range(5)]
    per_step = {k: round(1e3 * sum(p[k] for p in phases) / 5, 1) for k in PHASES}
    text = "\n".join([
        "`python scripts/recipe_step.py " + shlex.join(sys.argv[1:]) + "`", "",
        f"{side}px, patch drop {drop}, variant {ns.variants[0]}: 5 steps; phase ms per step "
        f"{per_step} (profiled, so slower than timed)", "",
        prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40,
                                  max_name_column_width=110),
    ])  # fmt: skip
    print(text)
    if ns.name:
        out = REPO / "experiments" / "record" / "benchmarks" / f"{ns.name}.txt"
        out.write_text(text + "\n")
        print(f"wrote {out}")
    return 0


class StepTimer(Callback):
    """A callback for --against-fit's fits (vit-train finds it with scripts/ on PYTHONPATH): the
    median time between training-batch starts after the first 20, appended as a JSON line to
    the file in $RECIPE_STEP_TIMES."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, *args) -> None:  # noqa: ANN002
        self.starts.append(time.perf_counter())

    def on_train_end(self, *args) -> None:  # noqa: ANN002
        gaps = [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)][20:]
        line = {"label": os.environ.get("RECIPE_STEP_LABEL", "fit"),
                "ms": round(1e3 * statistics.median(gaps), 2), "steps": len(gaps)}  # fmt: skip
        with open(os.environ["RECIPE_STEP_TIMES"], "a") as f:
            f.write(json.dumps(line) + "\n")


def against_fit(config: dict, batch: int, dtype, stage: tuple, ns: argparse.Namespace) -> int:  # noqa: ANN001
    """The fit's own time per step against the bare step's, alternated round by round."""
    import subprocess
    import tempfile

    _, side, drop = stage
    run = make_step(config, batch, "baseline", dtype)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        times = Path(tmp) / "times.jsonl"
        env = {**os.environ, "PYTHONPATH": str(REPO / "scripts"), "RECIPE_STEP_TIMES": str(times)}
        for r in range(ns.against_fit):
            for extra in ns.fit_args:
                cmd = [sys.executable, "-c", "from vit.commands.entry import train; train()",
                       "-c", str(ns.config), "--trainer.max_steps", str(ns.fit_steps),
                       "--test_after_fit", "false", "--trainer.logger.save_dir", tmp,
                       "--trainer.callbacks+=recipe_step.StepTimer", *extra.split()]  # fmt: skip
                env["RECIPE_STEP_LABEL"] = f"fit {extra}".strip()
                subprocess.run(cmd, check=True, cwd=REPO, env=env, capture_output=True)
            for _ in range(ns.warmup):
                run(side, drop)
            gaps = []
            for _ in range(ns.fit_steps - 20):
                t = time.perf_counter()
                run(side, drop)
                gaps.append(time.perf_counter() - t)
            fits = [json.loads(line) for line in times.read_text().splitlines()]
            times.unlink()
            bare = round(1e3 * statistics.median(gaps), 2)
            rows += [{"round": r, **f, "bare_ms": bare, "ratio": round(f["ms"] / bare, 3)}
                     for f in fits]  # fmt: skip
            print(rows[-len(fits) :], flush=True)
    labels = list(dict.fromkeys(row["label"] for row in rows))
    cmd = "python scripts/recipe_step.py " + shlex.join(sys.argv[1:])
    lines = [f"`{cmd}`", "",
             f"{datetime.date.today().isoformat()}, {cpu_name()}, torch "
             f"{torch.__version__}, batch {batch}, {'bf16-mixed' if dtype else 'float32'}; the "
             f"config's first stage ({side} px, patch drop {drop}); median ms per step over "
             f"{ns.fit_steps - 20} steps after 20, each fit followed by the bare step.", "",
             "| round | fit | fit ms | bare ms | fit / bare |", "|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {x['round']} | {x['label']} | {x['ms']} | {x['bare_ms']} | {x['ratio']:.2f}x |"
              for x in rows]  # fmt: skip
    lines += ["", "| fit | median of fit / bare |", "|---|---|"]
    for label in labels:
        ratios = [x["ratio"] for x in rows if x["label"] == label]
        lines.append(f"| {label} | {statistics.median(ratios):.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if ns.name:
        write_record(ns.name, rows, text)
    return 0


# the parts of a fit's loop, each by a frame its samples pass through (the first that matches)
LOOP_PARTS = (
    ("validation", "evaluation_loop"),
    ("checkpoint writes", "save_checkpoint"),
    ("metrics (torchmetrics)", "torchmetrics/"),
    ("logging (self.log, loggers)", "LightningModule.log ("),
    ("forward and loss", "_shared_step"),
    ("backward", "_engine_run_backward"),
    ("EMA", "update_average"),
    ("optimizer (Muon, AdamW)", "vit/train/muon.py"),
    ("augmentation, normalisation", "on_after_batch_transfer"),
    ("zero_grad", "zero_grad"),
    ("progress bar thread", "callbacks/progress/"),
    ("data loading", "torch/utils/data/"),
)


def spy_shares(path: Path) -> str:
    """A Markdown table: each loop part's share of py-spy's samples (collapsed stacks)."""
    counts = dict.fromkeys([name for name, _ in LOOP_PARTS] + ["the rest"], 0)
    total = 0
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        total += int(n)
        part = next((name for name, frame in LOOP_PARTS if frame in stack), "the rest")
        counts[part] += int(n)
    rows = [f"| {name} | {n / total:.1%} |" for name, n in counts.items()]
    return "\n".join(
        [f"{total} samples of {path.name}", "", "| part | share |", "|---|---|", *rows]
    )


def budget_minutes(config: dict) -> float:
    """The config's TimeBudget minutes (60 for cpu60.yaml)."""
    for c in config["trainer"]["callbacks"]:
        if c["class_path"].endswith(".TimeBudget"):
            return float(c["init_args"]["minutes"])
    raise ValueError("the config has no TimeBudget: its stages are no share of minutes")


def fit_step_times(run: Path, plan: list, *, minutes: float) -> dict[str, float | None]:
    """Per stage, the median ms per step of a fit over its logged 50-step spans that lie inside
    the stage (a span holding a validation or a checkpoint write is an outlier the median drops)."""
    times, _, steps = _script("plot_curve").read_curve(run, "train/loss_step")
    out, start = {}, 0.0
    for share, side, drop in plan:
        end = start + share * minutes
        spans = [1e3 * 60 * (t1 - t0) / (s1 - s0)
                 for t0, t1, s0, s1 in zip(times, times[1:], steps, steps[1:], strict=False)
                 if start + 0.5 <= t0 and t1 <= end - 0.5 and s1 > s0]  # fmt: skip
        out[f"{side}px drop {drop}"] = round(statistics.median(spans), 1) if spans else None
        start = end
    return out


def summarize(plan, rounds, *, batch: int, dtype) -> dict:  # noqa: ANN001
    """Median over rounds of each phase; steps in the hour per variant; ratios to the first."""
    out: dict = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_name(),
        "flags": sorted(vector_flags()),
        "torch": torch.__version__,
        "malloc": malloc.status(),
        "batch": batch,
        "dtype": "bf16-mixed" if dtype else "float32",
        "stages": [{"share": s, "side": side, "drop": d} for s, side, d in plan],
        "variants": {},
    }
    for v, by_stage in rounds.items():
        stages_out, per_hour, images = {}, 0.0, variant_batch(v, batch)
        for (share, _, _), (key, rs) in zip(plan, by_stage.items(), strict=True):
            phases = {k: statistics.median(r[k] for r in rs) for k in PHASES}
            step = sum(phases.values())
            per_hour += 3600 * share / step
            stages_out[key] = {"ms": {k: round(1e3 * t, 2) for k, t in phases.items()},
                               "step_ms": round(1e3 * step, 2), "img_s": round(images / step, 1)}  # fmt: skip
        out["variants"][v] = {"stages": stages_out, "batch": images,
                              "steps_per_hour": round(per_hour),
                              "images_per_hour": round(per_hour * images)}  # fmt: skip
    first = next(iter(out["variants"].values()))
    for v in out["variants"].values():
        v["vs_first"] = round(v["steps_per_hour"] / first["steps_per_hour"], 3)
        v["images_vs_first"] = round(v["images_per_hour"] / first["images_per_hour"], 3)
    return out


def markdown(result: dict, ns: argparse.Namespace) -> str:
    cmd = "python scripts/recipe_step.py " + shlex.join(sys.argv[1:])
    lines = [f"`{cmd}`", "",
             f"{result['date']}, {result['cpu']} ({' '.join(result['flags'])}), torch {result['torch']}, batch {result['batch']}, "
             f"{result['dtype']}, {ns.rounds} rounds x {ns.steps} steps per stage (medians"
             f"{'; the order reversed every other round' if ns.alternate else ''}); "
             f"malloc: {result.get('malloc', 'glibc as it starts')}.", "",
             "| variant | stage (share) | " + " | ".join(PHASES) + " | step ms | img/s |",
             "|---" * (len(PHASES) + 4) + "|"]  # fmt: skip
    for v, r in result["variants"].items():
        for (key, s), st in zip(r["stages"].items(), result["stages"], strict=True):
            ms = " | ".join(f"{s['ms'][k]:.1f}" for k in PHASES)
            lines.append(
                f"| {v} | {key} ({st['share']:.2f}) | {ms} | {s['step_ms']:.1f} | {s['img_s']} |"
            )
    if "fit" in result:
        first = next(iter(result["variants"]))
        lines += ["", f"| stage | the fit's ms per step (median) | {first}'s step ms | ratio |",
                  "|---|---|---|---|"]  # fmt: skip
        for key, ms in result["fit"].items():
            timed = result["variants"][first]["stages"][key]["step_ms"]
            ratio = f"{ms / timed:.2f}x" if ms else "-"
            lines.append(f"| {key} | {ms} | {timed} | {ratio} |")
    lines += [
        "",
        "| variant | batch | steps in the hour (step loop only) | vs the first | images | vs the first |",
        "|---|---|---|---|---|---|",
    ]
    for v, r in result["variants"].items():
        lines.append(
            f"| {v} | {r['batch']} | {r['steps_per_hour']:,} | {r['vs_first']:.3f}x "
            f"| {r['images_per_hour']:,} | {r['images_vs_first']:.3f}x |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
