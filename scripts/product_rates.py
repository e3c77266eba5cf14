"""Where a training step's products and elementwise kernels stand against this machine's rates.

    python scripts/product_rates.py --name product-rates-amx-m167
    python scripts/product_rates.py --precision 32-true --mlp 384 --tokens 2048 8192

Each linear layer of the benchmark's ViT (width 192, MLP 768, 65 tokens a image, batch 128: 8,320
tokens) makes three products a step: the forward x W^T, the input's gradient g W, and the weight's
gradient g^T x, a reduction over every token of the batch into a small matrix; the last once more
with g stored transposed, which tells a slow kernel from a slow layout. Each is timed alone (best
of rounds) and given in GFLOP/s beside the machine's large square product, and so are the
attention's per-head products (batch x heads small matrices). Then GELU forward and backward at
the MLP's width, and the copy that would store g transposed: ATen's kernels (what eager runs)
against inductor's generated ones (what torch.compile runs), the same arithmetic. A profile says
how long the step's products take; this says which of them run slowly and why, and whether the
generated elementwise code keeps up.
Writes experiments/record/benchmarks/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))  # scripts/ is no package: benchmark.py's GEMM peak

from vit.commands.entry import switch_mkl  # noqa: E402

if __name__ == "__main__":  # as the entry points: MKL's AVX2 kernels on AMD CPUs
    switch_mkl()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from benchmark import gemm_peak, print_and_record, record_head  # noqa: E402

from vit.system.hardware import (  # noqa: E402
    check_cpp_compiler,
    cpu_has_fast_bf16,
)

DTYPES = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16}


def best_ms(fn: Callable[[], object], *, rounds: int, repeat: int) -> float:
    """The fastest of `rounds` timings of `repeat` back-to-back calls, in ms per call."""
    fn()  # warm-up: first-call allocation, a compiled function's compile
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t) / repeat)
    return best * 1e3


def product_row(
    fn: Callable[[], object], tokens: int, layer: str, product: str, gflop: float, rounds: int
) -> dict:
    """One table row: `fn` (a product of `gflop` GFLOP) timed, in ms and GFLOP/s."""
    ms = best_ms(fn, rounds=rounds, repeat=5)
    return dict(
        tokens=tokens,
        layer=layer,
        product=product,
        ms=round(ms, 3),
        gflop_per_s=round(gflop / ms * 1e3, 1),
    )


def linear_rows(dtype: torch.dtype, *, tokens: int, width: int, mlp: int, rounds: int) -> list:
    """The three products of each block's linear layers (qkv, proj, fc1, fc2) at `tokens`."""
    rows = []
    for layer, (out, inp) in {
        "qkv": (3 * width, width),
        "proj": (width, width),
        "fc1": (mlp, width),
        "fc2": (width, mlp),
    }.items():
        x, g = torch.randn(tokens, inp).to(dtype), torch.randn(tokens, out).to(dtype)
        w = torch.randn(out, inp).to(dtype)
        g_cols = g.t().contiguous()  # the same gradient stored column by column
        gflop = 2 * tokens * out * inp / 1e9
        for product, fn in {
            "forward x W^T": lambda x=x, w=w: x @ w.t(),
            "input grad g W": lambda g=g, w=w: g @ w,
            "weight grad g^T x": lambda g=g, x=x: g.t() @ x,
            # the same product with its first operand contiguous along the tokens: what the weight
            # gradient would cost if the backward stored g transposed (the copy not timed here)
            "weight grad, g stored transposed": lambda g_cols=g_cols, x=x: g_cols @ x,
        }.items():
            rows.append(product_row(fn, tokens, layer, product, gflop, rounds))
    return rows


def attention_rows(
    dtype: torch.dtype, *, tokens: int, seq: int, heads: int, head_dim: int, rounds: int
) -> list:
    """The per-head products of attention, q k^T and a v: (tokens / seq) x heads small ones."""
    matrices = tokens // seq * heads
    q = torch.randn(matrices, seq, head_dim).to(dtype)
    a = torch.randn(matrices, seq, seq).to(dtype)
    gflop = 2 * matrices * seq * seq * head_dim / 1e9
    products = {"q k^T": lambda: q @ q.mT, "a v": lambda: a @ q}
    return [product_row(fn, tokens, "attention", p, gflop, rounds) for p, fn in products.items()]


