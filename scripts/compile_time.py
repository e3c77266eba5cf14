"""The fit-start compile of a recipe's network, timed cold (an empty inductor cache) and warm.

    python scripts/compile_time.py --name compile-time-avx2kernels-float32
    python scripts/compile_time.py --dynamic false auto true   # static shapes against dynamic

With torch_compile a fit compiles every (side, patch-drop) shape of its curricula at its start,
inside its time budget (vit/train/warmup.py). Each measurement runs in a process of its own,
since inductor fixes its cache folder on first use: first into an empty folder (a machine's
first run; the precompiled C++ header made anew too), then again into the same folder (every run after it, until the folder goes). The
precision is the one the fit takes: bf16 autocast where the CPU has native bf16, float32 with
the config's float32_overrides elsewhere (VIT_CPU_BF16=0 forces float32). torch's own compile
counters split the time: the forward graphs (dynamo, AOT autograd, inductor) and the backward
ones (inductor, at their first run); across both, inductor's code generation (Python) and the
wait for the C++ compiler. Writes experiments/record/benchmarks/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # scripts/ is no package: benchmark.py's record writer

import yaml  # noqa: E402
from recipe_step import stages  # noqa: E402  (the curricula's stages, read from the config)

# the variables that choose the precision and the kernels: the record's command names them
KERNEL_SWITCHES = (
    "VIT_CPU_BF16",
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
)
DYNAMIC = {"false": False, "auto": None, "true": True}  # torch.compile's dynamic= argument
# torch._dynamo's compile-time counters (dynamo_timed) that split a compile
PARTS = {
    "forward": "_compile.compile_inner",  # dynamo, AOT autograd, inductor: the forward graph
    "backward": "compile_fx.<locals>.bw_compiler",  # inductor on the backward, at its first run
    "codegen": "GraphLowering.codegen",  # inductor writing the kernels (Python)
    "cxx wait": "async_compile.wait",  # waiting for the C++ compiler's workers
}


def planned(cfg: dict, *, bf16: bool) -> tuple[dict, list[tuple[int, float]]]:
    """The network's options as the fit takes them (float32_overrides' where it trains in
    float32), and the (side, patch-drop) shapes its curricula make."""
    network = dict(cfg["model"]["network"])
    if not bf16:
        network.update((cfg.get("float32_overrides") or {}).get("model", {}).get("network", {}))
    shapes = list(dict.fromkeys((side, drop) for _, side, drop in stages(cfg)))
    return network, shapes


def child(config: Path, dynamic: str) -> dict:
    """In this process: build the config's network, compile every planned shape; seconds."""
    import torch
    from torch._dynamo.utils import compilation_time_metrics

    from vit.model.config import NetworkConfig
    from vit.system.hardware import cpu_has_fast_bf16
    from vit.train.warmup import compile_planned_shapes

    cfg = yaml.safe_load(config.read_text())
    bf16 = cpu_has_fast_bf16()  # False under VIT_CPU_BF16=0, as in the fit
    network, shapes = planned(cfg, bf16=bf16)
    torch.manual_seed(0)
    net = NetworkConfig(**network).build()
    net.set_dynamic_img_size(True)
    net.compile(dynamic=DYNAMIC[dynamic])
    context = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else None
    start = time.perf_counter()
    compile_planned_shapes(
        net, shapes=shapes, batch_size=cfg["data"]["batch_size"], in_chans=3,
        full_side=net.patch_embed.img_size, context=context,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    totals = {name: sum(ts) for name, ts in compilation_time_metrics.items()}
    parts = {part: round(totals.get(key, 0.0), 1) for part, key in PARTS.items()}
    return {"seconds": round(seconds, 1), "shapes": len(shapes), "bf16": bf16, **parts}


def measure(config: Path, dynamic: str) -> dict:
    """Cold, then warm, each in a fresh process sharing one new cache folder."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="inductor-cold-") as cache:
        # TMPDIR too: inductor keeps its precompiled header under the temp folder, not the cache
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TMPDIR": cache}
        for run in ("cold", "warm"):
            cmd = [sys.executable, __file__, "--child", str(config), "--dynamic", dynamic]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"{run} compile with dynamic={dynamic} failed:\n{done.stderr[-2000:]}")
            out[run] = json.loads(done.stdout.strip().splitlines()[-1])
            print(dynamic, run, out[run], flush=True)
    return out


def first_run(result: dict) -> dict:
    return next(iter(next(iter(result["runs"].values())).values()))


def markdown(result: dict, argv: list[str]) -> str:
    from vit.system.hardware import cpu_name, vector_flags

    env = " ".join(f"{k}={os.environ[k]}" for k in KERNEL_SWITCHES if k in os.environ)
    lines = [
        f"`{env + ' ' if env else ''}python scripts/compile_time.py {' '.join(argv)}`",
        "",
        f"{cpu_name()} ({', '.join(vector_flags())}); torch {result['torch']}; "
        f"{os.cpu_count()} cores; precision: {'bf16' if first_run(result)['bf16'] else 'float32'}",
        "",
        "| dynamic | cache | shapes | compile, s | forward, s | backward, s | of which codegen, s "
        "| C++ wait, s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dynamic, runs in result["runs"].items():
        for run, r in runs.items():
            lines.append(
                f"| {dynamic} | {run} | {r['shapes']} | {r['seconds']} | {r['forward']} | "
                f"{r['backward']} | "
                f"{r['codegen']} | {r['cxx wait']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "experiments" / "cpu60.yaml")
    p.add_argument("--dynamic", nargs="+", choices=list(DYNAMIC), default=["false"])
    p.add_argument("--name", help="write experiments/record/benchmarks/NAME.{json,md}")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        print(json.dumps(child(ns.child, ns.dynamic[0])))
        return 0
    import torch

    result = {"torch": torch.__version__, "runs": {d: measure(ns.config, d) for d in ns.dynamic}}
    text = markdown(result, argv)
    print(text)
    if ns.name:
        from benchmark import write_record

        write_record(REPO / "experiments" / "record" / "benchmarks", ns.name, result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
