"""On a GPU: the fit-start compile of gpu8.yaml's curriculum shapes under CUDA graphs
(reduce-overhead), then 8 training steps and an evaluation at those shapes; prints dynamo's graph
count after each: equal counts mean no recompile mid-fit. Run from the repository root:
    PYTHONPATH=$PWD python3 scripts/gpu/warmup_check.py
"""

import torch
import yaml
from torch._dynamo.utils import counters

from vit.model.config import NetworkConfig
from vit.train.warmup import compile_planned_shapes, stage_pairs

cfg = yaml.safe_load(open("experiments/gpu8.yaml"))["model"]["network"]
m = NetworkConfig(**cfg).build().cuda()
m.set_dynamic_img_size(True)
m.compile(dynamic=False, mode="reduce-overhead")
shapes = stage_pairs([(0, 16), (0.25, 24), (0.5, 32)], [(0, 0.0), (0.25, 0.5), (0.85, 0.0)])
ctx = torch.autocast("cuda", dtype=torch.bfloat16)
n = compile_planned_shapes(
    m, shapes=shapes, batch_size=512, eval_batch_sizes=[1000], in_chans=3, full_side=32, context=ctx
)
g0 = counters["stats"]["unique_graphs"]
print("warm-up ran", n, "graphs", g0, flush=True)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

for side, rate in shapes + shapes:
    m.set_patch_drop(rate)
    x = torch.randn(512, 3, side, side, device="cuda")
    with ctx:
        loss = m(x).float().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
m.eval()
with torch.no_grad(), ctx:
    m(torch.randn(1000, 3, 32, 32, device="cuda"))
torch.cuda.synchronize()
print(
    "after training steps: graphs",
    counters["stats"]["unique_graphs"],
    "(same means no recompile)",
    flush=True,
)
