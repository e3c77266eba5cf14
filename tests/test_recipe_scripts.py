"""scripts/recipe_step.py, scripts/peer_recipe.py and scripts/compile_time.py stay right: the
recipe's stages, the fit's step timer, the peer's schedule, fit and report, the compile's plan."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from tests.helpers import REPO, TINY, load_script, sum_tol
from vit.model.vision_transformer import VisionTransformer

step = load_script("recipe_step")
peer = load_script("peer_recipe")
compile_time = load_script("compile_time")


def test_stages_follow_the_recipes_curricula() -> None:
    config = yaml.safe_load((REPO / "experiments" / "cpu60.yaml").read_text())
    plan = step.stages(config)
    # cpu60.yaml: sides 16 / 24 / 32 from 0 / 0.25 / 0.5, patch drop 0 / 0.5 / 0 from 0 / 0.25 / 0.85
    assert [(round(s, 6), side, drop) for s, side, drop in plan] == [
        (0.25, 16, 0.0),
        (0.25, 24, 0.5),
        (0.35, 32, 0.5),
        (0.15, 32, 0.0),
    ]


def test_variants_change_one_setting_or_the_batch_and_count_images() -> None:
    config = yaml.safe_load((REPO / "experiments" / "cpu60.yaml").read_text())
    changed = step.variant_config(config, "model.network.mlp_ratio=4")
    assert changed["model"]["network"]["mlp_ratio"] == 4
    assert config["model"]["network"]["mlp_ratio"] == 2.0  # the original is left alone
    assert step.variant_config(config, "batch-256") == config
    assert step.variant_batch("batch-256", 128) == 256
    assert step.variant_batch("compiled", 128) == 128
    setting, compiled = step.split_compiled("compiled+model.network.kernel=explicit")
    assert (
        compiled
        and step.variant_config(config, setting)["model"]["network"]["kernel"] == "explicit"
    )
    assert step.split_compiled("compiled") == ("compiled", False)  # compiled alone: no setting
    assert step.split_compiled("model.network.kernel=explicit")[1] is False  # eager
    plan = [(0.5, 16, 0.0), (0.5, 32, 0.0)]
    # each stage's step: 1 s at batch 128, 1.5 s at batch 256 (phases sum to the step)
    timed = {
        v: {f"{side}px drop 0.0": [dict.fromkeys(step.PHASES, s / len(step.PHASES))]
            for _, side, _ in plan}
        for v, s in (("baseline", 1.0), ("batch-256", 1.5))
    }  # fmt: skip
    out = step.summarize(plan, timed, batch=128, dtype=None)["variants"]
    assert out["baseline"]["steps_per_hour"] == 3600
    assert out["batch-256"]["steps_per_hour"] == 2400
    assert out["batch-256"]["images_per_hour"] == 2400 * 256
    assert out["batch-256"]["images_vs_first"] == round(2400 * 256 / (3600 * 128), 3)
    assert out["batch-256"]["stages"]["16px drop 0.0"]["img_s"] == round(256 / 1.5, 1)


def test_alternate_runs_each_variant_first_as_often_as_last() -> None:
    """The issue-day step read 1.40x when it ran first in each round and 1.24x when it ran
    second (NOTES.md): --alternate reverses the order every other round."""
    variants = ["old", "new", "third"]
    assert [step.round_order(variants, r, alternate=False) for r in range(2)] == [variants] * 2
    orders = [step.round_order(variants, r, alternate=True) for r in range(4)]
    assert orders == [variants, variants[::-1]] * 2
    assert [o[0] for o in orders].count("old") == [o[-1] for o in orders].count("old") == 2


def test_the_glibc_malloc_variant_runs_under_glibcs_starting_thresholds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vit.system import malloc

    start = (128 << 10, 128 << 10, 0)  # glibc's mmap and trim thresholds as they start, no pad
    kept = (malloc.MMAP_THRESHOLD, malloc.TRIM_THRESHOLD, malloc.TOP_PAD)
    assert malloc.KEPT == kept
    monkeypatch.setattr(malloc, "_status", "on: glibc 2.36 keeps the memory a step frees")
    assert step.malloc_thresholds("glibc-malloc") == start
    assert step.malloc_thresholds("compiled-glibc-malloc") == start  # the state, compiled
    assert step.split_suffix("compiled-glibc-malloc", "glibc-malloc") == ("compiled", True)
    assert step.split_suffix("glibc-malloc", "glibc-malloc") == ("baseline", True)
    assert step.split_suffix("compiled", "glibc-malloc") == ("compiled", False)
    assert step.malloc_thresholds("baseline") == step.malloc_thresholds("compiled") == kept
    assert start[1] < malloc.TRIM_THRESHOLD  # glibc trims its heap far sooner than the switch
    monkeypatch.setattr(malloc, "_status", "off: VIT_KEEP_FREED_MEMORY=0")
    assert step.malloc_thresholds("baseline") is None  # glibc's own behaviour, untouched
    assert step.malloc_thresholds("glibc-malloc") == start


def test_drop_after_embeds_every_patch_then_drops_the_same_tokens() -> None:
    """The variant that times the order before (every patch embedded, then dropped) computes
    the model's tokens for the same draw, from every patch's embedding."""
    model = VisionTransformer(**TINY, spt=True, patch_drop_rate=0.5).train()
    x = torch.randn(4, 3, 32, 32)
    torch.manual_seed(1)
    early = model.embed(x)
    rows = []
    model.patch_embed.norm.register_forward_hook(lambda m, args, out: rows.append(out.shape[1]))
    step.embed_every_patch_then_drop(model)
    torch.manual_seed(1)
    late = model.embed(x)
    assert rows == [16]  # every patch of the 4 x 4 grid, where the model embeds the 8 kept
    # one LayerNorm and one sum of 5 * 3 * 8 * 8 products per entry, computed among more rows
    tol = sum_tol(torch.float32, 5 * 3 * 8 * 8, late.abs().max())
    torch.testing.assert_close(early, late, rtol=0, atol=tol)
    model.eval()
    assert model.embed(x).shape == (4, 17, 32)  # evaluation keeps every token


def test_step_timer_writes_the_median_gap_after_the_first_twenty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter([0.5 * i for i in range(21)] + [10.0 + 0.1 * i for i in range(10)])
    monkeypatch.setattr(step.time, "perf_counter", lambda: next(clock))
    monkeypatch.setenv("RECIPE_STEP_TIMES", str(tmp_path / "t.jsonl"))
    monkeypatch.setenv("RECIPE_STEP_LABEL", "fit --x")
    timer = step.StepTimer()
    for _ in range(31):
        timer.on_train_batch_start()
    timer.on_train_end()
    line = json.loads((tmp_path / "t.jsonl").read_text())
    # gaps: twenty of 0.5 s (skipped), then one of 0 s and nine of 0.1 s: median 0.1 s
    assert line == {"label": "fit --x", "ms": 100.0, "steps": 10}


def test_peer_schedule_warms_up_then_falls_to_zero() -> None:
    assert peer.lr_factor(0.0) == 0.0
    assert peer.lr_factor(0.025) == pytest.approx(0.5)
    assert peer.lr_factor(0.05) == pytest.approx(1.0)
    after = [peer.lr_factor(0.05 + 0.95 * i / 20) for i in range(21)]
    assert all(a > b for a, b in zip(after, after[1:], strict=False))
    assert after[-1] == pytest.approx(0.0, abs=1e-12) and peer.lr_factor(1.5) == after[-1]


def test_peer_fit_scores_on_its_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    vit_pytorch = pytest.importorskip("vit_pytorch")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (200, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (200,), generator=g)
    monkeypatch.setattr(peer, "cifar10", lambda: (images, labels, images[:50], labels[:50]))
    tiny = dict(image_size=32, patch_size=8, num_classes=10, dim=16, depth=1, heads=2, mlp_dim=32)
    monkeypatch.setattr(peer, "peer_model", lambda: vit_pytorch.ViT(**tiny))
    ticks = iter(0.125 * k for k in range(10_000))  # each step reads the clock twice: 0.125 s
    monkeypatch.setattr(peer, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    out = peer.train_peer(minutes=0.01, eval_every=0.004, seed=0, dtype=None)  # 0.6 s, every 0.24
    assert out["steps"] == 5  # 0.625 s is the first total past the budget
    assert [p["steps"] for p in out["curve"]] == [2, 4, 5]  # 0.25 and 0.5 s, then the end
    assert [p["minutes"] for p in out["curve"]] == [round(t / 60, 2) for t in (0.25, 0.5, 0.625)]
    assert all(p["test_acc"] in {k / 50 for k in range(51)} for p in out["curve"])


def test_metrics_csv_gives_steps_best_val_and_test() -> None:
    lines = [
        "epoch,step,train/loss_step,val/acc,test/acc",
        "0,49,2.1,,",
        "0,99,,0.41,",
        "0,149,,0.52,",
        "0,199,,0.49,",
        "0,199,,,0.505",
    ]
    assert peer.read_metrics(lines) == {"steps": 199, "test_acc": 0.505, "best_val_acc": 0.52}


def test_metrics_csv_without_validation_gives_no_best_val() -> None:
    lines = ["epoch,step,train/loss_step,test/acc", "0,49,2.1,", "0,99,1.9,", "0,99,,0.47"]
    assert peer.read_metrics(lines) == {"steps": 99, "test_acc": 0.47, "best_val_acc": None}


@pytest.mark.parametrize(("val_size", "interval"), [(0, None), (5000, "00:00:01:00")])
def test_ours_validates_every_minute_only_with_a_validation_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, val_size: int, interval: str | None
) -> None:
    cfg = yaml.safe_load((REPO / "experiments" / "cpu60.yaml").read_text())
    cfg["data"]["val_size"] = val_size
    config = tmp_path / "cpu60.yaml"
    config.write_text(yaml.safe_dump(cfg))
    seen = {}

    def fit(cmd: list[str], **_: object) -> None:  # stands in for vit-train: writes its CSV
        at = cmd.index("-c", cmd.index("-c") + 1)  # vit-train's -c, after python's own
        ran = yaml.safe_load(Path(cmd[at + 1]).read_text())
        seen.update(ran)
        folder = Path(ran["trainer"]["logger"][0]["init_args"]["save_dir"]) / "cpu60" / "version_0"
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text("epoch,step,test/acc\n0,9,\n0,9,0.3\n")

    monkeypatch.setattr(peer.subprocess, "run", fit)
    out = peer.train_ours(minutes=0.5, seed=0, config=config)
    # without a split the config's own interval stays (Lightning then skips validation)
    expected = interval or cfg["trainer"]["val_check_interval"]
    assert seen["trainer"]["val_check_interval"] == expected
    assert (out["steps"], out["test_acc"], out["best_val_acc"]) == (9, 0.3, None)
    budget = [c for c in seen["trainer"]["callbacks"] if c["class_path"].endswith("TimeBudget")]
    assert budget[0]["init_args"]["minutes"] == 0.5


def test_report_without_validation_names_the_last_checkpoint() -> None:
    result = _result(0.70, 0.65)
    result["ours"]["best_val_acc"] = None
    text = peer.markdown(result)
    assert "the last checkpoint" in text and "best val" not in text and "(reached)" in text


def _never(message: str) -> Callable[..., dict]:
    """A stand-in for a fit that must not run: it fails the test with `message`."""

    def fit(*_: object, **__: object) -> dict:
        raise AssertionError(message)

    return fit


def _result(ours: float, peer_acc: float) -> dict:
    curve = [{"minutes": m, "steps": 10 * m, "test_acc": peer_acc * m / 20} for m in (2, 4, 20)]
    return {
        "command": "python scripts/peer_recipe.py",
        "date": "2026-11-29",
        "cpu": "cpu",
        "flags": ["avx2"],
        "torch": "x",
        "dtype": "float32",
        "seed": 0,
        "peer_minutes": 20.0,
        "ours_minutes": 4.0,
        "peer": {"steps": 200, "test_acc": peer_acc, "curve": curve},
        "ours": {"steps": 900, "test_acc": ours, "best_val_acc": ours},
    }


@pytest.mark.parametrize(("ours", "verdict"), [(0.70, "(reached)"), (0.60, "(not reached)")])
def test_report_says_whether_ours_reached_the_peer(ours: float, verdict: str) -> None:
    text = peer.markdown(_result(ours, 0.65))
    assert verdict in text and f"{ours - 0.65:+.2%}" in text
    assert "the peer at 4.0 min had 13.00%" in text  # its curve's point at our budget


def test_report_takes_the_peer_s_score_at_our_budget_from_the_step_past_its_mark() -> None:
    result = _result(0.60, 0.65)
    for point in result["peer"]["curve"]:
        point["minutes"] += 0.02  # scored at the first step past each 2-minute mark
    assert "the peer at 4.0 min had 13.00%" in peer.markdown(result)
    result["peer"]["curve"] = [p for p in result["peer"]["curve"] if p["minutes"] > 10]
    assert "the peer at" not in peer.markdown(result)  # no score near our budget: none given


def test_a_missing_config_is_refused_before_the_peer_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(
        peer, "train_peer", _never("the peer trained before the config was checked")
    )
    with pytest.raises(SystemExit) as exit_info:
        peer.main(["--config", str(tmp_path / "nope.yaml")])
    assert exit_info.value.code == 2
    assert f"--config {tmp_path / 'nope.yaml'} is not a file" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--minutes", "--ours-minutes", "--eval-every"])
def test_non_positive_minutes_are_refused(flag: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        peer.main([flag, "0"])
    assert exit_info.value.code == 2
    assert f"{flag} must be a positive number of minutes, got 0.0" in capsys.readouterr().err


def test_the_peer_from_an_earlier_run_is_named_and_not_trained_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = tmp_path / "peer-recipe-here.json"
    earlier.write_text(json.dumps(_result(0.60, 0.65)))  # float32, as this run is told below

    monkeypatch.setattr(peer, "cpu_has_fast_bf16", lambda: False)
    monkeypatch.setattr(peer, "train_peer", _never("the peer trained although --peer-from gave it"))
    monkeypatch.setattr(
        peer, "train_ours", lambda *_: {"steps": 9, "test_acc": 0.7, "best_val_acc": None}
    )
    monkeypatch.setattr(peer, "REPO", tmp_path)  # where --name writes
    (tmp_path / "experiments" / "record" / "benchmarks").mkdir(parents=True)
    config = str(REPO / "experiments" / "cpu60.yaml")
    assert peer.main(["--peer-from", str(earlier), "--config", config, "--name", "out-1.5"]) == 0
    written = json.loads((tmp_path / "experiments/record/benchmarks/out-1.5.json").read_text())
    assert written["peer"]["test_acc"] == 0.65 and written["peer_minutes"] == 20.0  # the file's
    assert written["peer_from"] == {"file": earlier.name, "date": "2026-11-29", "cpu": "cpu",
                                    "flags": ["avx2"]}  # fmt: skip
    text = (tmp_path / "experiments/record/benchmarks/out-1.5.md").read_text()  # a dot kept
    assert "+5.00% (reached)" in text
    assert f"The peer's side is {earlier.name}'s fit (2026-11-29, cpu, avx2), not trained" in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda r: r.update(dtype="bf16-mixed"),
            "its peer trained in bf16-mixed, this run trains in float32",
        ),
        (lambda r: r["peer"].update(steps=0, curve=[]), "its peer did not train"),
        (lambda r: r.pop("peer"), "not a peer_recipe.py json"),
    ],
)
def test_a_peer_from_a_run_that_does_not_compare_is_refused_before_ours_trains(
    change: Callable[[dict], object],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    result = _result(0.60, 0.65)
    change(result)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(result))
    monkeypatch.setattr(peer, "cpu_has_fast_bf16", lambda: False)
    monkeypatch.setattr(
        peer, "train_ours", _never("ours trained before the peer's file was checked")
    )
    with pytest.raises(SystemExit) as exit_info:
        peer.main(["--peer-from", str(earlier)])
    assert exit_info.value.code == 2
    assert f"--peer-from {earlier}: {message}" in capsys.readouterr().err


def test_a_report_without_the_peer_says_there_is_nothing_to_compare() -> None:
    result = _result(0.70, 0.65)
    result["peer"] = {
        "steps": 0,
        "test_acc": float("nan"),
        "best_val_acc": float("nan"),
        "curve": [],
    }
    text = peer.markdown(result)
    assert "The peer was not run (--skip peer)" in text and "reached" not in text


def test_a_peer_from_a_run_of_another_length_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(_result(0.60, 0.65)))  # the peer trained 20 minutes
    monkeypatch.setattr(peer, "cpu_has_fast_bf16", lambda: False)
    monkeypatch.setattr(peer, "train_ours", _never("ours trained before --minutes was checked"))
    with pytest.raises(SystemExit) as exit_info:
        peer.main(["--peer-from", str(earlier), "--minutes", "30"])
    assert exit_info.value.code == 2
    assert f"--minutes 30, but the peer in {earlier} trained 20 minutes" in capsys.readouterr().err


def test_compile_time_plans_the_network_and_shapes_the_fit_compiles() -> None:
    config = yaml.safe_load((REPO / "experiments" / "cpu60.yaml").read_text())
    float32_net, shapes = compile_time.planned(config, bf16=False)
    bf16_net, bf16_shapes = compile_time.planned(config, bf16=True)
    # float32_overrides turn stochastic depth off, a graph of its own; bf16 keeps the config's
    assert float32_net["drop_path_rate"] == 0.0
    assert bf16_net["drop_path_rate"] == config["model"]["network"]["drop_path_rate"] == 0.1
    assert config["model"]["network"]["drop_path_rate"] == 0.1  # the config is left alone
    # one (side, patch-drop) shape per stage of cpu60.yaml's two curricula, as the fit compiles
    assert shapes == bf16_shapes == [(16, 0), (24, 0.5), (32, 0.5), (32, 0)]


def test_compile_time_record_names_the_kernel_switches_in_its_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in compile_time.KERNEL_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("VIT_CPU_BF16", "0")
    run = {"seconds": 90.0, "shapes": 4, "bf16": False, "forward": 60.0, "backward": 30.0}
    result = {"torch": "x", "runs": {"false": {"cold": {**run, "codegen": 30.0, "cxx wait": 40.0}}}}
    text = compile_time.markdown(result, ["--dynamic", "false"])
    first = text.splitlines()[0]
    assert (
        first
        == "`VIT_CPU_BF16=0 ATEN_CPU_CAPABILITY=avx2 python scripts/compile_time.py --dynamic false`"
    )
    assert "precision: float32" in text
    assert "| false | cold | 4 | 90.0 | 60.0 | 30.0 | 30.0 | 40.0 |" in text
