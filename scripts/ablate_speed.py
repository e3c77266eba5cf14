"""Which settings make our ViT train fastest on this machine: each lead of
../shared/notes/cpu-speed-leads.md as an A/B, timed interleaved in one run.

    python scripts/ablate_speed.py            # width 192, depth 6, 3 heads, MLP 768, batch 128

Variants: attention kernel (explicit / fused), precision (float32; bf16 autocast; the whole
model in bf16 with float32 master weights kept by the optimizer), fused AdamW, torch.compile.
Writes experiments/benchmarks/ablation.{json,md}.

    python scripts/ablate_speed.py --allocator     # glibc's default vs freed memory kept

times training steps of ours, timm (fused attention off) and vit-pytorch in bf16-mixed under
glibc's default allocator settings and with freed memory kept (mallopt: mmap threshold 32 MB,
trim threshold 1 GB, so activation buffers are not unmapped and faulted in again every step), each
setting in its own fresh process (it is process-wide), alternating, and writes
experiments/benchmarks/allocator.{json,md}.

    python scripts/ablate_speed.py --resolutions   # the cpu60 recipe's curriculum stages

times the 60-minute recipe's model (width 192, depth 6, MLP ratio 2, bf16-mixed, fused AdamW)
on 16x16, 24x24 and 32x32 images, and writes experiments/benchmarks/resolution.{json,md}.

    python scripts/ablate_speed.py --lsa           # the same stages, plain attention vs LSA

times those stages with and without locality self-attention (model.lsa: a diagonal mask and a
trained temperature per head) and writes experiments/benchmarks/lsa.{json,md}: what it costs.

    python scripts/ablate_speed.py --spt           # the same stages with LSA, patches vs SPT

times them with LSA on, with the plain patch embedding and with shifted patch tokenization
(model.spt), and writes experiments/benchmarks/spt.{json,md}.

    python scripts/ablate_speed.py --fast-step     # the same stages: bf16 autocast vs full, compile

times them in bf16 autocast (the recipe's precision) and with the whole model in bf16 and float32
master weights kept by the optimizer, each eager and through torch.compile, and writes
experiments/benchmarks/fast_step.{json,md}.

    python scripts/ablate_speed.py --batch-sizes 64 # the curriculum's stages: batch 64 vs 128

times the same model's stages at the batch sizes given against batch 128, interleaved, and
writes experiments/benchmarks/batch_sizes_<sizes>.{json,md}: images/s per stage, since the batch
size decides how many optimizer steps the 60-minute recipe's hour buys.

    python scripts/ablate_speed.py --mlp-ratio     # today's depth-4 model: MLP ratio 2 vs 4

times the curriculum's stages of the depth-4 recipe model (LSA, SPT) with MLP ratio 2 and 4, and
writes experiments/benchmarks/mlp_ratio.{json,md}: what the wider MLP costs in steps.

    python scripts/ablate_speed.py --loop           # the whole training loop vs its bare step

times the same model's bare step (random 32x32 input, as above) against Lightning's fit loop on
the CIFAR-10 archive (loading, augmentation, metrics, schedule; then also CSV logging every 50
steps and last.ckpt every 100, as vit-train runs the recipe), mean seconds per step after a
warm-up, and writes experiments/benchmarks/loop.{json,md}: what the loop costs beyond the step.

    python scripts/ablate_speed.py --fp32           # for CPUs without native bf16
    python scripts/ablate_speed.py --kernels-fp32   # float32: explicit vs fused attention

time the cpu60 model in float32 (explicit and fused attention at 16x16, 24x24 and 32x32, then
bf16-mixed at 32x32 for comparison: fp32.{json,md}), and explicit against fused attention in
float32 training at MLP ratio 2 and 4 (kernels_fp32.{json,md}).

    python scripts/ablate_speed.py --mkl            # AMD CPUs: MKL's generic vs AVX2 kernels

times float32 training steps (the cpu60 model at 16x16 and 32x32; ours, timm and vit-pytorch at
benchmark.py's configuration) with MKL on its generic path (VIT_MKL_AVX2=0) and on its AVX2 path
(vit/mkl_amd.py, the default), each setting in fresh processes, alternating, and writes
experiments/benchmarks/mkl_amd.{json,md}.

    python scripts/ablate_speed.py --muon-ns-steps  # the curriculum's stages: Muon's 5 iterations vs 3

times today's cpu60 model (depth 4, LSA, SPT; Muon with the patch projection in it) with 5
Newton-Schulz iterations a step (the default) and 3 (`model.muon_ns_steps`), and writes
experiments/benchmarks/muon_ns_steps.{json,md}.

    python scripts/ablate_speed.py --runtime        # OpenMP thread binding, jemalloc, tcmalloc

times training steps of ours, timm (fused attention off) and vit-pytorch in bf16-mixed under the
process-wide runtime settings of lead 7 (OMP_PROC_BIND=close with OMP_PLACES=cores; jemalloc or
tcmalloc through LD_PRELOAD, where the library is installed), each setting in fresh processes,
alternating, and writes experiments/benchmarks/runtime.{json,md}.

    python scripts/ablate_speed.py --tokens         # 65 tokens (CLS + 64 patches) vs 64 (lead 8)

times benchmark.py's model with mean pooling, with and without the CLS token (65 and 64 tokens,
the same work per token), beside our default (CLS pooling, the last block on the CLS row only),
and writes experiments/benchmarks/tokens.{json,md}.

    python scripts/ablate_speed.py --compile-passes # inductor's pattern passes on and off (lead 5)

times our explicit-attention training step eager, compiled, and compiled with inductor's pattern
matcher off, counts what those passes matched (fuse_attention would turn our explicit attention
into the fused kernel), and writes experiments/benchmarks/compile_passes.{json,md}.

    python scripts/ablate_speed.py --compile-modes  # torch.compile's default vs max-autotune (lead 5)

times our training step eager, compiled in the default mode and compiled with max-autotune, and
inference eager, compiled, and compiled with frozen weights in the default mode and with
max-autotune; records every product inductor autotuned (its op, shapes, each choice's time and
the winner: where its C++ GEMM template competed with ATen's kernel), and writes
experiments/benchmarks/compile_modes_train.{json,md} and compile_modes_infer.{json,md}.

Every mode writes under experiments/benchmarks/ unless `--out DIR` names another folder (another
CPU's runs keep their own: experiments/benchmarks/amx_check.sh uses experiments/benchmarks/amx).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import vit  # noqa: F401  first: MKL's AVX2 kernels on AMD CPUs load with torch (vit/mkl_amd.py)

# isort: split
import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("benchmark", REPO / "scripts" / "benchmark.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


class MasterWeights:
    """AdamW on float32 copies of a bf16 model's parameters (what bf16-true lacks)."""

    def __init__(self, model: nn.Module, *, fused: bool) -> None:
        self.params = list(model.parameters())
        self.master = [p.detach().float().requires_grad_() for p in self.params]
        self.opt = torch.optim.AdamW(self.master, lr=1e-4, fused=fused)

    def step(self) -> None:
        for p, m in zip(self.params, self.master, strict=True):
            m.grad = p.grad.float()
            p.grad = None
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master, strict=True):
                p.copy_(m)


