"""A checkpoint written before ViTClassifier's options were grouped (flat hyper-parameters, the
time budget's clock at the top level) still loads, scores, resumes and migrates exactly.

tests/fixtures/tiny-flat-layout.ckpt: a tiny model (width 32, depth 2, 2 heads, patch 8, SPT,
LSA, sincos2d positions) trained 8 steps by the old code with Muon (lr_scale 2, patch_embed), EMA,
a 5-minute budget and the resolution and patch-drop curricula. tests/fixtures/tiny-flat-layout.json:
the logits the old code's load_model gave on a seeded input, and its vit-evaluate val scores.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.helpers import (
    CIFAR_ARCHIVE,
    REPO,
    forward_sums,
    quiet_trainer,
    random_loader,
    sum_tol,
    tiny_classifier,
)
from vit.io.checkpoint import load_checkpoint
from vit.io.load import load_model
from vit.io.migrate import is_old_layout, migrate_checkpoint, migrate_metric_states
from vit.train.callbacks.budget import TimeBudget
from vit.train.module import ViTClassifier

FIXTURE = REPO / "tests" / "fixtures" / "tiny-flat-layout.ckpt"
EXPECTED = json.loads((REPO / "tests" / "fixtures" / "tiny-flat-layout.json").read_text())
ELAPSED_S = 0.3390752430000248  # the fixture's train_elapsed_s
needs_cifar = pytest.mark.skipif(
    not CIFAR_ARCHIVE.is_file(), reason=f"CIFAR-10 archive not found at {CIFAR_ARCHIVE}"
)

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
NETWORK = {
    "preset": "vit_tiny",
    "patch_size": 8,
    "num_classes": 10,
    "embed_dim": 32,
    "depth": 2,
    "num_heads": 2,
    "mlp_ratio": 2.0,
    "qkv_bias": True,
    "class_token": True,
    "global_pool": "token",
    "pos_embed": "learned",
    "drop_rate": 0.0,
    "attn_drop_rate": 0.0,
    "drop_path_rate": 0.1,
    "patch_drop_rate": 0.0,
    "kernel": "auto",
    "attn_init": "default",
    "pos_init": "sincos2d",
    "lsa": True,
    "spt": True,
    "img_size": 32,
}
MIGRATED_HPARAMS = {
    "network": NETWORK,
    "optimizer": {
        "name": "muon",
        "lr": 0.001,
        "weight_decay": 0.2,
        "betas": [0.9, 0.999],
        "fused": True,
        "muon": {
            "lr_scale": 2.0,
            "momentum": 0.95,
            "ns_steps": 5,
            "split_qkv": False,
            "patch_embed": True,
        },
    },
    "schedule": {"warmup_epochs": 0.0, "warmup_fraction": 0.05, "min_lr": 0.0, "decay": "cosine"},
    "label_smoothing": 0.1,
    "mixup_alpha": 0.0,
    "cutmix_alpha": 0.0,
    "mix_prob": 1.0,
    "torch_compile": False,
    "compile_mode": "default",
    "test_flip": False,
    "class_names": CLASSES,
    "_instantiator": "lightning.pytorch.cli.instantiate_module",
}  # time_budget_min, res_schedule and patch_drop_schedule are callbacks now: dropped


def _input() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _assert_old_logits(model: torch.nn.Module, logits: torch.Tensor, expected: list) -> None:
    """The old code's logits, from another run on another CPU, perhaps: float32 forwards that
    differ in every sum's order."""
    tol = sum_tol(torch.float32, forward_sums(model), max(1.0, logits.abs().max()))
    torch.testing.assert_close(logits, torch.tensor(expected), rtol=0, atol=tol)


def _callback(name: str, **init_args: Any) -> dict[str, Any]:
    """A trainer.callbacks entry of the config for vit.train.callbacks.<name>."""
    return {"class_path": f"vit.train.callbacks.{name}", "init_args": init_args}


def _raw_fixture() -> dict[str, Any]:
    """The fixture as the file holds it, not migrated (load_checkpoint migrates)."""
    return torch.load(FIXTURE, map_location="cpu", weights_only=True)


def test_load_model_gives_the_old_codes_logits() -> None:
    model, _ = load_model(FIXTURE)
    assert not model.training
    with torch.no_grad():
        logits = model(_input())
    _assert_old_logits(model, logits, EXPECTED["logits"])


