"""scripts/ablate_speed.py's full-bf16 variant is a real training step on float32 master weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import load_script

ablate = load_script("ablate_speed")


def test_master_weights_step_float32_copies_and_copy_them_back(tiny_model) -> None:
    model = tiny_model.to(torch.bfloat16)
    opt = ablate.MasterWeights(model, fused=False)
    start = [m.detach().clone() for m in opt.master]
    x, y = torch.randn(4, 3, 32, 32, dtype=torch.bfloat16), torch.randint(0, 10, (4,))
    for _ in range(2):
        F.cross_entropy(model(x).float(), y).backward()
        opt.step()
    params = list(model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)  # the model computes in bf16
    assert all(m.dtype == torch.float32 for m in opt.master)  # AdamW steps float32 copies
    for p, m in zip(params, opt.master, strict=True):
        assert torch.equal(p, m.to(torch.bfloat16))  # each step copies them back
        assert p.grad is None  # and takes the gradients off the bf16 model
    moved = max((m - s).abs().max().item() for m, s in zip(opt.master, start, strict=True))
    assert moved > 1e-5  # two steps of lr 1e-4 moved the float32 weights


def test_full_bf16_variant_puts_the_model_in_bf16(tiny_model) -> None:
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    step = ablate.training_step(
        tiny_model, x, y, precision="bf16-full", fused_adam=False, compile_=False, dynamic=False
    )
    before = [p.detach().float().clone() for p in tiny_model.parameters()]
    step()
    assert all(p.dtype == torch.bfloat16 for p in tiny_model.parameters())
    assert any(
        not torch.equal(p.float(), b) for p, b in zip(tiny_model.parameters(), before, strict=True)
    )


def run_stages(monkeypatch, name: str, option: str, **args) -> tuple[dict, dict]:
    """stages_ab for STAGE_ABS[name] with the steps recorded, not built or timed: the config of
    each (side, option value) step, and what time_and_write was given (its steps included)."""
    built, written = {}, {}

    def fake_step(*, side, batch, **cfg):
        built[(side, cfg[option])] = cfg
        return lambda: None

    monkeypatch.setattr(ablate, "resolution_step", fake_step)
    monkeypatch.setattr(
        ablate, "time_and_write", lambda steps, **kw: written.update(steps=steps, **kw)
    )
    namespace = ablate.argparse.Namespace(batch=8, rounds=1, **args)
    ablate.stages_ab(namespace, flag=f"--{name.replace('_', '-')}", **ablate.STAGE_ABS[name])
    return built, written


def test_mlp_ratio_stages_build_the_two_models_they_name(monkeypatch) -> None:
    """--mlp-ratio times depth-4 models whose MLP hidden width is 2x and 4x the embedding."""
    built, written = run_stages(monkeypatch, "mlp_ratio", "mlp_ratio")
    assert sorted(written["steps"]) == sorted(
        f"{s}x{s} mlp-ratio-{r}" for s in (16, 24, 32) for r in (2, 4)
    )
    assert sorted(built) == [(s, r) for s in (16, 24, 32) for r in (2.0, 4.0)]
    assert all(c["depth"] == 4 and c["spt"] and c["lsa"] for c in built.values())
    monkeypatch.undo()  # the real resolution_step builds the depth and MLP it is given
    import vit.model

    made = {}
    real = vit.model.create_model
    monkeypatch.setattr(
        vit.model, "create_model", lambda *a, **kw: made.update(kw) or real(*a, **kw)
    )
    step = ablate.resolution_step(side=16, batch=2, fused_adam=False, depth=4, mlp_ratio=4.0)
    assert made["depth"] == 4 and made["mlp_ratio"] == 4.0
    step()  # and its step runs


def test_muon_stages_time_the_two_optimizers_at_the_precision_asked(monkeypatch) -> None:
    """--muon --precision 32-true: depth-4 steps with AdamW and with Muon, in float32."""
    built, written = run_stages(monkeypatch, "muon", "optimizer", precision="32-true")
    assert sorted(built) == [(s, o) for s in (16, 24, 32) for o in ("adamw", "muon")]
    assert all(c["precision"] == "32-true" and c["depth"] == 4 for c in built.values())
    assert "--muon --precision 32-true" in written["command"]
    monkeypatch.undo()  # the real step trains with vit.optim.MuonAdamW
    from vit.optim import MuonAdamW

    seen = []
    real_step = MuonAdamW.step
    monkeypatch.setattr(MuonAdamW, "step", lambda self, *a: seen.append(self) or real_step(self))
    step = ablate.resolution_step(
        side=16, batch=2, fused_adam=False, depth=2, precision="32-true", optimizer="muon"
    )
    step()
    assert len(seen) == 1


def test_muon_ns_times_each_form_on_the_recipes_matrices(monkeypatch, tmp_path) -> None:
    """--muon-ns: four float32 forms and the stacked bfloat16 loop over the 16 matrices of the
    recipe's model; only the Gram-form ones iterate on the Gram matrix (three wide or tall shapes
    of four), only the last runs in bfloat16, and the ratio is to the loop."""
    from vit import optim

    gram_calls, shapes = {}, []
    real_gram, real_orth = optim._iterate_on_the_gram, optim.orthogonalize

    def timed(steps, **kw):
        for name, run in steps.items():
            gram_calls[name] = 0
            run()
        return {name: 1.0 + i for i, name in enumerate(steps)}

    def gram(x, steps):
        gram_calls[list(gram_calls)[-1]] += 1
        return real_gram(x, steps)

    monkeypatch.setattr(ablate.bench, "time_interleaved", timed)
    monkeypatch.setattr(ablate.bench, "OUT", tmp_path)
    monkeypatch.setattr(optim, "_iterate_on_the_gram", gram)
    monkeypatch.setattr(
        optim,
        "orthogonalize",
        lambda g, **kw: shapes.append((g.shape, kw["dtype"])) or real_orth(g, **kw),
    )
    ablate.muon_ns_main(ablate.argparse.Namespace(rounds=1))
    assert gram_calls == {
        "per matrix, loop": 0,
        "per matrix, Gram form": 12,
        "stacked, loop": 0,
        "stacked, Gram form": 3,
        "stacked, bfloat16 loop": 0,
    }
    single = {(576, 192), (192, 192), (384, 192), (192, 384)}
    stacked = {(4, *s) for s in single}
    assert set(shapes) == {(s, torch.float32) for s in single | stacked} | {
        (s, torch.bfloat16) for s in stacked
    }
    assert optim.GRAM_FORM_RATIO == 1.5  # put back
    table = (tmp_path / "muon_ns.md").read_text()
    assert "| stacked, Gram form | 4000.0 | 0.25x |" in table
    assert "| stacked, bfloat16 loop | 5000.0 | 0.20x |" in table


def test_tokens_times_65_against_64_tokens_and_our_default(monkeypatch, tmp_path) -> None:
    """--tokens: mean pooling with and without the CLS token (65 and 64 tokens in every block),
    beside our CLS-pooled default, each a real training step, with the ratio to 65 tokens."""
    tokens = {}

    def timed(steps, **kw):
        for run in steps.values():
            run()  # a real step of each model
        return {name: 1.0 + i for i, name in enumerate(steps)}

    real_make = ablate.bench.make_steps

    def make(model, **kw):
        tokens[len(tokens)] = (model.pos_embed.shape[1], model.global_pool)
        return real_make(model, **kw)

    monkeypatch.setattr(ablate.bench, "time_interleaved", timed)
    monkeypatch.setattr(ablate.bench, "make_steps", make)
    monkeypatch.setattr(ablate.bench, "OUT", tmp_path)
    ablate.tokens_main(ablate.argparse.Namespace(batch=2, rounds=1))
    assert list(tokens.values()) == [(65, "avg"), (64, "avg"), (65, "token")]
    table = (tmp_path / "tokens.md").read_text()
    assert "| 64 tokens: no CLS, mean pooling | 2000.0 | 1.0 | 0.50x |" in table


def test_runtime_sets_each_environment_and_refuses_a_preload_that_did_not_take(
    monkeypatch, tmp_path
) -> None:
    """--runtime all: the default, OpenMP binding and each installed malloc, in fresh processes;
    a child that still ran glibc's malloc under LD_PRELOAD stops the run instead of timing glibc
    twice."""
    import ctypes.util

    seen = {}

    def fake_runs(settings, *, processes, took=True):
        seen.update({name: env for name, (_, env) in settings.items()})
        runs = {}
        for name, (_, env) in settings.items():
            lib = env.get("LD_PRELOAD", "")
            malloc = (
                ["jemalloc"] if "jemalloc" in lib else ["tcmalloc"] if "tcmalloc" in lib else []
            )
            row = {"malloc": (malloc if took else []) or ["glibc"]}
            row.update({n: 100.0 for n in ablate.ALLOCATOR_MODELS})
            runs[name] = [row] * processes
        return runs

    monkeypatch.setattr(ablate.bench, "OUT", tmp_path)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: f"lib{name}.so.9")
    monkeypatch.setattr(ablate, "alternate_processes", fake_runs)
    args = ablate.argparse.Namespace(batch=2, processes=2, runtime="all")
    ablate.runtime_main(args)
    assert seen["default"] == {}
    assert seen["OMP_PROC_BIND=close OMP_PLACES=cores"] == {
        "OMP_PROC_BIND": "close",
        "OMP_PLACES": "cores",
    }
    assert seen["jemalloc (LD_PRELOAD=libjemalloc.so.9)"] == {"LD_PRELOAD": "libjemalloc.so.9"}
    assert (
        "| tcmalloc (LD_PRELOAD=libtcmalloc_minimal.so.9) | 100.0 (1.00x)"
        in (tmp_path / "runtime.md").read_text()
    )
    monkeypatch.setattr(
        ablate, "alternate_processes", lambda s, *, processes: fake_runs(s, processes=1, took=False)
    )
    with pytest.raises(SystemExit, match="not jemalloc"):
        ablate.runtime_main(args)
    seen.clear()
    monkeypatch.setattr(ablate, "alternate_processes", fake_runs)
    ablate.runtime_main(ablate.argparse.Namespace(batch=2, processes=2, runtime="omp"))
    assert list(seen) == ["default", "OMP_PROC_BIND=close OMP_PLACES=cores"]  # no mallocs
    assert (tmp_path / "runtime_omp.md").exists()


def fake_timer(monkeypatch, out) -> None:
    """Tables go under `out`; the n-th variant "takes" 2/n seconds, so its ratio to the first is n."""
    monkeypatch.setattr(ablate.bench, "OUT", out)
    monkeypatch.setattr(
        ablate.bench,
        "time_interleaved",
        lambda steps, **kw: {n: 2.0 / (i + 1) for i, n in enumerate(steps)},
    )


def test_compile_passes_compiles_the_last_variant_with_the_pattern_matcher_off(
    monkeypatch, tmp_path
) -> None:
    """--compile-passes: the first call of each step (where torch.compile compiles) runs under
    the variant's inductor settings, caches off; the table's ratios are to eager."""
    import torch._inductor.config as inductor_config

    at_first_call = {}

    def fake_step(*, compile_, **kw):
        name = len(at_first_call)

        def step():
            if name not in at_first_call:
                at_first_call[name] = (
                    compile_,
                    inductor_config.pattern_matcher,
                    inductor_config.force_disable_caches,
                )

        return step

    monkeypatch.setattr(ablate, "make_step", fake_step)
    fake_timer(monkeypatch, tmp_path)
    ablate.compile_passes_main(ablate.argparse.Namespace(batch=2, rounds=1))
    assert at_first_call == {0: (False, True, True), 1: (True, True, True), 2: (True, False, True)}
    assert inductor_config.pattern_matcher  # put back
    assert (
        "| compiled, pattern matcher off | 666.7 | 3.0 | 3.00x |"
        in (tmp_path / "compile_passes.md").read_text()
    )


def test_muon_ns_steps_stages_time_5_against_3_iterations_on_the_recipes_groups(
    monkeypatch,
) -> None:
    """--muon-ns-steps: Muon steps with 5 and 3 Newton-Schulz iterations, the patch projection in
    the Muon group as in cpu60.yaml; the real step builds MuonAdamW with the count asked."""
    built, written = run_stages(monkeypatch, "muon_ns_steps", "ns_steps")
    assert sorted(built) == [(s, n) for s in (16, 24, 32) for n in (3, 5)]
    assert all(c["optimizer"] == "muon" and c["muon_patch_embed"] for c in built.values())
    assert written["base"] == "32x32 muon-ns-5"
    monkeypatch.undo()
    import vit.lit_module
    from vit.optim import MuonAdamW

    made, asked = [], {}
    real_init, real_groups = MuonAdamW.__init__, vit.lit_module.muon_param_groups
    monkeypatch.setattr(
        MuonAdamW, "__init__", lambda self, *a, **kw: made.append(self) or real_init(self, *a, **kw)
    )
    monkeypatch.setattr(
        vit.lit_module,
        "muon_param_groups",
        lambda model, **kw: asked.update(kw) or real_groups(model, **kw),
    )
    step = ablate.resolution_step(
        side=16,
        batch=2,
        fused_adam=False,
        depth=2,
        spt=True,
        optimizer="muon",
        ns_steps=3,
        muon_patch_embed=True,
    )
    step()
    (opt,) = made
    muon = [g for g in opt.param_groups if g["use_muon"]]
    assert muon and all(g["ns_steps"] == 3 for g in muon)
    assert asked["patch_embed"] is True


def test_compile_modes_compiles_each_variant_in_its_mode_and_records_what_was_autotuned(
    monkeypatch, tmp_path
) -> None:
    """--compile-modes: training eager / default / max-autotune and inference eager / default /
    frozen / frozen max-autotune, each first call with caches off and freezing only where asked;
    a product the autotuner tunes during a first call is recorded under that variant, with its
    winner; the two tables' ratios are to their own eager variant."""
    import json

    import torch._inductor.config as inductor_config
    from torch._inductor import select_algorithm

    class Choice:
        def __init__(self, name: str) -> None:
            self.name = name

    class Node:
        def get_size(self):
            return (384, 65, 64)

    seen = []

    def first_call(kind, mode):
        seen.append((kind, mode, inductor_config.force_disable_caches, inductor_config.freezing))
        if mode == "max-autotune-no-cudagraphs":  # what the autotuner calls back with
            fns = select_algorithm.get_algorithm_selector_cache().feedback_saver_fns
            template = 5.2 if kind == "train" else 0.5  # the template wins in inference
            timings = {Choice("bmm"): 0.9, Choice("cpp_CppMicroGemmFP32Vec_0"): template}
            for fn in fns:
                fn(timings, "bmm", [Node()], list(timings), None, {})

    def fake_step(*, compile_, mode, **kw):
        calls = []
        return lambda: calls or calls.append(first_call("train", mode if compile_ else "eager"))

    class FakeCompiled(torch.nn.Module):  # what torch.compile returns: a module around model
        def __init__(self, model, mode) -> None:
            super().__init__()
            self.model, self.mode, self.calls = model, mode, []

        def forward(self, x):
            if not self.calls:
                self.calls.append(first_call("infer", self.mode or "default"))
            return self.model(x)

    def fake_compile(model, *, mode=None, **kw):
        return FakeCompiled(model, mode)

    monkeypatch.setattr(ablate, "make_step", fake_step)
    monkeypatch.setattr(ablate.torch, "compile", fake_compile)
    fake_timer(monkeypatch, tmp_path)
    ablate.compile_modes_main(ablate.argparse.Namespace(batch=2, rounds=1))
    eager_infer = ("infer", "eager", True, False)
    assert seen[:3] == [
        ("train", "eager", True, False),
        ("train", None, True, False),
        ("train", "max-autotune-no-cudagraphs", True, False),
    ]
    assert sorted(seen[3:]) == sorted(
        [
            ("infer", "default", True, False),
            ("infer", "default", True, True),
            ("infer", "max-autotune-no-cudagraphs", True, True),
        ]
    )  # the eager inference variant calls no compile: nothing seen for it
    assert eager_infer not in seen
    assert not select_algorithm.get_algorithm_selector_cache().feedback_saver_fns  # cleared
    assert not inductor_config.freezing  # put back
    train = json.loads((tmp_path / "compile_modes_train.json").read_text())
    tuned = train["autotuned"]
    assert tuned["train: compiled"] == []
    assert tuned["train: compiled, max-autotune"] == [
        {
            "op": "bmm",
            "shapes": [[384, 65, 64]],
            "ms": {"bmm": 0.9, "cpp_CppMicroGemmFP32Vec_0": 5.2},
            "best": "bmm",
        }
    ]
    assert (
        "'train: compiled, max-autotune': '1 tuned, 0 won by the template'"
        in (tmp_path / "compile_modes_train.md").read_text()
    )
    infer = (tmp_path / "compile_modes_infer.md").read_text()
    assert "'infer: compiled, frozen weights, max-autotune': '1 tuned, 1 won by" in infer
    assert "| variant | ms/batch | infer img/s | vs infer: eager |" in infer
    assert "| infer: compiled, frozen weights, max-autotune | 500.0 | 4.0 | 4.00x |" in infer


def test_out_sends_the_tables_to_the_folder_given(monkeypatch, tmp_path) -> None:
    """--out: a mode's tables go under the folder given (another CPU's runs keep their own)."""
    monkeypatch.setattr(ablate.bench, "OUT", ablate.bench.OUT)  # undone after the test
    seen = []
    monkeypatch.setattr(ablate, "tokens_main", lambda args: seen.append(ablate.bench.OUT))
    monkeypatch.setattr("sys.argv", ["ablate_speed.py", "--tokens", "--out", str(tmp_path / "amx")])
    ablate.main()
    assert seen == [tmp_path / "amx"]
