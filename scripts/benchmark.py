"""Training and inference throughput of our ViT against timm and vit-pytorch, measured in one run.

    python scripts/benchmark.py                      # the full table (peers: pip install -e ".[bench]")
    python scripts/benchmark.py --name cpu-x         # kept: experiments/record/benchmarks/cpu-x.md
    python scripts/benchmark.py --quick              # fewer repeats, batch 128 only
    python scripts/benchmark.py --device cuda --name gpu   # the same table on a GPU
    python scripts/benchmark.py --quick --compile    # every model also under torch.compile
    python scripts/benchmark.py --profile ours-fused vit-pytorch --name profile-x   # where it goes

Every model is built at the same configuration (width, depth, heads, MLP width, patch, image size,
classes); with --compile every model is timed a second time under torch.compile (static shapes, the
default mode), so our compiled step meets the peers' compiled steps. For each precision, full
training steps (forward, backward, AdamW step) and inference forwards are timed interleaved across
models, round after round, after warm-up; the median of the rounds is reported, so a slow moment of
the machine hits every model alike. Peak memory is the growth of the process's peak RSS over two
training steps, measured in a fresh subprocess per model (on a GPU: the growth of the allocator's
peak). The data pipeline (decoded uint8 tensors, batched crop + flip, normalisation) is timed alone
on one thread (on a GPU: loading on one thread, augmentation on the GPU, as in training). Results
go to experiments/record/benchmarks/ as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from vit.commands.entry import switch_mkl
from vit.system import malloc, mkl_amd

if __name__ == "__main__":  # a command: MKL's AVX2 kernels on AMD CPUs, before torch loads
    switch_mkl()

import torch
import torch.nn.functional as F
from torch import nn

from vit.model.vision_transformer import VisionTransformer
from vit.system.hardware import (
    check_cpp_compiler,
    cpu_has_fast_bf16,
    cpu_name,
    resolve_device,
    vector_flags,
)

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "experiments" / "record" / "benchmarks"
NUM_CLASSES, IMG, PATCH = 10, 32, 4


def build(name: str, *, width: int, depth: int, heads: int, mlp: int) -> nn.Module | None:
    """One model by name at the shared configuration; None if its package is missing."""
    same = dict(
        img_size=IMG,
        patch_size=PATCH,
        num_classes=NUM_CLASSES,
        embed_dim=width,
        depth=depth,
        num_heads=heads,
        mlp_ratio=mlp / width,
    )  # timm's names are ours
    if name.startswith("ours"):
        kernel = "fused" if name.endswith("fused") else "explicit"
        return VisionTransformer(**same, kernel=kernel)
    if name.startswith("timm"):
        try:
            from timm.models.vision_transformer import VisionTransformer as TimmViT
        except ImportError:
            return None
        model = TimmViT(**same)
        for block in model.blocks:  # timm's own switch, read per module
            block.attn.fused_attn = not name.endswith("unfused")
        return model
    if name == "vit-pytorch":
        try:
            from vit_pytorch import ViT
        except ImportError:
            return None
        return ViT(
            image_size=IMG,
            patch_size=PATCH,
            num_classes=NUM_CLASSES,
            dim=width,
            depth=depth,
            heads=heads,
            dim_head=width // heads,
            mlp_dim=mlp,
        )
    raise ValueError(f"unknown model {name!r}: expected one of {MODELS}")


MODELS = ("ours", "ours-fused", "timm", "timm-unfused", "vit-pytorch")
COMPILED = "-compiled"


def build_all(cfg: dict, *, compiled: bool = False) -> dict[str, nn.Module]:
    """Every model whose package is installed; with `compiled`, each also as `<name>-compiled`
    (an instance of its own under torch.compile, which compiles at its first step: a warm-up)."""
    models = {n: m for n in MODELS if (m := build(n, **cfg)) is not None}
    if compiled:
        models |= {n + COMPILED: torch.compile(build(n, **cfg), dynamic=False) for n in models}
    return models


PRECISIONS = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16}


def precisions(force_bf16: bool = False) -> tuple[str, ...]:
    """The precisions to time: bf16-mixed only where this CPU multiplies bf16 natively (elsewhere
    it trains ~13x slower than float32, experiments/record/benchmarks/fp32.md), unless forced."""
    return tuple(PRECISIONS) if force_bf16 or cpu_has_fast_bf16() else ("32-true",)


def make_steps(
    model: nn.Module, *, batch: int, precision: str, device: str = "cpu"
) -> tuple[Callable, Callable]:
    """(train_step, infer_step) closures on fixed random data, on the model's device."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, IMG, IMG, generator=g).to(device)
    y = torch.randint(0, NUM_CLASSES, (batch,), generator=g).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    bf16 = precision == "bf16-mixed"

    def autocast():
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16)

    def train_step() -> None:
        model.train()
        with autocast():
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer_step() -> None:
        model.eval()
        with torch.inference_mode(), autocast():
            model(x)

    return train_step, infer_step