def test_load_from_checkpoint_reads_the_flat_layout_as_the_grouped_one() -> None:
    module = ViTClassifier.load_from_checkpoint(FIXTURE).eval()
    with torch.no_grad():
        logits = module.model(_input())
    _assert_old_logits(module.model, logits, EXPECTED["logits"])
    hp = module.hparams
    assert {"network", "optimizer", "schedule"} <= set(hp)
    assert not {"preset", "lr", "muon_lr_scale", "time_budget_min", "lr_decay"} & set(hp)
    assert hp.optimizer["name"] == "muon"
    assert hp.optimizer["muon"]["lr_scale"] == 2.0 and hp.optimizer["muon"]["patch_embed"] is True
    assert hp.optimizer["fused"] is True and hp.optimizer["weight_decay"] == 0.2
    assert hp.schedule == MIGRATED_HPARAMS["schedule"]
    assert {k: hp.network[k] for k in ("preset", "embed_dim", "depth", "lsa", "spt")} == {
        "preset": "vit_tiny", "embed_dim": 32, "depth": 2, "lsa": True, "spt": True
    }  # fmt: skip
    assert hp.class_names == CLASSES


@needs_cifar
def test_vit_evaluate_scores_the_fixture_as_the_old_code_did(tmp_path: Path) -> None:
    from vit.commands.evaluate import run_evaluate

    result = run_evaluate([str(FIXTURE), "--split", "val", "--output-dir", str(tmp_path)])
    assert result["num_images"] == 64  # the fixture's val_size
    assert result["top1"] == EXPECTED["val_top1"] == 0.109375
    assert result["top5"] == EXPECTED["val_top5"] == 0.59375


@needs_cifar
def test_a_fit_in_the_new_layout_resumes_the_flat_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vit-train fit --ckpt_path on the old file: the optimizer layout matches (Muon with the
    patch projection), two more steps run, and the budget's clock goes on from the old one."""
    from vit.commands.train import train_main

    ckpt = shutil.copy(FIXTURE, tmp_path / "old.ckpt")
    at_fit_start: list[float] = []
    monkeypatch.setattr(
        TimeBudget,
        "on_fit_start",
        lambda self, trainer, module: at_fit_start.append(self.elapsed_s()),
        raising=False,
    )
    network = {k: NETWORK[k] for k in ("preset", "patch_size", "embed_dim", "depth", "num_heads")}
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "default_root_dir": str(tmp_path),  # config.yaml goes there, not the working dir
            "max_epochs": 5,  # an upper bound: max_steps ends the fit
            "max_steps": 10,  # the fixture stopped at step 8
            "limit_val_batches": 1,
            "logger": False,
            "enable_progress_bar": False,
            "callbacks": [
                _callback("EMA", decay=0.999),
                _callback("TimeBudget", minutes=5.0),
                _callback("ResolutionSchedule", stages=[[0, 16], [0.5, 32]]),
                _callback("PatchDropSchedule", stages=[[0, 0], [0.25, 0.5], [0.85, 0]]),
                _callback("LastCheckpoint", dirpath=str(tmp_path / "ckpt"), every_n_train_steps=1),
            ],
        },
        "model": {
            "network": {
                **network, "mlp_ratio": 2.0, "drop_path_rate": 0.1, "pos_init": "sincos2d",
                "lsa": True, "spt": True,
            },
            "optimizer": {
                "name": "muon", "lr": 1.0e-3, "weight_decay": 0.2, "fused": True,
                "muon": {"lr_scale": 2.0, "patch_embed": True},
            },
            "schedule": {"warmup_epochs": 0.0, "warmup_fraction": 0.05},
        },
        "data": {
            "data_dir": str(CIFAR_ARCHIVE),
            "batch_size": 32,
            "val_size": 64,
            "train_subset": 256,
            "seed": 0,
        },
    }  # fmt: skip
    path = tmp_path / "resume.yaml"
    path.write_text(yaml.safe_dump(config))
    train_main(["fit", "-c", str(path), f"--ckpt_path={ckpt}"])
    assert at_fit_start == [ELAPSED_S]  # restored from the old top-level train_elapsed_s
    resumed = load_checkpoint(tmp_path / "ckpt" / "last.ckpt")
    assert resumed["global_step"] == 10
    assert resumed["callbacks"]["TimeBudget"]["elapsed_s"] > ELAPSED_S
    assert "train_elapsed_s" not in resumed
    assert resumed["hyper_parameters"]["optimizer"]["muon"]["patch_embed"] is True


