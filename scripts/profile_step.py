"""Where a training step's time goes: torch.profiler over a few steps of our ViT, after warm-up.

    python scripts/profile_step.py                       # bf16 autocast, batch 128, vit_tiny
    python scripts/profile_step.py --precision 32-true --batch 64 --rows 40

Prints the operators sorted by self CPU time, grouped by input shape.
"""

from __future__ import annotations

import argparse

import vit  # noqa: F401  first: MKL's AVX2 kernels on AMD CPUs load with torch (vit/mkl_amd.py)

# isort: split
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from vit.model import create_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="vit_tiny")
    p.add_argument("--kernel", default="auto", choices=("auto", "fused", "explicit"))
    p.add_argument("--precision", default="bf16-mixed", choices=("bf16-mixed", "32-true"))
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rows", type=int, default=25)
    args = p.parse_args()
    torch.manual_seed(0)
    model = create_model(args.preset, kernel=args.kernel)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))
    bf16 = args.precision == "bf16-mixed"

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(args.steps):
            step()
    table = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total",
        row_limit=args.rows,
        max_name_column_width=32,
        max_shapes_column_width=60,
    )
    print(table)


if __name__ == "__main__":
    main()
