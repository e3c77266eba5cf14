"""Inference speed by batch size, as vit-evaluate runs a model: which --batch-size a CPU wants.

    python scripts/eval_batch.py --name eval-batch-avx2

Each model (the shipped weights, and the network of experiments/cifar10.yaml, freshly initialised:
speed does not depend on the weights) classifies the same random images in batches of each size,
float32 under torch.inference_mode with the CIFAR-10 normalisation, as vit-evaluate's loop does;
sizes and models are interleaved round by round, and each cell is the median over rounds. On a
CPU a large batch's activations outgrow the caches, so a smaller batch may run faster; on a GPU
the opposite holds. Writes experiments/record/benchmarks/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))  # scripts/ is no package: benchmark.py's write_record

from vit.commands.entry import switch_mkl  # noqa: E402

if __name__ == "__main__":  # as the entry points: MKL's AVX2 kernels on AMD CPUs
    switch_mkl()

import torch  # noqa: E402
import yaml  # noqa: E402
from benchmark import print_and_record, record_head  # noqa: E402

from vit.data.datasets import preprocess  # noqa: E402
from vit.io.load import load_model  # noqa: E402
from vit.model.config import NetworkConfig  # noqa: E402

SHIPPED = "vit-tiny-d4-cifar10-cpu60"


def models(names: list[str]) -> dict[str, torch.nn.Module]:
    """`shipped`: the shipped weights; `cifar10`: cifar10.yaml's network, freshly initialised;
    `tiny`: a two-block width-32 network (the script's own test)."""
    out = {}
    for name in names:
        if name == "shipped":
            model = load_model(SHIPPED)[0]
        elif name == "cifar10":
            config = yaml.safe_load((REPO / "experiments" / "cifar10.yaml").read_text())
            model = NetworkConfig(**config["model"]["network"]).build()
        elif name == "tiny":
            model = NetworkConfig(embed_dim=32, depth=2, num_heads=2, num_classes=10).build()
        else:
            raise ValueError(f"unknown model {name!r}: expected shipped, cifar10 or tiny.")
        out[name] = model.eval()
    return out


def images_per_s(model: torch.nn.Module, images: torch.Tensor, batch: int) -> float:
    """Every image classified once, `batch` at a time, as vit-evaluate's loop does."""
    with torch.inference_mode():
        t = time.perf_counter()
        for part in images.split(batch):
            model(preprocess(part)).argmax(dim=-1)
        return len(images) / (time.perf_counter() - t)


def to_markdown(res: dict) -> str:
    ref = res["reference_batch"]
    lines = [
        f"`{res['command']}`",
        "",
        f"{res['date']}, {res['machine']}, torch {res['torch']}, float32, {res['threads']} "
        f"threads, {res['images']:,} images a pass, median of {res['rounds']} rounds.",
        "",
        f"| model | batch | img/s | against batch {ref} |",
        "|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['images_per_s']:,.0f} | {r['vs_reference']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["shipped", "cifar10"])
    p.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128, 256, 500, 1000])
    p.add_argument("--reference", type=int, default=500, help="the batch the ratios divide by")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--name", default=None, help="write <out-dir>/<name>.{json,md}")
    p.add_argument("--out-dir", type=Path, default=REPO / "experiments" / "record" / "benchmarks")
    ns = p.parse_args(argv)
    if ns.reference not in ns.batches:
        p.error(f"--reference {ns.reference} must be one of --batches {ns.batches}")
    nets = models(ns.models)
    images = torch.randint(0, 256, (ns.images, 3, 32, 32), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))  # fmt: skip
    for model in nets.values():  # warm-up: first-call allocations
        images_per_s(model, images[: max(ns.batches)], max(ns.batches))
    timings: dict[tuple[str, int], list[float]] = {}
    for _ in range(ns.rounds):
        for name, model in nets.items():
            for batch in ns.batches:
                timings.setdefault((name, batch), []).append(images_per_s(model, images, batch))
    medians = {key: statistics.median(v) for key, v in timings.items()}
    rows = [
        dict(
            model=name,
            batch=batch,
            images_per_s=round(medians[name, batch], 1),
            vs_reference=round(medians[name, batch] / medians[name, ns.reference], 3),
        )
        for name in nets
        for batch in ns.batches
    ]
    res = dict(
        **record_head("eval_batch.py", argv),
        images=ns.images,
        rounds=ns.rounds,
        reference_batch=ns.reference,
        rows=rows,
    )
    return print_and_record(res, to_markdown(res), out=ns.out_dir, name=ns.name)


if __name__ == "__main__":
    main()