def test_migrate_checkpoint_maps_every_old_key_and_is_idempotent() -> None:
    ckpt = _raw_fixture()
    assert ckpt["train_elapsed_s"] == ELAPSED_S and "TimeBudget" not in ckpt["callbacks"]
    assert migrate_checkpoint(ckpt) is ckpt  # in place
    assert ckpt["hyper_parameters"] == MIGRATED_HPARAMS
    assert ckpt["callbacks"]["TimeBudget"] == {"elapsed_s": ELAPSED_S, "off_clock_s": 0.0}
    assert "train_elapsed_s" not in ckpt and "train_off_clock_s" not in ckpt
    again = migrate_checkpoint(copy.deepcopy(ckpt))  # a migrated checkpoint passes unchanged
    assert again["hyper_parameters"] == MIGRATED_HPARAMS
    assert again["callbacks"]["TimeBudget"] == ckpt["callbacks"]["TimeBudget"]
    assert set(again) == set(ckpt)


def test_migrate_checkpoint_drops_muon_settings_of_an_adamw_run() -> None:
    """An old AdamW run's Muon defaults are dropped (AdamW refuses Muon settings); an older one,
    from before Muon, has no optimizer key and reads as AdamW."""
    flat = {
        "preset": "vit_nano", "patch_size": 8, "lr": 2e-3, "fused_adamw": None,
        "optimizer": "adamw", "muon_lr_scale": 1.0, "muon_split_qkv": False, "lr_decay": "linear",
        "min_lr": 1e-5, "time_budget_min": 60.0, "label_smoothing": 0.1,
    }  # fmt: skip
    ckpt = migrate_checkpoint({"hyper_parameters": flat})
    assert ckpt["hyper_parameters"] == {
        "network": {"preset": "vit_nano", "patch_size": 8},
        "optimizer": {"name": "adamw", "lr": 2e-3, "fused": None, "muon": {}},
        "schedule": {"decay": "linear", "min_lr": 1e-5},
        "label_smoothing": 0.1,
    }
    older = migrate_checkpoint({"hyper_parameters": {"preset": "vit_nano", "lr": 1e-3}})
    assert older["hyper_parameters"]["optimizer"] == {"lr": 1e-3, "muon": {}}
    module = ViTClassifier(**ckpt["hyper_parameters"])  # the migrated settings build the module
    assert module.optimizer_config.name == "adamw" and module.schedule_config.decay == "linear"


def test_a_todays_checkpoint_passes_migrate_unchanged(tmp_path: Path) -> None:
    module = tiny_classifier(
        optimizer={"name": "muon", "muon": {"lr_scale": 2.0}}, schedule={"warmup_fraction": 0.1}
    )
    trainer = quiet_trainer(tmp_path, max_steps=1, max_epochs=1, callbacks=[TimeBudget(minutes=5)])
    trainer.fit(module, random_loader(32))
    trainer.save_checkpoint(tmp_path / "today.ckpt")
    saved = torch.load(tmp_path / "today.ckpt", map_location="cpu", weights_only=True)
    before = copy.deepcopy(saved)
    after = migrate_checkpoint(saved)
    assert set(after) == set(before)
    assert after["hyper_parameters"] == before["hyper_parameters"] == dict(module.hparams)
    assert after["callbacks"]["TimeBudget"] == before["callbacks"]["TimeBudget"]
    assert after["callbacks"]["TimeBudget"]["elapsed_s"] > 0


# tests/fixtures/tiny-grouped-layout.*: a checkpoint and the config.yaml vit-train saved beside
# it, written by the code from before vit/ had sub-packages (commit e9cc07d; class paths
# vit.callbacks.*), by tests/fixtures/make_grouped_layout.py: the cpu60 recipe's callbacks on a
# tiny model, 6 steps. The JSON holds the logits and val scores the old code gave.
GROUPED = REPO / "tests" / "fixtures" / "tiny-grouped-layout.ckpt"
GROUPED_CONFIG = REPO / "tests" / "fixtures" / "tiny-grouped-layout.config.yaml"
GROUPED_EXPECTED = json.loads(
    (REPO / "tests" / "fixtures" / "tiny-grouped-layout.json").read_text()
)


def test_the_grouped_fixture_holds_the_old_class_paths() -> None:
    """The fixture is what it claims: its config names the callbacks by their old module."""
    paths = [
        c["class_path"] for c in yaml.safe_load(GROUPED_CONFIG.read_text())["trainer"]["callbacks"]
    ]
    assert {p for p in paths if p.startswith("vit.")} == {
        f"vit.callbacks.{n}"
        for n in ("LastCheckpoint", "EMA", "TimeBudget", "ResolutionSchedule", "PatchDropSchedule")
    }