def make_step(
    *,
    kernel: str,
    precision: str,
    fused_adam: bool,
    compile_: bool,
    batch: int,
    mode: str | None = None,
):
    torch.manual_seed(0)
    model = bench.build(
        "ours" if kernel == "explicit" else "ours-fused", width=192, depth=6, heads=3, mlp=768
    )
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    return training_step(
        model,
        x,
        y,
        precision=precision,
        fused_adam=fused_adam,
        compile_=compile_,
        dynamic=None,
        mode=mode,
    )


def training_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    precision: str,
    fused_adam: bool,
    compile_: bool,
    dynamic: bool | None,
    optimizer: str = "adamw",
    ns_steps: int = 5,
    muon_patch_embed: bool = False,
    mode: str | None = None,
):
    """A closure running one training step (forward, backward, AdamW) of `model` on (x, y):
    precision 32-true, bf16-mixed (autocast) or bf16-full (the model in bf16, float32 master
    weights in the optimizer); compile_ runs the model through torch.compile(dynamic=dynamic,
    mode=mode);
    optimizer "muon" steps with vit.optim.MuonAdamW as `model.optimizer: muon` does, with
    `ns_steps` Newton-Schulz iterations and, with `muon_patch_embed`, the patch projection in its
    Muon group (as today's cpu60.yaml)."""
    if precision == "bf16-full":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
        opt = MasterWeights(model, fused=fused_adam)
    elif optimizer == "muon":
        from vit.lit_module import muon_param_groups
        from vit.optim import MuonAdamW

        groups = muon_param_groups(model, weight_decay=0.05, patch_embed=muon_patch_embed)
        opt = MuonAdamW(groups, lr=1e-4, ns_steps=ns_steps)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused_adam)
    forward = torch.compile(model, dynamic=dynamic, mode=mode) if compile_ else model
    autocast = precision == "bf16-mixed"

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(forward(x).float(), y)
        loss.backward()
        opt.step()
        if isinstance(opt, torch.optim.Optimizer):
            opt.zero_grad(set_to_none=True)

    return step


def resolution_step(
    *,
    side: int,
    batch: int,
    fused_adam: bool,
    precision: str = "bf16-mixed",
    kernel: str = "explicit",
    mlp_ratio: float = 2.0,
    depth: int = 6,
    lsa: bool = False,
    spt: bool = False,
    patch_drop: bool = False,
    compile_: bool = False,
    optimizer: str = "adamw",
    ns_steps: int = 5,
    muon_patch_embed: bool = False,
):
    """One training step of the cpu60 model on side x side images (bf16 autocast, float32, or
    bf16-full: the model in bf16 with float32 master weights in the optimizer); patch_drop drops
    half of each image's patch tokens (model.patch_drop_rate 0.5); compile_ runs the model
    through torch.compile."""
    from vit.model import create_model

    torch.manual_seed(0)
    model = create_model(
        "vit_tiny",
        mlp_ratio=mlp_ratio,
        depth=depth,
        dynamic_img_size=True,
        kernel=kernel,
        lsa=lsa,
        spt=spt,
        patch_drop_rate=0.5 if patch_drop else 0.0,
    )
    x, y = torch.randn(batch, 3, side, side), torch.randint(0, 10, (batch,))
    # static shapes: the curriculum compiles once per image size
    return training_step(
        model,
        x,
        y,
        precision=precision,
        fused_adam=fused_adam,
        compile_=compile_,
        dynamic=False,
        optimizer=optimizer,
        ns_steps=ns_steps,
        muon_patch_embed=muon_patch_embed,
    )


TRAIN_COLUMNS = (("ms/step", "ms_per_step"), ("train img/s", "images_per_s"))
INFER_COLUMNS = (("ms/batch", "ms_per_step"), ("infer img/s", "images_per_s"))


def time_and_write(
    steps: dict,
    *,
    args: argparse.Namespace,
    base: str,
    stem: str,
    command: str,
    about: str,
    extra: dict | None = None,
    columns: tuple[tuple[str, str], ...] = TRAIN_COLUMNS,
) -> None:
    """Time the steps interleaved (median of args.rounds) and write their table."""
    secs = bench.time_interleaved(steps, warmup=3, rounds=args.rounds)
    write_table(
        secs,
        batch=args.batch,
        base=base,
        stem=stem,
        command=command,
        about=about,
        extra=extra,
        columns=columns,
    )


def write_table(
    secs: dict[str, float],
    *,
    batch: int,
    base: str,
    stem: str,
    command: str,
    about: str,
    extra: dict | None = None,
    columns: tuple[tuple[str, str], ...] = TRAIN_COLUMNS,
) -> None:
    """Seconds per step of each variant -> <stem>.json and <stem>.md (ms/step, img/s, ratio to
    `base`, under the titles of `columns`), printed too."""
    rows = [
        {
            "variant": n,
            "ms_per_step": round(1000 * s, 1),
            "images_per_s": round(batch / s, 1),
            "vs_base": round(secs[base] / s, 3),
        }
        for n, s in secs.items()
    ]
    save_rows(
        rows,
        stem=stem,
        command=command,
        about=about,
        header=("variant", f"vs {base}"),
        ratio_key="vs_base",
        meta={"batch": batch, "base": base, **(extra or {})},
        columns=columns,
    )


