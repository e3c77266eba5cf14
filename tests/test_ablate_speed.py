"""scripts/ablate_speed.py's full-bf16 variant is a real training step on float32 master weights."""

from __future__ import annotations

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