def test_load_model_gives_the_old_codes_logits_for_the_grouped_layout() -> None:
    model, _ = load_model(GROUPED)
    with torch.no_grad():
        logits = model(_input())
    _assert_old_logits(model, logits, GROUPED_EXPECTED["logits"])
    module = ViTClassifier.load_from_checkpoint(GROUPED).eval()
    with torch.no_grad():
        assert torch.equal(module.model(_input()), logits)  # the same weights and kernels


@needs_cifar
def test_vit_evaluate_scores_the_grouped_fixture_as_the_old_code_did(tmp_path: Path) -> None:
    from vit.commands.evaluate import run_evaluate

    result = run_evaluate(
        [
            str(GROUPED),
            "--split",
            "val",
            "--output-dir",
            str(tmp_path),
            "--data-dir",
            str(CIFAR_ARCHIVE),
        ]
    )
    assert result["num_images"] == GROUPED_EXPECTED["val_images"] == 64
    assert result["top1"] == GROUPED_EXPECTED["val_top1"]
    assert result["top5"] == GROUPED_EXPECTED["val_top5"]


@needs_cifar
def test_an_old_config_yaml_resumes_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`vit-train -c <old config.yaml> --ckpt_path <old ckpt>`: the old class paths resolve to
    today's callbacks (with a warning naming each new path), and the fit goes on from step 6."""
    from vit.commands.train import train_main

    monkeypatch.chdir(tmp_path)  # the config's loggers write to runs/ here
    ckpt = shutil.copy(GROUPED, tmp_path / "old.ckpt")
    elapsed = load_checkpoint(ckpt)["callbacks"]["TimeBudget"]["elapsed_s"]
    with caplog.at_level("WARNING", logger="vit.commands.train"):
        train_main(
            ["fit", "-c", str(GROUPED_CONFIG), f"--ckpt_path={ckpt}", "--trainer.max_steps=8",
             f"--data.data_dir={CIFAR_ARCHIVE}", "--trainer.enable_progress_bar=false"]
        )  # fmt: skip
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "vit.callbacks.TimeBudget is vit.train.callbacks.TimeBudget now" in warned
    last = next(tmp_path.glob("runs/cpu60/version_*/checkpoints/last.ckpt"))
    resumed = load_checkpoint(last)
    assert resumed["global_step"] == 8
    assert resumed["callbacks"]["TimeBudget"]["elapsed_s"] > elapsed
    saved = yaml.safe_load(next(tmp_path.glob("runs/cpu60/version_*/config.yaml")).read_text())
    assert "vit.train.callbacks.TimeBudget" in [
        c["class_path"] for c in saved["trainer"]["callbacks"]
    ]


def test_migrate_renames_old_class_paths_and_only_those() -> None:
    ckpt = {
        "hyper_parameters": {"_class_path": "vit.lit_module.ViTClassifier"},
        "datamodule_hyper_parameters": {"_class_path": "vit.data.CIFAR10DataModule"},
    }
    migrate_checkpoint(ckpt)
    assert ckpt["hyper_parameters"]["_class_path"] == "vit.train.module.ViTClassifier"
    assert (
        ckpt["datamodule_hyper_parameters"]["_class_path"]
        == "vit.train.datamodule.CIFAR10DataModule"
    )
    mine = {"hyper_parameters": {"_class_path": "my.module.Classifier"}}
    assert migrate_checkpoint(mine)["hyper_parameters"]["_class_path"] == "my.module.Classifier"