def save_rows(
    rows: list[dict],
    *,
    stem: str,
    command: str,
    about: str,
    header: tuple[str, str],
    ratio_key: str,
    meta: dict,
    columns: tuple[tuple[str, str], ...] = TRAIN_COLUMNS,
) -> None:
    """Timed rows (a variant, the `columns` given as (title, key), and a ratio) -> <stem>.json
    and <stem>.md, printed too; `header` names the first and the ratio column."""
    out = {
        "command": command,
        **meta,
        "rows": rows,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    bench.OUT.mkdir(parents=True, exist_ok=True)
    (bench.OUT / f"{stem}.json").write_text(json.dumps(out, indent=2))
    lines = [
        f"Command: `{command}` ({about})",
        "",
        f"| {header[0]} | {' | '.join(title for title, _ in columns)} | {header[1]} |",
        "|---|" + "---|" * (len(columns) + 1),
    ]
    lines += [
        f"| {r['variant']} | {' | '.join(str(r[key]) for _, key in columns)} | "
        f"{r[ratio_key]:.2f}x |"
        for r in rows
    ]
    (bench.OUT / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def stages_ab(
    args: argparse.Namespace,
    *,
    option: str,
    names: tuple[str, str],
    flag: str,
    stem: str,
    about: str,
    values: tuple = (False, True),
    **fixed: object,
) -> None:
    """The curriculum's stages (16, 24, 32) with resolution_step's `option` at its two `values`
    (off and on unless given), named `names`; --precision, where given, replaces the held one."""
    if getattr(args, "precision", None):
        fixed["precision"] = args.precision
        flag = f"{flag} --precision {args.precision}"
        about = f"{about}; precision {args.precision}"
    steps = {
        f"{side}x{side} {name}": resolution_step(
            side=side, batch=args.batch, **{option: value}, **fixed
        )
        for side in (16, 24, 32)
        for name, value in zip(names, values, strict=True)
    }
    time_and_write(
        steps,
        args=args,
        base=f"32x32 {names[0]}",
        stem=stem,
        command=f"python scripts/ablate_speed.py {flag} --batch {args.batch} --rounds {args.rounds}",
        about=f"batch {args.batch}, {about}",
    )


# Session 12's recipe model (LSA, no SPT or patch dropout), held fixed by the A/Bs of options on
# top of it that sessions 13-15 recorded; cpu60.yaml has since added SPT and patch dropout.
RECIPE_MODEL = "the cpu60 model with LSA (width 192, depth 6, 3 heads, MLP 384, patch 4)"
RECIPE_ABOUT = f"{RECIPE_MODEL}, bf16-mixed, fused AdamW"
RECIPE_FIXED = dict(fused_adam=True, lsa=True)
TODAY_MODEL = (
    "today's cpu60 model (width 192, depth 4, 3 heads, MLP 384, patch 4, LSA, SPT, all tokens), "
    "bf16-mixed unless --precision says otherwise"
)

# The curriculum stages timed with one option of resolution_step off and on: the flag that asks
# for each, the option, the two variants' names, what is held fixed, and the output's stem.
STAGE_ABS = {
    "resolutions": dict(
        option="fused_adam",
        names=("foreach-adamw", "fused-adamw"),
        stem="resolution",
        about="width 192, depth 6, 3 heads, MLP 384, patch 4, bf16-mixed",
    ),
    "lsa": dict(
        option="lsa",
        names=("plain", "lsa"),
        stem="lsa",
        about="the cpu60 model (width 192, depth 6, 3 heads, MLP 384, patch 4), bf16-mixed, "
        "fused AdamW; plain attention vs locality self-attention (model.lsa)",
        fused_adam=True,
    ),
    "spt": dict(
        option="spt",
        names=("patches", "spt"),
        stem="spt",
        about=f"{RECIPE_ABOUT}; plain patch embedding vs shifted patch tokenization (model.spt)",
        **RECIPE_FIXED,
    ),
    "patch_drop": dict(
        option="patch_drop",
        names=("all-tokens", "half-dropped"),
        stem="patch_drop",
        about=f"{RECIPE_ABOUT}; every patch token vs half of them dropped "
        "(model.patch_drop_rate 0.5)",
        **RECIPE_FIXED,
    ),
    "muon": dict(
        option="optimizer",
        values=("adamw", "muon"),
        names=("adamw", "muon"),
        stem="muon",
        about=f"{TODAY_MODEL}; fused AdamW vs Muon for the "
        "blocks' matrices with AdamW for the rest (model.optimizer: muon; its iterations in bf16 "
        "only where bf16 is fast)",
        depth=4,
        spt=True,
        **RECIPE_FIXED,
    ),
    "muon_ns_steps": dict(
        option="ns_steps",
        values=(5, 3),
        names=("muon-ns-5", "muon-ns-3"),
        stem="muon_ns_steps",
        about=f"{TODAY_MODEL}; Muon (the patch projection in "
        "it, as cpu60.yaml) with 5 Newton-Schulz iterations (the default) vs 3 "
        "(model.muon_ns_steps)",
        depth=4,
        spt=True,
        optimizer="muon",
        muon_patch_embed=True,
        **RECIPE_FIXED,
    ),
    "mlp_ratio": dict(
        option="mlp_ratio",
        values=(2.0, 4.0),
        names=("mlp-ratio-2", "mlp-ratio-4"),
        stem="mlp_ratio",
        about="the cpu60 model of session 22 (width 192, depth 4, 3 heads, patch 4, LSA, SPT, "
        "all tokens), bf16-mixed, fused AdamW; MLP ratio 2 (the recipe's) vs 4",
        depth=4,
        spt=True,
        **RECIPE_FIXED,
    ),
}


FAST_STEPS = {  # name: resolution_step's precision and compile_
    "bf16-mixed": ("bf16-mixed", False),
    "bf16-full": ("bf16-full", False),
    "bf16-mixed compile": ("bf16-mixed", True),
    "bf16-full compile": ("bf16-full", True),
}


def fast_step_main(args: argparse.Namespace) -> None:
    """The curriculum's stages of the recipe's model in bf16-mixed (autocast, the recipe's
    precision) against the whole model in bf16 with float32 master weights, each eager and
    through torch.compile (static shapes, compiled once per size before timing)."""
    steps = {
        f"{side}x{side} {name}": resolution_step(
            side=side, batch=args.batch, precision=precision, compile_=compile_, **RECIPE_FIXED
        )
        for side in (16, 24, 32)
        for name, (precision, compile_) in FAST_STEPS.items()
    }
    time_and_write(
        steps,
        args=args,
        base="32x32 bf16-mixed",
        stem="fast_step",
        command=f"python scripts/ablate_speed.py --fast-step --batch {args.batch} "
        f"--rounds {args.rounds}",
        about=f"batch {args.batch}, {RECIPE_MODEL}, fused AdamW; bf16 autocast vs "
        "the model in bf16 with float32 master weights (bf16-full), eager and torch.compile",
    )


def muon_ns_main(args: argparse.Namespace) -> None:
    """Muon's Newton-Schulz iterations for the 16 matrices of today's cpu60 model, in the forms
    vit.optim has: in float32, each matrix alone or each shape's matrices as one stack
    (MuonAdamW's way), each with the textbook loop or on the Gram matrix (orthogonalize's float32
    choice for wide and tall matrices), the same results to float32 rounding
    (tests/test_optim.py); and the stacked loop in bfloat16, the dtype MuonAdamW picks where bf16
    products are fast (iteration_dtype)."""
    from vit import optim
    from vit.lit_module import muon_param_groups
    from vit.model import create_model

    torch.manual_seed(0)
    model = create_model("vit_tiny", mlp_ratio=2.0, depth=4, lsa=True, spt=True)
    mats = [torch.randn_like(p) for p in muon_param_groups(model, weight_decay=0.05)[0]["params"]]
    stacks = {}
    for m in mats:
        stacks.setdefault(m.shape, []).append(m)
    stacks = [torch.stack(ms) for ms in stacks.values()]

    def form(*, stacked: bool, gram: bool, dtype: torch.dtype = torch.float32):
        def run() -> None:
            for g in stacks if stacked else mats:
                optim.orthogonalize(g, dtype=dtype, gram=gram)

        return run

    steps = {
        f"{'stacked' if stacked else 'per matrix'}, {'Gram form' if gram else 'loop'}": form(
            stacked=stacked, gram=gram
        )
        for stacked in (False, True)
        for gram in (False, True)
    }
    steps["stacked, bfloat16 loop"] = form(stacked=True, gram=False, dtype=torch.bfloat16)
    secs = bench.time_interleaved(steps, warmup=3, rounds=args.rounds)
    base = "per matrix, loop"
    rows = [
        {"variant": n, "ms": round(1000 * t, 2), "vs_base": round(secs[base] / t, 3)}
        for n, t in secs.items()
    ]
    save_rows(
        rows,
        stem="muon_ns",
        command=f"python scripts/ablate_speed.py --muon-ns --rounds {args.rounds}",
        about="Muon's iterations (float32 forms, and the stacked loop in bfloat16), 5 steps, for "
        "the 16 matrices of today's cpu60 model: 4 "
        "each of 576x192, 192x192, 384x192, 192x384; median of rounds, interleaved; "
        f"{torch.get_num_threads()} threads",
        header=("form", f"vs {base}"),
        ratio_key="vs_base",
        meta={},
        columns=(("ms for the 16", "ms"),),
    )


def batch_sizes_main(args: argparse.Namespace) -> None:
    """The cpu60 model's curriculum stages at other batch sizes against 128 (bf16-mixed, fused
    AdamW), interleaved: images/s per stage, since a batch size changes the steps and the
    images an hour buys."""
    sizes = sorted({128, *args.batch_sizes})
    steps = {
        f"{side}x{side} batch {b}": resolution_step(side=side, batch=b, fused_adam=True)
        for side in (16, 24, 32)
        for b in sizes
    }
    secs = bench.time_interleaved(steps, warmup=3, rounds=args.rounds)
    rows = []
    for side in (16, 24, 32):
        ref = 128 / secs[f"{side}x{side} batch 128"]
        for b in sizes:
            ips = b / secs[f"{side}x{side} batch {b}"]
            rows.append(
                {
                    "variant": f"{side}x{side} batch {b}",
                    "batch": b,
                    "ms_per_step": round(1000 * secs[f"{side}x{side} batch {b}"], 1),
                    "images_per_s": round(ips, 1),
                    "vs_batch_128": round(ips / ref, 3),
                }
            )
    listed = " ".join(str(b) for b in args.batch_sizes)
    save_rows(
        rows,
        stem=f"batch_sizes_{'_'.join(str(b) for b in args.batch_sizes)}",
        command=f"python scripts/ablate_speed.py --batch-sizes {listed} --rounds {args.rounds}",
        about="width 192, depth 6, 3 heads, MLP 384, patch 4, bf16-mixed, fused AdamW; "
        "median of interleaved rounds",
        header=("stage, batch", "img/s vs batch 128"),
        ratio_key="vs_batch_128",
        meta={},
    )


def fp32_main(args: argparse.Namespace) -> None:
    """For CPUs without native bf16: the cpu60 model's curriculum stages in float32, explicit vs
    fused attention (interleaved), then bf16-mixed at 32x32 (3 rounds: it is slow there)."""
    steps = {
        f"{side}x{side} 32-true {kernel}": resolution_step(
            side=side, batch=args.batch, fused_adam=True, precision="32-true", kernel=kernel
        )
        for side in (16, 24, 32)
        for kernel in ("explicit", "fused")
    }
    secs = bench.time_interleaved(steps, warmup=3, rounds=args.rounds)
    bf16 = resolution_step(side=32, batch=args.batch, fused_adam=True)
    secs["32x32 bf16-mixed explicit"] = bench.time_interleaved({"b": bf16}, warmup=1, rounds=3)["b"]
    write_table(
        secs,
        batch=args.batch,
        base="32x32 32-true explicit",
        stem="fp32",
        command=f"python scripts/ablate_speed.py --fp32 --batch {args.batch} --rounds {args.rounds}",
        about=f"batch {args.batch}, width 192, depth 6, 3 heads, MLP 384, patch 4, fused AdamW; "
        f"CPU ISA {torch.backends.cpu.get_cpu_capability()}, native bf16: "
        f"{bench.cpu_has_fast_bf16()}",
    )


def kernels_fp32_main(args: argparse.Namespace) -> None:
    """Explicit vs fused attention in float32 at 32x32, MLP ratio 2 (cpu60) and 4 (benchmark.py)."""
    steps = {
        f"MLP ratio {ratio:g}, {kernel}": resolution_step(
            side=32,
            batch=args.batch,
            fused_adam=True,
            precision="32-true",
            kernel=kernel,
            mlp_ratio=ratio,
        )
        for ratio in (2.0, 4.0)
        for kernel in ("explicit", "fused")
    }
    time_and_write(
        steps,
        args=args,
        base="MLP ratio 2, explicit",
        stem="kernels_fp32",
        command=f"python scripts/ablate_speed.py --kernels-fp32 --batch {args.batch} "
        f"--rounds {args.rounds}",
        about=f"float32, 32x32, batch {args.batch}, width 192, depth 6, 3 heads, fused AdamW; "
        f"CPU ISA {torch.backends.cpu.get_cpu_capability()}",
    )


ALLOCATOR_MODELS = ("ours", "timm-unfused", "vit-pytorch")
ALLOCATOR_CHILD = """
import ctypes, json, sys
applied = {keep}
if applied:  # glibc's M_MMAP_THRESHOLD (-3) and M_TRIM_THRESHOLD (-1)
    libc = ctypes.CDLL("libc.so.6")
    applied = libc.mallopt(-3, 32 * 2**20) == 1 and libc.mallopt(-1, 2**30) == 1
sys.path.insert(0, "scripts")
import benchmark as bench
cfg = dict(width=192, depth=6, heads=3, mlp=768)
steps = {{n: bench.make_steps(bench.build(n, **cfg), batch={batch}, precision="bf16-mixed")[0]
         for n in {models!r}}}
secs = bench.time_interleaved(steps, warmup=2, rounds=5)
maps = open("/proc/self/maps").read()  # which malloc this process runs (LD_PRELOAD took?)
malloc = [lib for lib in ("jemalloc", "tcmalloc") if lib in maps] or ["glibc"]
print(json.dumps({{"applied": applied, "malloc": malloc, **{{n: {batch} / s for n, s in secs.items()}}}}))
"""


def alternate_processes(
    settings: dict[str, tuple[str, dict[str, str]]], *, processes: int
) -> dict[str, list[dict]]:
    """Run each setting's (child code, extra environment) in `processes` fresh Python processes,
    alternating between settings; each run's last line of output, read as JSON."""
    runs: dict[str, list[dict]] = {setting: [] for setting in settings}
    for _ in range(processes):
        for setting, (code, env) in settings.items():
            out = subprocess.run(
                [sys.executable, "-c", code],
                cwd=REPO,
                capture_output=True,
                text=True,
                env={**os.environ, **env},
            )
            if out.returncode != 0:
                raise SystemExit(out.stderr)
            runs[setting].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


def allocator_main(args: argparse.Namespace) -> None:
    """Each setting in fresh processes, alternating; median img/s per model over the processes."""
    code = {
        keep: ALLOCATOR_CHILD.format(batch=args.batch, models=ALLOCATOR_MODELS, keep=keep)
        for keep in (False, True)
    }
    runs = alternate_processes(
        {"glibc default": (code[False], {}), "freed memory kept": (code[True], {})},
        processes=args.processes,
    )
    write_process_table(
        runs,
        args=args,
        stem="allocator",
        first="allocator",
        command=f"python scripts/ablate_speed.py --allocator --batch {args.batch}",
    )


def runtime_main(args: argparse.Namespace) -> None:
    """Lead 7: OpenMP thread binding and other mallocs (LD_PRELOAD), each in fresh processes,
    alternating with the default; a malloc that is not installed is left out and said so."""
    from ctypes.util import find_library

    code = ALLOCATOR_CHILD.format(batch=args.batch, models=ALLOCATOR_MODELS, keep=False)
    settings = {
        "default": (code, {}),
        "OMP_PROC_BIND=close OMP_PLACES=cores": (
            code,
            {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
        ),
    }
    expect = dict.fromkeys(settings, "glibc")  # the malloc each setting's child must run
    missing = []
    mallocs = (
        ("jemalloc", "jemalloc", "libjemalloc2"),
        ("tcmalloc", "tcmalloc_minimal", "libtcmalloc-minimal4"),
    )
    for name, lib, debian in mallocs if args.runtime == "all" else ():
        found = find_library(lib)  # a soname: LD_PRELOAD searches the library path for it
        if found:
            label = f"{name} (LD_PRELOAD={found})"
            settings[label], expect[label] = (code, {"LD_PRELOAD": found}), name
        else:
            missing.append(f"{name} not installed (Debian: {debian}), not timed")
    runs = alternate_processes(settings, processes=args.processes)
    for setting, rs in runs.items():  # a preload that did not take would time glibc twice
        if any(r["malloc"] != [expect[setting]] for r in rs):
            raise SystemExit(f"{setting}: the child ran {rs[0]['malloc']}, not {expect[setting]}")
    write_process_table(
        runs,
        args=args,
        stem="runtime" if args.runtime == "all" else "runtime_omp",
        first="runtime setting",
        command=f"python scripts/ablate_speed.py --runtime {args.runtime} --batch {args.batch} "
        f"--processes {args.processes}",
        notes=tuple(missing),
    )


def write_process_table(
    runs: dict[str, list[dict]],
    *,
    args: argparse.Namespace,
    stem: str,
    first: str,
    command: str,
    notes: tuple[str, ...] = (),
) -> None:
    """alternate_processes' runs of ALLOCATOR_CHILD -> <stem>.json and <stem>.md: the median
    img/s of each model per setting, and its ratio to the first setting's."""
    table = {
        setting: {n: statistics.median(r[n] for r in rs) for n in ALLOCATOR_MODELS}
        for setting, rs in runs.items()
    }
    out = {"command": command, "batch": args.batch, "runs": runs, "median_images_per_s": table}
    bench.OUT.mkdir(parents=True, exist_ok=True)
    (bench.OUT / f"{stem}.json").write_text(json.dumps(out, indent=2))
    base = next(iter(table.values()))
    lines = [
        f"Command: `{command}` (bf16-mixed training steps, width 192, depth 6, MLP 768; "
        f"median over {args.processes} fresh processes per setting, alternating; CPU ISA "
        f"{torch.backends.cpu.get_cpu_capability()})",
        "",
        f"| {first} | " + " | ".join(ALLOCATOR_MODELS) + " |",
        "|---|" + "---|" * len(ALLOCATOR_MODELS),
    ]
    for setting, rates in table.items():
        cells = [f"{rates[n]:.1f} ({rates[n] / base[n]:.2f}x)" for n in ALLOCATOR_MODELS]
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    lines += [f"\n{note}" for note in notes]
    (bench.OUT / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def tokens_main(args: argparse.Namespace) -> None:
    """Lead 8: 65 tokens against 64 at benchmark.py's configuration, bf16-mixed training steps.
    Mean pooling keeps every token in every block, so the two differ by the CLS token alone."""
    models = {
        "65 tokens: CLS + 64 patches, mean pooling": dict(class_token=True, global_pool="avg"),
        "64 tokens: no CLS, mean pooling": dict(class_token=False, global_pool="avg"),
        "ours: CLS pooling, last block on the CLS row": dict(),
    }
    steps = {}
    for name, cfg in models.items():
        torch.manual_seed(0)
        model = bench.build("ours", width=192, depth=6, heads=3, mlp=768, **cfg)
        steps[name] = bench.make_steps(model, batch=args.batch, precision="bf16-mixed")[0]
    time_and_write(
        steps,
        args=args,
        base="65 tokens: CLS + 64 patches, mean pooling",
        stem="tokens",
        command=f"python scripts/ablate_speed.py --tokens --batch {args.batch} "
        f"--rounds {args.rounds}",
        about=f"bf16-mixed training steps, batch {args.batch}, width 192, depth 6, 3 heads, "
        f"MLP 768, explicit attention; CPU ISA {torch.backends.cpu.get_cpu_capability()}",
    )


def compile_passes_main(args: argparse.Namespace) -> None:
    """Lead 5: our explicit-attention step eager, compiled, and compiled with inductor's pattern
    matcher off (its joint-graph passes hold fuse_attention), compiled before timing with
    inductor's caches off so each compile runs its passes, and what those passes matched."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    steps, matched = {}, {}
    for name, compile_, passes in (
        ("eager", False, True),
        ("compiled", True, True),
        ("compiled, pattern matcher off", True, False),
    ):
        steps[name] = make_step(
            kernel="explicit",
            precision="bf16-mixed",
            fused_adam=True,
            compile_=compile_,
            batch=args.batch,
        )
        counters.clear()
        with inductor_config.patch(pattern_matcher=passes, force_disable_caches=True):
            steps[name]()
        matched[name] = {
            key: counters["inductor"][key] for key in ("fuse_attention", "pattern_matcher_count")
        }
    time_and_write(
        steps,
        args=args,
        base="eager",
        stem="compile_passes",
        command=f"python scripts/ablate_speed.py --compile-passes --batch {args.batch} "
        f"--rounds {args.rounds}",
        about=f"bf16-mixed training steps, batch {args.batch}, width 192, depth 6, 3 heads, "
        f"MLP 768, explicit attention, fused AdamW; inductor matches per compile: {matched}",
        extra={"matched": matched},
    )


def autotuned_products(record: list[dict]):
    """A feedback function for inductor's autotuner: appends each product it tuned to `record`
    (op, input shapes, each choice's time in ms, the winner)."""

    def save(timings, name, input_nodes, choices, _profile, _precompile) -> None:
        best = min(timings, key=timings.get)
        record.append(
            {
                "op": name,
                "shapes": [[int(d) for d in n.get_size()] for n in input_nodes],
                "ms": {c.name: round(t, 3) for c, t in timings.items()},
                "best": best.name,
            }
        )

    return save


def template_wins(record: list[dict]) -> str:
    """'N tuned, K won by the C++ template' for autotuned_products' record."""
    won = sum(r["best"].startswith("cpp_") for r in record)
    return f"{len(record)} tuned, {won} won by the template"


def compile_modes_main(args: argparse.Namespace) -> None:
    """Lead 5's other claim: in training, max-autotune's C++ GEMM template does not apply to the
    Linear layers (their weights are not constants), so the mode buys about what the default
    does; in inference, frozen weights are constants and the template may compete. Each compiled
    variant runs its first call (its compile) with inductor's caches off, so autotuning runs and
    every product it tunes is recorded."""
    import torch._inductor.config as inductor_config
    from torch._inductor import select_algorithm

    max_autotune = "max-autotune-no-cudagraphs"  # a CPU has no CUDA graphs to capture
    train_modes = {  # (compile, mode)
        "eager": (False, None),
        "compiled": (True, None),
        "compiled, max-autotune": (True, max_autotune),
    }
    infer_modes = {  # (compile, mode, frozen weights)
        "eager": (False, None, False),
        "compiled": (True, None, False),
        "compiled, frozen weights": (True, None, True),
        "compiled, frozen weights, max-autotune": (True, max_autotune, True),
    }
    steps: dict[str, dict] = {"train": {}, "infer": {}}
    tuned: dict[str, dict] = {"train": {}, "infer": {}}

    def first_call(kind: str, name: str, step, *, freezing: bool = False) -> None:
        record: list[dict] = []
        select_algorithm.add_feedback_saver(autotuned_products(record))
        try:
            with inductor_config.patch(force_disable_caches=True, freezing=freezing):
                step()
        finally:
            select_algorithm.clear_feedback_savers()
        tuned[kind][f"{kind}: {name}"] = record
        steps[kind][f"{kind}: {name}"] = step

    for name, (compile_, mode) in train_modes.items():
        step = make_step(
            kernel="explicit",
            precision="bf16-mixed",
            fused_adam=True,
            compile_=compile_,
            batch=args.batch,
            mode=mode,
        )
        first_call("train", name, step)
    for name, (compile_, mode, freezing) in infer_modes.items():
        torch.manual_seed(0)
        model = bench.build("ours", width=192, depth=6, heads=3, mlp=768)
        forward = torch.compile(model, mode=mode) if compile_ else model
        infer = bench.make_steps(forward, batch=args.batch, precision="bf16-mixed")[1]
        first_call("infer", name, infer, freezing=freezing)
    for kind in ("train", "infer"):
        time_and_write(
            steps[kind],
            args=args,
            base=f"{kind}: eager",
            stem=f"compile_modes_{kind}",
            command=f"python scripts/ablate_speed.py --compile-modes --batch {args.batch} "
            f"--rounds {args.rounds}",
            about=f"bf16-mixed {'training steps, fused AdamW' if kind == 'train' else 'inference'}"
            f", batch {args.batch}, width 192, depth 6, 3 heads, MLP 768, explicit attention; "
            f"products autotuned per variant, and how many of them inductor's C++ template won: "
            f"{ {n: template_wins(r) for n, r in tuned[kind].items()} }; "
            f"CPU ISA {torch.backends.cpu.get_cpu_capability()}",
            extra={"autotuned": tuned[kind]},
            columns=TRAIN_COLUMNS if kind == "train" else INFER_COLUMNS,
        )


MKL_CHILD = """
import json, sys, time
import vit  # first: vit.mkl_amd decides MKL's kernels before torch loads
sys.path.insert(0, "scripts")
import ablate_speed as ab
import benchmark as bench
steps = {{f"cpu60 model {{s}}x{{s}}": ab.resolution_step(side=s, batch={batch}, fused_adam=True,
         precision="32-true", kernel="auto") for s in (16, 32)}}
cfg = dict(width=192, depth=6, heads=3, mlp=768)
steps.update({{f"{{n}} (benchmark.py's model)": bench.make_steps(bench.build(n, **cfg),
              batch={batch}, precision="32-true")[0] for n in {models!r}}})
secs = bench.time_interleaved(steps, warmup=2, rounds={rounds})
print(json.dumps({{"status": vit.mkl_amd.status(), **{{n: {batch} / s for n, s in secs.items()}}}}))
"""


def mkl_main(args: argparse.Namespace) -> None:
    """MKL's generic path (VIT_MKL_AVX2=0) against its AVX2 one on an AMD CPU (vit/mkl_amd.py):
    float32 training steps, each setting in fresh processes, alternating."""
    code = MKL_CHILD.format(batch=args.batch, models=ALLOCATOR_MODELS, rounds=args.rounds)
    runs = alternate_processes(
        {
            "MKL generic (VIT_MKL_AVX2=0)": (code, {"VIT_MKL_AVX2": "0"}),
            "MKL AVX2 (default)": (code, {"VIT_MKL_AVX2": "1"}),
        },
        processes=args.processes,
    )
    names = [n for n in runs["MKL AVX2 (default)"][0] if n != "status"]
    table = {s: {n: statistics.median(r[n] for r in rs) for n in names} for s, rs in runs.items()}
    command = (
        f"python scripts/ablate_speed.py --mkl --batch {args.batch} --rounds {args.rounds} "
        f"--processes {args.processes}"
    )
    out = {"command": command, "batch": args.batch, "runs": runs, "median_images_per_s": table}
    bench.OUT.mkdir(parents=True, exist_ok=True)
    (bench.OUT / "mkl_amd.json").write_text(json.dumps(out, indent=2))
    generic, avx2 = table.values()
    lines = [
        f"Command: `{command}` (float32 training steps, fused AdamW; median over "
        f"{args.processes} fresh processes per setting, alternating; CPU ISA "
        f"{torch.backends.cpu.get_cpu_capability()})",
        "",
        "Status in the AVX2 runs: " + runs["MKL AVX2 (default)"][0]["status"],
        "",
        "| model | MKL generic img/s | MKL AVX2 img/s | AVX2 / generic |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {n} | {generic[n]:.1f} | {avx2[n]:.1f} | {avx2[n] / generic[n]:.2f}x |" for n in names
    ]
    (bench.OUT / "mkl_amd.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def loop_fit(*, args: argparse.Namespace, record: bool, root: Path) -> float:
    """Mean seconds per step of vit-train's loop (the cpu60 model, bf16-mixed, fused AdamW), no
    validation; with `record`, CSV logging every 50 steps and last.ckpt every 100 as well."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from vit.callbacks import LastCheckpoint
    from vit.data import CIFAR10DataModule
    from vit.lit_module import ViTClassifier

    class StepClock(L.Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_train_batch_start(self, *_args) -> None:
            self.starts.append(time.perf_counter())

    torch.manual_seed(0)
    module = ViTClassifier(
        preset="vit_tiny", mlp_ratio=2.0, fused_adamw=True, warmup_epochs=0.0, label_smoothing=0.1
    )
    data = CIFAR10DataModule(data_dir=args.data_dir, batch_size=args.batch)
    clock = StepClock()
    callbacks: list[L.Callback] = [clock]
    if record:
        callbacks.append(LastCheckpoint(dirpath=str(root / "ckpt"), every_n_train_steps=100))
    trainer = L.Trainer(
        max_epochs=1,
        max_steps=args.loop_steps + 10,
        precision="bf16-mixed",
        logger=CSVLogger(root, name="loop") if record else False,
        log_every_n_steps=50,
        callbacks=callbacks,
        enable_checkpointing=record,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=data)
    steady = clock.starts[10:]  # after 10 warm-up steps
    return (steady[-1] - steady[0]) / (len(steady) - 1)


def loop_main(args: argparse.Namespace) -> None:
    step = resolution_step(side=32, batch=args.batch, fused_adam=True)
    secs = {
        "bare step (random input)": bench.time_interleaved({"s": step}, warmup=3, rounds=20)["s"]
    }
    loops = {
        "fit loop: data, augmentation, metrics, schedule": False,
        "+ CSV log every 50 steps, last.ckpt every 100 (vit-train)": True,
    }
    runs: dict[str, list[float]] = {name: [] for name in loops}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.loop_repeats):  # alternated, so drift hits both alike
            for name, record in loops.items():
                runs[name].append(loop_fit(args=args, record=record, root=Path(tmp)))
    secs.update({name: statistics.median(times) for name, times in runs.items()})
    command = (
        f"python scripts/ablate_speed.py --loop --batch {args.batch} "
        f"--loop-steps {args.loop_steps} --loop-repeats {args.loop_repeats}"
    )
    write_table(
        secs,
        batch=args.batch,
        base="bare step (random input)",
        stem="loop",
        command=command,
        about="32x32, width 192, depth 6, 3 heads, MLP 384, bf16-mixed, fused AdamW; bare step: "
        f"median of 20; loops: mean over {args.loop_steps} steps after 10, median of "
        f"{args.loop_repeats} alternated runs",
        extra={"steps": args.loop_steps, "loop_runs_s_per_step": runs},
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--resolutions", action="store_true", help="time the curriculum's stages")
    p.add_argument(
        "--batch-sizes", type=int, nargs="+", help="curriculum stages: these batches vs 128"
    )
    p.add_argument("--allocator", action="store_true", help="glibc default vs freed memory kept")
    p.add_argument("--lsa", action="store_true", help="curriculum stages: plain attention vs LSA")
    p.add_argument("--spt", action="store_true", help="curriculum stages: patches vs SPT")
    p.add_argument(
        "--patch-drop", action="store_true", help="curriculum stages: all tokens vs half dropped"
    )
    p.add_argument(
        "--mlp-ratio", action="store_true", help="curriculum stages at depth 4: MLP ratio 2 vs 4"
    )
    p.add_argument(
        "--fast-step", action="store_true", help="curriculum stages: bf16-mixed vs full, compile"
    )
    p.add_argument(
        "--muon", action="store_true", help="curriculum stages at depth 4: AdamW vs Muon"
    )
    p.add_argument(
        "--muon-ns", action="store_true", help="Muon's iterations: loop vs Gram, stacked, bf16"
    )
    p.add_argument(
        "--muon-ns-steps", action="store_true", help="curriculum stages: Muon's 5 iterations vs 3"
    )
    p.add_argument(
        "--precision",
        choices=("32-true", "bf16-mixed", "bf16-full"),
        help="stage A/Bs: this precision instead of bf16-mixed (32-true for CPUs without bf16)",
    )
    p.add_argument("--fp32", action="store_true", help="float32 kernels, for CPUs without bf16")
    p.add_argument("--kernels-fp32", action="store_true", help="float32: explicit vs fused")
    p.add_argument("--mkl", action="store_true", help="AMD CPUs: MKL's generic vs AVX2 path")
    p.add_argument(
        "--runtime",
        nargs="?",
        const="all",
        choices=("all", "omp"),
        help="OpenMP binding, jemalloc, tcmalloc (lead 7); 'omp': the binding alone",
    )
    p.add_argument("--tokens", action="store_true", help="65 tokens vs 64 (lead 8)")
    p.add_argument(
        "--compile-passes", action="store_true", help="inductor's pattern passes (lead 5)"
    )
    p.add_argument(
        "--compile-modes", action="store_true", help="torch.compile: default vs max-autotune"
    )
    p.add_argument(
        "--processes", type=int, default=3, help="--allocator, --mkl, --runtime: processes each"
    )
    p.add_argument("--loop", action="store_true", help="the fit loop vs its bare step")
    p.add_argument("--loop-steps", type=int, default=250, help="--loop: steps timed per loop")
    p.add_argument("--loop-repeats", type=int, default=1, help="--loop: alternated runs of each")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared/data/cifar10-jpeg.tar.gz"))
    p.add_argument(
        "--out",
        type=Path,
        default=bench.OUT,
        help="folder for the tables (default experiments/benchmarks; another CPU's runs go in a "
        "folder of their own, such as experiments/benchmarks/amx)",
    )
    args = p.parse_args()
    bench.OUT = args.out
    if args.loop:
        loop_main(args)
        return
    if args.allocator:
        allocator_main(args)
        return
    if args.mkl:
        mkl_main(args)
        return
    for flag, run in (
        ("runtime", runtime_main),
        ("tokens", tokens_main),
        ("compile_passes", compile_passes_main),
        ("compile_modes", compile_modes_main),
    ):
        if getattr(args, flag):
            run(args)
            return
    if args.batch_sizes:
        batch_sizes_main(args)
        return
    for name, ab in STAGE_ABS.items():
        if getattr(args, name):
            stages_ab(args, flag=f"--{name.replace('_', '-')}", **ab)
            return
    if args.muon_ns:
        muon_ns_main(args)
        return
    if args.fast_step:
        fast_step_main(args)
        return
    if args.fp32:
        fp32_main(args)
        return
    if args.kernels_fp32:
        kernels_fp32_main(args)
        return
    variants = {}
    for kernel in ("explicit", "fused"):
        for precision in ("32-true", "bf16-mixed", "bf16-full"):
            variants[f"{kernel} {precision}"] = dict(
                kernel=kernel, precision=precision, fused_adam=False, compile_=False
            )
    variants["explicit bf16-mixed fused-adamw"] = dict(
        kernel="explicit", precision="bf16-mixed", fused_adam=True, compile_=False
    )
    variants["explicit bf16-full fused-adamw"] = dict(
        kernel="explicit", precision="bf16-full", fused_adam=True, compile_=False
    )
    if args.compile:
        for precision in ("bf16-mixed", "bf16-full"):
            variants[f"explicit {precision} compile"] = dict(
                kernel="explicit", precision=precision, fused_adam=False, compile_=True
            )
    steps = {name: make_step(batch=args.batch, **cfg) for name, cfg in variants.items()}
    time_and_write(
        steps,
        args=args,
        base="explicit bf16-mixed",
        stem="ablation",
        command="python scripts/ablate_speed.py",
        about=f"batch {args.batch}, width 192, depth 6, MLP 768",
    )


if __name__ == "__main__":
    main()