def elementwise_rows(dtype: torch.dtype, *, tokens: int, width: int, mlp: int, rounds: int) -> list:
    """ATen's kernels (what eager runs) against inductor's (what torch.compile runs) on the MLP's
    GELU, forward and backward, and on the copy that would store the qkv and fc1 gradients
    transposed (the price of the fast weight-gradient row above)."""
    x, g = torch.randn(tokens, mlp).to(dtype), torch.randn(tokens, mlp).to(dtype)
    g_qkv = torch.randn(tokens, 3 * width).to(dtype)

    def forward(a):  # noqa: ANN001, ANN202
        return F.gelu(a)

    def backward(grad, a):  # noqa: ANN001, ANN202
        return torch.ops.aten.gelu_backward(grad, a)

    def transposed(a):  # noqa: ANN001, ANN202
        return a.t().contiguous()

    ops = {
        "gelu forward": (forward, (x,)),
        "gelu backward": (backward, (g, x)),
        f"g^T copy ({tokens} x {3 * width})": (transposed, (g_qkv,)),
        f"g^T copy ({tokens} x {mlp})": (transposed, (g,)),
    }
    rows = []
    for op, (fn, args) in ops.items():
        compiled = torch.compile(fn)
        for kind, f in {"eager": fn, "compiled": compiled}.items():
            ms = best_ms(lambda f=f, args=args: f(*args), rounds=rounds, repeat=10)
            rows.append(dict(tokens=tokens, op=op, kernels=kind, ms=round(ms, 3)))
    return rows


def to_markdown(res: dict) -> str:
    peak = res["square_gflop_per_s"]
    lines = [
        f"`{res['command']}`",
        "",
        f"{res['date']}, {res['machine']}, torch {res['torch']}, "
        f"{res['precision']}, {res['threads']} threads. Square {res['square']}^3 product: "
        f"**{peak:,.0f} GFLOP/s**.",
        "",
        "| tokens | layer | product | ms | GFLOP/s | of the square rate |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["products"]:
        lines.append(
            f"| {r['tokens']} | {r['layer']} | {r['product']} | {r['ms']} | "
            f"{r['gflop_per_s']:,.0f} | {r['gflop_per_s'] / peak:.0%} |"
        )
    lines += ["", "| tokens | op | kernels | ms | compiled / eager |", "|---|---|---|---|---|"]
    eager = {r["op"]: r["ms"] for r in res["elementwise"] if r["kernels"] == "eager"}
    for r in res["elementwise"]:
        lines.append(
            f"| {r['tokens']} | {r['op']} | {r['kernels']} | {r['ms']} | "
            f"{r['ms'] / eager[r['op']]:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--precision",
        choices=list(DTYPES),
        default=None,
        help="default: bf16-mixed where this CPU multiplies bf16 natively, else 32-true",
    )
    p.add_argument("--tokens", type=int, nargs="+", default=[128 * 65])
    p.add_argument("--width", type=int, default=192)
    p.add_argument("--mlp", type=int, default=768)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--seq", type=int, default=65, help="tokens a image, for attention")
    p.add_argument("--square", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--name", default=None, help="write <out-dir>/<name>.{json,md}")
    p.add_argument("--out-dir", type=Path, default=REPO / "experiments" / "record" / "benchmarks")
    ns = p.parse_args(argv)
    precision = ns.precision or ("bf16-mixed" if cpu_has_fast_bf16() else "32-true")
    dtype = DTYPES[precision]
    check_cpp_compiler("scripts/product_rates.py", "run it where g++ is installed")
    products = []
    for tokens in ns.tokens:
        products += linear_rows(dtype, tokens=tokens, width=ns.width, mlp=ns.mlp, rounds=ns.rounds)
    products += attention_rows(
        dtype,
        tokens=ns.tokens[-1],
        seq=ns.seq,
        heads=ns.heads,
        head_dim=ns.width // ns.heads,
        rounds=ns.rounds,
    )
    res = dict(
        **record_head("product_rates.py", argv),
        precision=precision,
        square=ns.square,
        square_gflop_per_s=round(gemm_peak(dtype, sizes=(ns.square,), rounds=ns.rounds), 1),
        products=products,
        elementwise=elementwise_rows(
            dtype, tokens=ns.tokens[-1], width=ns.width, mlp=ns.mlp, rounds=ns.rounds
        ),
    )
    return print_and_record(res, to_markdown(res), out=ns.out_dir, name=ns.name)


if __name__ == "__main__":
    main()