def on_cuda(device: str) -> bool:
    return torch.device(device).type == "cuda"


def synchronizer(device: str) -> Callable[[], None]:
    """What waits for the device's queued work: a GPU runs kernels after the call returns."""
    return (lambda: torch.cuda.synchronize(device)) if on_cuda(device) else (lambda: None)


def time_interleaved(
    steps: dict[str, Callable],
    *,
    warmup: int,
    rounds: int,
    sync: Callable[[], None] = lambda: None,
    repeat: int = 1,
) -> dict[str, float]:
    """Median seconds per call of each step, rounds interleaved across the steps; each timing
    covers `repeat` calls (queued back to back, then `sync`) and is divided by it."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    sync()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            t = time.perf_counter()
            for _ in range(repeat):
                fn()
            sync()
            times[name].append((time.perf_counter() - t) / repeat)
    return {k: statistics.median(v) for k, v in times.items()}


def training_gflop_per_image(*, width: int, depth: int, heads: int, mlp: int) -> float:
    """Matrix-product GFLOP of one image's training step (forward + two backward products each)
    at the shared configuration, every token through every block, as the peers compute it."""
    tokens = (IMG // PATCH) ** 2 + 1
    linear = tokens * (3 * width * width + width * width + 2 * width * mlp)  # qkv, proj, MLP
    attention = 2 * tokens * tokens * width  # q k^T and a v, all heads
    patches = (tokens - 1) * 3 * PATCH * PATCH * width
    return 3 * 2 * (depth * (linear + attention) + patches) / 1e9


def gemm_peak(
    dtype: torch.dtype,
    *,
    sizes: tuple[int, ...] = (2048, 4096),
    device: str = "cpu",
    rounds: int = 3,
) -> float:
    """This machine's best GEMM rate in GFLOP/s: n x n x n products for each n in `sizes`, the
    fastest of `rounds` after a warm-up."""
    g = torch.Generator().manual_seed(0)
    sync = synchronizer(device)
    peak = 0.0
    for n in sizes:
        a, b = (torch.randn(n, n, generator=g).to(device, dtype) for _ in range(2))
        a @ b
        sync()
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            a @ b
            sync()
            times.append(time.perf_counter() - t)
        peak = max(peak, 2 * n**3 / min(times) / 1e9)
    return peak


def matmul_ceiling(
    *,
    width: int,
    depth: int,
    heads: int,
    mlp: int,
    dtype: torch.dtype,
    sizes: tuple[int, ...] = (2048, 4096),
    device: str = "cpu",
) -> dict[str, float]:
    """The most images/s a training step could reach here if only its matrix products took
    time and each ran at this machine's best GEMM rate: that of large square products (the
    step's own, skinny ones run slower)."""
    peak = gemm_peak(dtype, sizes=sizes, device=device)
    gflop = training_gflop_per_image(width=width, depth=depth, heads=heads, mlp=mlp)
    return {
        "gemm_peak_gflop_per_s": round(peak, 1),
        "gflop_per_image": round(gflop, 3),
        "ceiling_images_per_s": round(peak / gflop, 1),
    }


