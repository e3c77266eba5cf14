"""scripts/benchmark.py stays runnable: every model builds at one configuration, rows and table form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import load_script

bench = load_script("benchmark")
CFG = dict(width=32, depth=1, heads=2, mlp=64)
DATA = {"data_pipeline_images_per_s": 1e5, "data_pipeline_trivial_augment_images_per_s": 2500.0}


@pytest.mark.parametrize("name", bench.MODELS)
def test_models_build_at_the_same_configuration(name: str) -> None:
    model = bench.build(name, **CFG)
    if model is None:
        pytest.skip(f"{name}'s package is not installed (pip install -e '.[bench]')")
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    n = sum(p.numel() for p in model.parameters())
    ours = sum(p.numel() for p in bench.build("ours", **CFG).parameters())
    assert abs(n - ours) / ours < 0.05, (name, n, ours)  # same architecture size, give or take


def test_interleaved_timing_and_markdown_table() -> None:
    models = {"ours": bench.build("ours", **CFG), "ours-fused": bench.build("ours-fused", **CFG)}
    steps = {n: bench.make_steps(m, batch=4, precision="bf16-mixed")[0] for n, m in models.items()}
    secs = bench.time_interleaved(steps, warmup=1, rounds=2)
    assert set(secs) == set(models) and all(s > 0 for s in secs.values())
    rows = [
        dict(**CFG, batch=4, precision=p, kind="train", model=n, images_per_s=100.0 + i)
        for i, n in enumerate([*models, "timm"])
        for p in ("32-true", "bf16-mixed")
    ]
    ceiling = bench.matmul_ceiling(**CFG, dtype=torch.bfloat16, sizes=(64,))
    assert ceiling["ceiling_images_per_s"] > 0 and ceiling["gflop_per_image"] > 0
    table = bench.to_markdown(
        {
            "command": "x",
            "machine": {"cuda": False},
            "rows": rows,
            "matmul_ceiling": [dict(**CFG, precision="bf16-mixed", **ceiling)],
        }
        | DATA
    )
    # ours best (ours-fused, 101) against the fastest peer (timm, 102); ceiling beside 2x the peer
    assert (
        "| 32 | 4 | train | 101.0 (ours-fused, 32-true) | 102.0 (timm, 32-true) | 0.99x | 204 | "
        f"{ceiling['ceiling_images_per_s']:.0f} |" in table
    )
    assert f"| 32 | bf16-mixed | {ceiling['gflop_per_image']} |" in table
    assert "1 thread): 100000 img/s; with TrivialAugment: 2500 img/s" in table
    assert "| 32 | 4 | train | ours | 100.0 | 100.0 | 1.01x |" in table  # best ours / this row
    assert "| 32 | 4 | train | timm | 102.0 | 102.0 | 0.99x |" in table
    assert "GPU: not measured" in table


def test_bf16_is_timed_only_where_the_cpu_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "cpu_has_fast_bf16", lambda: False)
    assert bench.precisions() == ("32-true",)
    assert bench.precisions(force_bf16=True) == ("32-true", "bf16-mixed")
    rows = [dict(**CFG, batch=4, precision="32-true", kind="train", model="ours", images_per_s=9.0)]
    machine = {"cuda": False, "native_bf16": False}
    table = bench.to_markdown({"command": "x", "machine": machine, "rows": rows} | DATA)
    assert "bf16-mixed: not timed, as this CPU has no native bf16" in table
    assert "| 32 | 4 | train | ours | 9.0 | None | 1.00x |" in table
    monkeypatch.setattr(bench, "cpu_has_fast_bf16", lambda: True)
    assert bench.precisions() == ("32-true", "bf16-mixed")


def test_flop_count_of_a_training_step_is_what_torch_counts() -> None:
    """training_gflop_per_image against torch's own FLOP counter on a full forward + backward;
    our forward (the last block computes the CLS row only) counts at least 10% fewer."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = dict(width=192, depth=6, heads=3, mlp=768)
    model = bench.build("ours", **cfg)
    x = torch.randn(2, 3, 32, 32)

    def counted(forward) -> float:
        with FlopCounterMode(display=False) as counter:
            forward(x).sum().backward()
        return counter.get_total_flops() / 2 / 1e9  # per image

    every_token = counted(lambda x: model.forward_head(model.forward_features(x)))
    ours = counted(model)
    expected = bench.training_gflop_per_image(**cfg)
    assert abs(every_token - expected) / expected < 0.01, (every_token, expected)
    assert ours < 0.9 * every_token, (ours, every_token)


def test_timing_waits_for_the_device_and_divides_by_the_repeats() -> None:
    """On a GPU a call returns before its kernels run: each timing ends with `sync`, once per
    `repeat` calls queued back to back, and is divided by `repeat`."""
    calls: list[str] = []
    steps = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    secs = bench.time_interleaved(
        steps, warmup=1, rounds=2, sync=lambda: calls.append("sync"), repeat=3
    )
    assert set(secs) == {"a", "b"} and all(s >= 0 for s in secs.values())
    timed = ["a", "a", "a", "sync", "b", "b", "b", "sync"]
    assert calls == ["a", "b", "sync", *timed, *timed]
    assert bench.synchronizer("cpu")() is None  # nothing to wait for on a CPU


def test_gpu_table_says_where_it_ran() -> None:
    rows = [
        dict(**CFG, batch=4, precision="bf16-mixed", kind="train", model="ours", images_per_s=9.0)
    ]
    machine = {"cuda": True, "device": "cuda", "gpu": "NVIDIA H200"}
    table = bench.to_markdown({"command": "x", "machine": machine, "rows": rows} | DATA)
    assert "GPU: measured above (NVIDIA H200)" in table
    assert "1 loader thread, augmentation on the GPU" in table
    machine = {"cuda": True, "device": "cpu"}  # a GPU was there but the run timed the CPU
    table = bench.to_markdown({"command": "x", "machine": machine, "rows": rows} | DATA)
    assert "GPU: not measured in this run" in table