def test_each_load_migrates_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint read by load_checkpoint is migrated there, once; the module's hook, which
    Lightning calls with what it read itself, migrates only what is still of an old layout."""
    import vit.io.checkpoint
    import vit.train.module

    calls: list[int] = []
    real = migrate_checkpoint

    def counting(ckpt: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        return real(ckpt)

    monkeypatch.setattr(vit.io.checkpoint, "migrate_checkpoint", counting)
    monkeypatch.setattr(vit.train.module, "migrate_checkpoint", counting)
    for load in (load_model, ViTClassifier.load_from_checkpoint):
        calls.clear()
        load(FIXTURE)
        assert len(calls) == 1, load
    module = ViTClassifier.load_from_checkpoint(FIXTURE)
    calls.clear()
    module.on_load_checkpoint(load_checkpoint(FIXTURE))  # already migrated by load_checkpoint
    assert len(calls) == 1
    calls.clear()
    module.on_load_checkpoint(_raw_fixture())  # as Lightning reads it: the old layout
    assert len(calls) == 1


TODAY_HPARAMS = {"_class_path": "vit.train.module.ViTClassifier", "network": {"preset": "vit_tiny"}}


@pytest.mark.parametrize(
    ("ckpt", "old"),
    [
        ({"hyper_parameters": {"preset": "vit_tiny", "lr": 1e-3}}, True),  # flat options alone
        ({"hyper_parameters": TODAY_HPARAMS, "train_elapsed_s": 1.5}, True),  # the clock alone
        ({"hyper_parameters": {**TODAY_HPARAMS, "_class_path": "vit.lit_module.ViTClassifier"}},
         True),  # an old class path alone
        ({"hyper_parameters": TODAY_HPARAMS,
          "datamodule_hyper_parameters": {"_class_path": "vit.data.CIFAR10DataModule"}}, True),
        ({"hyper_parameters": TODAY_HPARAMS,
          "datamodule_hyper_parameters": {"_class_path": "vit.train.datamodule.CIFAR10DataModule"},
          "callbacks": {"TimeBudget": {"elapsed_s": 1.5, "off_clock_s": 0.0}}}, False),
        ({"hyper_parameters": {"preset": "vit_tiny", "network": {}}}, False),  # grouped already
        ({"state_dict": {}}, False),  # no hyper-parameters at all
    ],
)  # fmt: skip
def test_is_old_layout_sees_each_old_trait_on_its_own(ckpt: dict[str, Any], old: bool) -> None:
    """Any one old trait is enough for the module's hook to migrate what Lightning read."""
    assert is_old_layout(ckpt) is old
    assert is_old_layout(migrate_checkpoint(copy.deepcopy(ckpt))) is False


def test_migrate_metric_states_sums_per_class_counts_into_the_modules_micro_counts() -> None:
    own = {
        "metrics.val.tp": torch.zeros(1, dtype=torch.long),
        "metrics.val.fn": torch.zeros(1, dtype=torch.long),
        "metrics.val5.tp": torch.zeros(3, dtype=torch.long),  # top-5 keeps per-class counts
    }
    micro = torch.tensor([9], dtype=torch.long)
    per_class5 = torch.tensor([1, 2, 3])
    weight = torch.randn(2, 2)
    state = {
        "metrics.val.tp": torch.tensor([3, 4]),  # two classes: the fewest that need summing
        "metrics.val.fn": micro,  # today's micro count
        "metrics.val5.tp": per_class5,
        "model.head.weight": weight,  # not a metric state
    }
    migrate_metric_states(state, own)
    assert state["metrics.val.tp"].tolist() == [7] and state["metrics.val.tp"].dtype == torch.long
    # today's states stay as they are, the very tensors
    assert state["metrics.val.fn"] is micro and state["metrics.val5.tp"] is per_class5
    assert state["model.head.weight"] is weight
    # counts saved as floats come back in the module's dtype: torchmetrics sets the loaded tensor
    # as the state, with no cast of its own
    floats = {"metrics.val.tp": torch.tensor([3.0, 4.0, 5.0])}
    migrate_metric_states(floats, own)
    assert floats["metrics.val.tp"].dtype == torch.long and floats["metrics.val.tp"].tolist() == [
        12
    ]


def test_the_old_clock_alone_moves_into_the_time_budget_callback() -> None:
    """A checkpoint with the budget's clock but no callbacks yet gets them; an old one without
    an off-clock time had none (0.0 s); an off-clock time it holds is kept."""
    ckpt = migrate_checkpoint({"train_elapsed_s": 1.5})
    assert ckpt == {"callbacks": {"TimeBudget": {"elapsed_s": 1.5, "off_clock_s": 0.0}}}
    ckpt = migrate_checkpoint({"train_elapsed_s": 1.5, "train_off_clock_s": 0.25})
    assert ckpt == {"callbacks": {"TimeBudget": {"elapsed_s": 1.5, "off_clock_s": 0.25}}}


def test_grouped_hyper_parameters_that_hold_a_preset_pass_unchanged() -> None:
    """A grouped layout may hold a top-level preset beside its network group: not flat."""
    hp = {"preset": "vit_tiny", "network": {"preset": "vit_tiny"}, "lr": 1e-3}
    ckpt = migrate_checkpoint({"hyper_parameters": copy.deepcopy(hp)})
    assert ckpt == {"hyper_parameters": hp}