def ceiling_table(
    configs: list[tuple[dict, list[int]]], precs: tuple[str, ...], device: str = "cpu"
) -> list[dict]:
    """matmul_ceiling for each configuration (any batch) and precision."""
    sizes = (4096, 8192) if on_cuda(device) else (2048, 4096)
    rows = []
    for cfg, _batches in configs:
        for precision in precs:
            ceiling = matmul_ceiling(**cfg, dtype=PRECISIONS[precision], sizes=sizes, device=device)
            row = dict(**cfg, precision=precision, **ceiling)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def peak_memory_mb(name: str, cfg: dict, batch: int, precision: str) -> float | None:
    """Peak resident memory during two training steps above the level before them, in a fresh
    process (CPU has no allocator counter): the kernel's high-water mark is reset first."""
    code = (
        "import re, sys, torch; sys.path.insert(0, 'scripts');"
        "from benchmark import build, make_steps;"
        f"m = build({name!r}, **{cfg!r});"
        f"step, _ = make_steps(m, batch={batch}, precision={precision!r});"
        "rss = lambda key: int(re.search(key + r':\\s+(\\d+)', open('/proc/self/status').read())[1]);"
        "before = rss('VmRSS'); open('/proc/self/clear_refs', 'w').write('5'); step(); step();"
        "print((rss('VmHWM') - before) / 1024)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None


def peak_gpu_memory_mb(
    name: str, cfg: dict, batch: int, precision: str, device: str
) -> float | None:
    """Growth of the GPU allocator's peak over two training steps (optimizer state included)."""
    model = build(name, **cfg)
    if model is None:
        return None
    step, _ = make_steps(model.to(device), batch=batch, precision=precision, device=device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    step()
    torch.cuda.synchronize(device)
    return round((torch.cuda.max_memory_allocated(device) - before) / 2**20, 1)


def memory_table(
    cfg: dict, precs: tuple[str, ...], batch: int = 128, device: str = "cpu"
) -> dict[str, float | None]:
    if on_cuda(device):
        return {
            f"{n} {p}": peak_gpu_memory_mb(n, cfg, batch, p, device) for n in MODELS for p in precs
        }
    return {f"{n} {p}": peak_memory_mb(n, cfg, batch, p) for n in MODELS for p in precs}


def bench_data(
    batch: int = 128,
    repeats: int = 3,
    *,
    trivial: bool = False,
    max_batches: int | None = None,
    device: str = "cpu",
) -> float:
    """Images/s of the data pipeline alone (loader + batched augmentation + normalise), 1 thread;
    on a GPU the batches are augmented there after the transfer, as in training.

    `trivial` adds TrivialAugment (per image, the full-length recipe's setting)."""
    from vit.data.augment import TrainAugment
    from vit.data.datasets import TensorImageDataset, collate_batch, preprocess

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    data = TensorImageDataset(
        torch.randint(0, 256, (45_000, 3, 32, 32), dtype=torch.uint8, generator=g),
        torch.randint(0, 10, (45_000,)),
    )
    loader = torch.utils.data.DataLoader(
        data, batch_size=batch, shuffle=True, drop_last=True, collate_fn=collate_batch
    )
    augment = TrainAugment(padding=4, hflip=True, trivial=trivial)
    sync = synchronizer(device)
    rates = []
    for _ in range(repeats):
        t, n = time.perf_counter(), 0
        for i, (images, _labels) in enumerate(loader):
            if max_batches is not None and i == max_batches:
                break
            preprocess(augment(images.to(device)))
            n += images.shape[0]
        sync()
        rates.append(n / (time.perf_counter() - t))
    torch.set_num_threads(threads)
    return statistics.median(rates)


def gpu_name(device: str) -> str | None:
    return torch.cuda.get_device_name(device) if on_cuda(device) else None


def run(args: argparse.Namespace) -> dict:
    device, sync = args.device, synchronizer(args.device)
    results = {
        "machine": {
            "cpu": cpu_name(),
            "isa": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_has_fast_bf16(),
            "mkl_amd": mkl_amd.status(),  # every model here runs on the same MKL path
            "malloc": malloc.status(),  # and the same malloc settings (vit/system/malloc.py)
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "cuda": torch.cuda.is_available(),
            "device": device,
            "gpu": gpu_name(device),
        },
        "command": "python scripts/benchmark.py " + " ".join(args.argv),
        "rows": [],
    }
    results["matmul_ceiling"] = ceiling_table(args.configs, args.precisions, device)
    for cfg, batches in args.configs:
        for batch in batches:
            for precision in args.precisions:
                models = {n: m.to(device) for n, m in build_all(cfg, compiled=args.compile).items()}
                for kind in ("train", "infer"):
                    steps = {
                        n: make_steps(m, batch=batch, precision=precision, device=device)[
                            kind == "infer"
                        ]
                        for n, m in models.items()
                    }
                    secs = time_interleaved(
                        steps,
                        warmup=args.warmup,
                        rounds=args.rounds,
                        sync=sync,
                        repeat=args.repeat,
                    )
                    for n, s in secs.items():
                        row = dict(
                            **cfg,
                            batch=batch,
                            precision=precision,
                            kind=kind,
                            model=n,
                            images_per_s=round(batch / s, 1),
                        )
                        results["rows"].append(row)
                        print(json.dumps(row), flush=True)
    if args.memory:
        cfg, batch = args.configs[0][0], 128
        results["peak_memory_mb"] = memory_table(cfg, args.precisions, batch, device)
    results["data_pipeline_images_per_s"] = round(bench_data(device=device), 0)
    results["data_pipeline_trivial_augment_images_per_s"] = round(
        bench_data(trivial=True, max_batches=40, device=device), 0
    )
    return results


# what each aten op of a training step is, for --profile's split of its time
OP_KINDS = {
    "products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                 "aten::mkldnn_convolution", "aten::convolution_backward"),
    "attention kernel": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                         "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "GELU": ("aten::gelu", "aten::gelu_backward"),
    "softmax": ("aten::_softmax", "aten::_softmax_backward_data"),
    "LayerNorm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
    "copies and concatenation": ("aten::copy_", "aten::cat", "aten::stack"),
}  # fmt: skip


def profile_models(args: argparse.Namespace) -> str:
    """torch.profiler on each of `args.profile`'s models' training steps (the first config and
    batch, the first precision; 5 steps after 3), one after the other in this process: each
    op's own time per step, summed by kind (OP_KINDS; "other": the rest: the optimizer,
    elementwise ops, the autograd engine), then each model's top ops."""
    from torch.profiler import ProfilerActivity, profile

    cfg, batch, precision = args.configs[0][0], args.configs[0][1][0], args.precisions[0]
    models = build_all(cfg, compiled=args.compile)
    unknown = [n for n in args.profile if n not in models]
    if unknown:
        raise SystemExit(f"--profile: {unknown} not among the models built here: {list(models)}")
    kinds = [*OP_KINDS, "other"]
    head = f"| model | step ms (profiled) | {' | '.join(kinds)} |"
    lines, tables = [head, "|" + "---|" * (len(kinds) + 2)], []
    for name in args.profile:
        train, _ = make_steps(models[name], batch=batch, precision=precision, device=args.device)
        for _ in range(3):
            train()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(5):
                train()
            step_ms = (time.perf_counter() - start) / 5 * 1e3
        own = {e.key: e.self_cpu_time_total / 5e3 for e in prof.key_averages()}  # ms a step
        total = sum(own.values())
        split = {k: sum(own.get(op, 0.0) for op in ops) for k, ops in OP_KINDS.items()}
        split["other"] = total - sum(split.values())
        cells = " | ".join(f"{split[k]:.2f} ({split[k] / total:.0%})" for k in kinds)
        lines.append(f"| {name} | {step_ms:.0f} | {cells} |")
        tables += ["", f"{name}: each op's own time over 5 steps", "",
                   prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25,
                                             max_name_column_width=70)]  # fmt: skip
    machine = f"{cpu_name()} ({' '.join(vector_flags())}), torch {torch.__version__}"
    return "\n".join([
        f"`python scripts/benchmark.py {' '.join(args.argv)}`", "",
        f"{time.strftime('%Y-%m-%d')}, {machine}, {torch.get_num_threads()} threads; width "
        f"{cfg['width']}, batch {batch}, {precision}. Per step, ms (share of the ops' own time):",
        "", *lines, *tables,
    ])  # fmt: skip


def grouped_rows(rows: list[dict]) -> list[tuple[tuple[int, int, str], list[dict]]]:
    """The timing rows per (width, batch, step kind), in sorted order."""
    keys = sorted({(r["width"], r["batch"], r["kind"]) for r in rows})
    return [(k, [r for r in rows if (r["width"], r["batch"], r["kind"]) == k]) for k in keys]


def to_markdown(results: dict) -> str:
    lines = [f"Command: `{results['command']}`  ", f"Machine: {results['machine']}", ""]
    if results["machine"].get("native_bf16") is False and not any(
        r["precision"] == "bf16-mixed" for r in results["rows"]
    ):
        lines += [
            "bf16-mixed: not timed, as this CPU has no native bf16 matrix products (it trains "
            "~13x slower than float32 there: fp32.md; `--bf16` times it anyway).",
            "",
        ]
    rows = results["rows"]
    lines += [
        "| width | batch | step | model | fp32 img/s | bf16-mixed img/s | ours-best / this |",
        "|---|---|---|---|---|---|---|",
    ]
    for (width, batch, kind), sel in grouped_rows(rows):
        best_ours = max(r["images_per_s"] for r in sel if r["model"].startswith("ours"))
        for model in dict.fromkeys(r["model"] for r in sel):
            by_p = {r["precision"]: r["images_per_s"] for r in sel if r["model"] == model}
            best = max(by_p.values())
            lines.append(
                f"| {width} | {batch} | {kind} | {model} | {by_p.get('32-true')} | "
                f"{by_p.get('bf16-mixed')} | {best_ours / best:.2f}x |"
            )
    lines += summary_lines(results)
    trivial = results.get("data_pipeline_trivial_augment_images_per_s")
    on_gpu = on_cuda(results["machine"].get("device", "cpu"))
    where = "1 loader thread, augmentation on the GPU" if on_gpu else "1 thread"
    lines += [
        "",
        f"Data pipeline alone ({where}): {results['data_pipeline_images_per_s']:.0f} img/s; "
        + (f"with TrivialAugment: {trivial:.0f} img/s" if trivial else "TrivialAugment not timed"),
    ]
    if "peak_memory_mb" in results:
        lines += [
            "",
            ("Peak GPU memory (allocator)" if on_gpu else "Peak memory")
            + " of two training steps above the level before them (width 192, batch 128), MB"
            + (f" (`{results['memory_command']}`)" if "memory_command" in results else "")
            + ":",
            "",
        ]
        lines += [f"- {k}: {v}" for k, v in results["peak_memory_mb"].items()]
    if on_gpu:
        gpu = f"measured above ({results['machine'].get('gpu')})"
    elif results["machine"]["cuda"]:
        gpu = "not measured in this run (`--device cuda` measures it)"
    else:
        gpu = "not measured (no GPU on this machine)"
    lines += ["", "GPU: " + gpu]
    return "\n".join(lines) + "\n"


def summary_lines(results: dict) -> list[str]:
    """Per (width, batch, step): our best against the fastest peer setting, and for training
    the matmul-only ceiling of this machine beside twice the fastest peer (the issue's goal)."""
    rows, ceilings = results["rows"], results.get("matmul_ceiling", [])
    lines = [
        "",
        "| width | batch | step | ours, best setting | fastest peer setting | ratio | "
        "2x that peer | matmul-only ceiling (best timed precision) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (width, batch, kind), sel in grouped_rows(rows):
        ours = [r for r in sel if r["model"].startswith("ours")]
        peers = [r for r in sel if not r["model"].startswith("ours")]
        if not ours or not peers:  # a peer's package is missing
            continue
        ours, peer = (max(rs, key=lambda r: r["images_per_s"]) for rs in (ours, peers))
        ceiling = [c["ceiling_images_per_s"] for c in ceilings if c["width"] == width]
        lines.append(
            f"| {width} | {batch} | {kind} | {ours['images_per_s']} ({ours['model']}, "
            f"{ours['precision']}) | {peer['images_per_s']} ({peer['model']}, {peer['precision']}) "
            f"| {ours['images_per_s'] / peer['images_per_s']:.2f}x | "
            f"{2 * peer['images_per_s']:.0f} | "
            + (f"{max(ceiling):.0f} |" if kind == "train" and ceiling else "- |")
        )
    if ceilings:
        lines += [
            "",
            "Ceiling: the training step's matrix-product FLOPs (every token through every "
            "block, as the peers compute them) at this machine's best GEMM rate (large square "
            "products), as if nothing else took time"
            + (f" (`{results['ceiling_command']}`)" if "ceiling_command" in results else "")
            + ":",
            "",
            "| width | precision | GFLOP/image | best GEMM GFLOP/s | ceiling img/s |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {c['width']} | {c['precision']} | {c['gflop_per_image']} | "
            f"{c['gemm_peak_gflop_per_s']} | {c['ceiling_images_per_s']} |"
            for c in ceilings
        ]
    return lines


def record_head(script: str, argv: list[str] | None) -> dict:
    """The fields every record of a script opens with: its command as run, the date, the machine
    (CPU and vector flags), torch's version and the threads."""
    return dict(
        command=f"python scripts/{script} " + " ".join(argv if argv is not None else sys.argv[1:]),
        date=time.strftime("%Y-%m-%d"),
        machine=f"{cpu_name()} ({' '.join(vector_flags())})",
        torch=torch.__version__,
        threads=torch.get_num_threads(),
    )


def print_and_record(res: dict, text: str, *, out: Path, name: str | None) -> dict:
    """Print a script's table, and keep it with its data as NAME.md and NAME.json where `name`."""
    print(text)
    if name:
        write_record(out, name, res, text)
    return res


def write_record(out: Path, name: str, data: object, text: str) -> None:
    """NAME.json and NAME.md in the folder `out` (the benchmarks record, for every script that
    keeps one); the name is kept whole: a dot in it, as in "mlp1.5", is not a suffix to replace."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2))
    (out / f"{name}.md").write_text(text)
    print(f"wrote {out / name}.md and .json")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="batch 128, width 192, fewer rounds")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument(
        "--name",
        default=None,
        help="keep the table as experiments/record/benchmarks/NAME.{md,json} (default: printed "
        "only, so that no recorded table is replaced by accident)",
    )
    p.add_argument("--no-memory", dest="memory", action="store_false")
    p.add_argument(
        "--compile",
        action="store_true",
        help="also time every model under torch.compile (needs a C++ compiler on a CPU)",
    )
    p.add_argument(
        "--memory-only",
        action="store_true",
        help="measure peak memory only and add it to an existing <name>.json",
    )
    p.add_argument(
        "--ceiling-only",
        action="store_true",
        help="measure the matmul-only ceiling only and put it into an existing <name>.json",
    )
    p.add_argument(
        "--bf16",
        action="store_true",
        help="time bf16-mixed even on a CPU without native bf16 (skipped there by default)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where to time the steps: cpu (default), cuda[:N] where a GPU is available, or auto",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="steps per timing (default 1 on a CPU, 10 on a GPU, where one step is too short)",
    )
    p.add_argument(
        "--profile",
        nargs="+",
        metavar="MODEL",
        default=None,
        help=f"instead: where these models' training steps spend their time ({', '.join(MODELS)}"
        ", -compiled with --compile), printed, and with --name written to NAME.txt",
    )
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    for flag in ("memory_only", "ceiling_only"):
        if getattr(args, flag) and args.name is None:
            p.error(f"--{flag.replace('_', '-')} adds to a recorded table: give its --name")
    try:  # vit-evaluate's check: a clear error for no GPU, a bad name or index
        args.device = str(resolve_device(args.device))
    except ValueError as err:
        p.error(str(err))
    on_gpu = on_cuda(args.device)
    if args.compile and not on_gpu:
        try:
            check_cpp_compiler("--compile", "leave --compile out")
        except RuntimeError as err:
            p.error(str(err))
    args.repeat = args.repeat or (10 if on_gpu else 1)
    tiny = dict(width=192, depth=6, heads=3, mlp=768)
    wide = dict(width=384, depth=6, heads=6, mlp=1536)
    args.configs = [(tiny, [128])] if args.quick else [(tiny, [128, 64, 256]), (wide, [128])]
    args.rounds = args.rounds or (5 if args.quick else 7)
    args.warmup = 5 if on_gpu else 2  # a GPU's first steps also pick kernels
    args.precisions = tuple(PRECISIONS) if on_gpu else precisions(args.bf16)
    if args.profile:
        text = profile_models(args)
        print(text)
        if args.name is not None:
            (OUT / f"{args.name}.txt").write_text(text + "\n")
            print(f"wrote {OUT / args.name}.txt")
        return
    if args.ceiling_only:
        results = json.loads((OUT / f"{args.name}.json").read_text())
        results["matmul_ceiling"] = ceiling_table(args.configs, args.precisions, args.device)
        results["ceiling_command"] = "python scripts/benchmark.py " + " ".join(args.argv)
    elif args.memory_only:
        results = json.loads((OUT / f"{args.name}.json").read_text())
        results["peak_memory_mb"] = memory_table(
            args.configs[0][0], args.precisions, device=args.device
        )
        results["memory_command"] = "python scripts/benchmark.py " + " ".join(args.argv)
    else:
        results = run(args)
    text = to_markdown(results)
    print(text)
    if args.name is None:
        print("not kept: --name NAME writes it as experiments/record/benchmarks/NAME.{md,json}")
    else:
        write_record(OUT, args.name, results, text)


if __name__ == "__main__":
    main()