def test_device_cuda_without_a_gpu_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        bench.main(["--device", "cuda", "--quick"])
    assert "no CUDA GPU is visible here; use --device cpu" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_steps_and_memory_run_on_the_gpu() -> None:
    model = bench.build("ours", **CFG).to("cuda")
    train, infer = bench.make_steps(model, batch=4, precision="bf16-mixed", device="cuda")
    train()
    infer()
    assert bench.peak_gpu_memory_mb("ours", CFG, 4, "bf16-mixed", "cuda") > 0
    assert bench.bench_data(batch=8, repeats=1, max_batches=2, device="cuda") > 0


def test_compile_times_every_model_twice_and_the_best_of_each_side_meets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """--compile adds each model under torch.compile as an instance of its own (compiled at its
    first step, not here); the summary sets our best against the best peer, compiled or not."""
    eager = bench.build_all(CFG)
    both = bench.build_all(CFG, compiled=True)
    assert set(both) == set(eager) | {n + bench.COMPILED for n in eager}
    for name in eager:
        wrapped = both[name + bench.COMPILED]
        assert isinstance(wrapped, torch._dynamo.eval_frame.OptimizedModule), name
        assert wrapped._orig_mod is not both[name]  # its own weights and optimizer state
    speeds = {"ours": 100.0, "ours-compiled": 130.0, "timm": 90.0, "timm-compiled": 120.0}
    rows = [
        dict(**CFG, batch=4, precision="32-true", kind="train", model=n, images_per_s=v)
        for n, v in speeds.items()
    ]
    table = bench.to_markdown({"command": "x", "machine": {"cuda": False}, "rows": rows} | DATA)
    assert "| 130.0 (ours-compiled, 32-true) | 120.0 (timm-compiled, 32-true) | 1.08x |" in table
    monkeypatch.setenv("CXX", "no-such-compiler-x9")
    with pytest.raises(SystemExit):
        bench.main(["--compile", "--quick"])
    assert "--compile needs a C++ compiler" in capsys.readouterr().err


def test_without_a_name_the_table_is_printed_and_no_record_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A bare run printed over experiments/record/benchmarks/cpu.md, a recorded table; now the
    table is kept only under a --name given, and the options that add to a record need one."""
    rows = [dict(**CFG, batch=4, precision="32-true", kind="train", model="ours", images_per_s=9.0)]
    result = {"command": "x", "machine": {"cuda": False}, "rows": rows} | DATA
    monkeypatch.setattr(bench, "run", lambda args: result)
    monkeypatch.setattr(bench, "OUT", tmp_path)
    bench.main(["--quick"])
    out = capsys.readouterr().out
    assert "| 9.0 " in out and "not kept: --name NAME" in out
    assert list(tmp_path.iterdir()) == []
    bench.main(["--quick", "--name", "mine"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json", "mine.md"]
    for flag in ("--memory-only", "--ceiling-only"):
        with pytest.raises(SystemExit):
            bench.main([flag])
        assert f"{flag} adds to a recorded table: give its --name" in capsys.readouterr().err


def test_a_record_name_with_a_dot_is_written_whole(tmp_path: Path) -> None:
    """The one record writer of the scripts (benchmark, recipe_step, peer_recipe, product_rates)."""
    out = tmp_path / "record" / "benchmarks"  # made by the writer
    bench.write_record(out, "recipe-step-mlp1.5", {"steps": 3}, "| table |\n")
    assert sorted(p.name for p in out.iterdir()) == [
        "recipe-step-mlp1.5.json",
        "recipe-step-mlp1.5.md",
    ]
    assert json.loads((out / "recipe-step-mlp1.5.json").read_text()) == {"steps": 3}
    assert (out / "recipe-step-mlp1.5.md").read_text() == "| table |\n"


def test_profile_splits_each_models_step_by_the_kind_of_op() -> None:
    """--profile: one row per model, its ops' own time split by kind, the shares summing to the
    whole; the explicit kernel's softmax and the fused kernel's attention op land in their own
    columns, so a model's row says which attention it ran."""
    import argparse
    import re

    args = argparse.Namespace(
        configs=[(CFG, [4])], precisions=("32-true",), compile=False, device="cpu",
        profile=["ours", "ours-fused"], argv=["--profile", "ours", "ours-fused"],
    )  # fmt: skip
    text = bench.profile_models(args)
    assert text.startswith("`python scripts/benchmark.py --profile ours ours-fused`")
    kinds = [*bench.OP_KINDS, "other"]
    assert f"| model | step ms (profiled) | {' | '.join(kinds)} |" in text
    rows = {}
    for name in ("ours", "ours-fused"):
        (row,) = [line for line in text.splitlines() if line.startswith(f"| {name} | ")]
        cells = re.findall(r"([\d.]+) \((\d+)%\)", row)
        assert len(cells) == len(kinds), row
        rows[name] = {
            k: (float(ms), int(share)) for k, (ms, share) in zip(kinds, cells, strict=True)
        }
        assert abs(sum(share for _, share in rows[name].values()) - 100) <= len(kinds) // 2
        assert rows[name]["products"][0] > 0 and rows[name]["LayerNorm"][0] > 0
    assert rows["ours"]["attention kernel"][0] == 0 < rows["ours"]["softmax"][0]
    assert rows["ours-fused"]["softmax"][0] == 0 < rows["ours-fused"]["attention kernel"][0]
    args.profile = ["no-such-model"]
    with pytest.raises(SystemExit, match="no-such-model"):
        bench.profile_models(args)
