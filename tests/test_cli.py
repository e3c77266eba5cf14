"""End to end: vit-train -> checkpoint -> vit-evaluate on tiny data; every experiment YAML parses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from tests.helpers import CIFAR_ARCHIVE, REPO, TINY_DATA_CLASSES, train_args
from vit.commands.evaluate import run_evaluate
from vit.commands.train import ViTCLI, train_main
from vit.data.datasets import CIFAR10_MEAN, CIFAR10_STD
from vit.data.folder_source import decode_image_bytes
from vit.io.load import load_model
from vit.train.datamodule import CIFAR10DataModule
from vit.train.module import ViTClassifier
from vit.train.muon import MuonAdamW
from vit.train.optim import build_optimizer


def _test_images(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """root/test/<class>/<file> as uint8 (N, 3, 32, 32) and labels by sorted class name."""
    images, labels = [], []
    for label, name in enumerate(sorted(TINY_DATA_CLASSES)):
        for file in sorted((root / "test" / name).iterdir()):
            images.append(decode_image_bytes(file.read_bytes(), name=str(file)))
            labels.append(label)
    return torch.stack(images), torch.tensor(labels)


@torch.no_grad()
def _scores(
    model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, *, flip: bool = False
) -> dict[str, object]:
    """top1, per-class accuracy and confusion (rows true, columns predicted), counted by hand."""
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (CIFAR10_MEAN, CIFAR10_STD))
    x = (images.float() / 255 - mean) / std
    logits = model.eval()(x)
    if flip:
        logits = (logits + model(x.flip(-1))) / 2
    pred = logits.argmax(dim=-1).tolist()
    n = len(TINY_DATA_CLASSES)
    confusion = [[0] * n for _ in range(n)]
    for true, guess in zip(labels.tolist(), pred, strict=True):
        confusion[true][guess] += 1
    return {
        "top1": sum(confusion[c][c] for c in range(n)) / len(pred),
        "per_class": {
            name: confusion[c][c] / sum(confusion[c])
            for c, name in enumerate(sorted(TINY_DATA_CLASSES))
        },
        "confusion_matrix": confusion,
    }


def test_train_checkpoint_evaluate_end_to_end(
    image_tree: Path, image_tree_tgz: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    train_main(train_args(image_tree_tgz, runs, "--test_after_fit=true"))
    run = runs / "tiny" / "version_0"
    assert (run / "metrics.csv").is_file()  # CSV logs
    assert list(run.glob("events.out.tfevents.*"))  # TensorBoard logs, same folder
    assert (run / "config.yaml").is_file()
    last = run / "checkpoints" / "last.ckpt"
    assert last.is_file() and any(p.name.startswith("epoch=") for p in last.parent.iterdir())
    assert "test/acc" in (run / "metrics.csv").read_text()  # test_after_fit ran

    # the Lightning checkpoint loads without the CLI, and into a plain model
    module = ViTClassifier.load_from_checkpoint(last, weights_only=True)
    model, ckpt = load_model(last)
    assert module.hparams.class_names == list(TINY_DATA_CLASSES)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(module.model.eval()(x), model(x))  # the same weights and kernels

    result = run_evaluate([str(last), "--output-dir", str(tmp_path / "eval")])
    assert result["num_images"] == 3 * 4
    assert set(result["per_class"]) == set(TINY_DATA_CLASSES)
    saved = json.loads((tmp_path / "eval" / "metrics_test.json").read_text())
    # the same figures, recomputed without the evaluate code: the test images read from their
    # files, normalized, through the plain model, argmax, counted
    expected = _scores(model, *_test_images(image_tree))
    assert saved["top1"] == result["top1"] == expected["top1"]
    assert saved["per_class"] == result["per_class"] == pytest.approx(expected["per_class"])
    assert saved["confusion_matrix"] == result["confusion_matrix"] == expected["confusion_matrix"]
    with Image.open(tmp_path / "eval" / "confusion_matrix_test.png") as png:
        assert png.format == "PNG" and png.size[0] > 100
    with Image.open(tmp_path / "eval" / "reliability_test.png") as png:
        assert png.format == "PNG" and png.size[0] > 100
    assert saved["ece"] == result["ece"] and sum(saved["calibration"]["images"]) == 12
    assert result["flip"] is False  # the checkpoint's model.test_flip
    assert result["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # --device auto
    flipped = run_evaluate([str(last), "--flip", "--output-dir", str(tmp_path / "eval_flip")])
    assert flipped["flip"] is True and flipped["num_images"] == 12
    assert flipped["top1"] == _scores(model, *_test_images(image_tree), flip=True)["top1"]

    # a second run gets its own folder: nothing of the first is overwritten
    train_main(train_args(image_tree_tgz, runs, "--trainer.max_epochs=1"))
    assert (runs / "tiny" / "version_1" / "checkpoints" / "last.ckpt").is_file()
    assert last.is_file()


def _cli_on(
    monkeypatch: pytest.MonkeyPatch, fast_bf16: bool, image_tree: Path, tmp_path: Path, *extra: str
) -> ViTCLI:
    """vit-train's CLI, parsed and built without running, on a CPU with or without native bf16."""
    monkeypatch.setattr("vit.system.hardware.cpu_has_fast_bf16", lambda: fast_bf16)
    args = train_args(image_tree, tmp_path / "runs", *extra)
    return ViTCLI(ViTClassifier, CIFAR10DataModule, args=args[1:], run=False)


@pytest.mark.parametrize(
    ("fast_bf16", "extra", "expected"),
    [
        (False, [], "32-true"),  # bf16 on a CPU without it: ~13x slower, so float32
        (False, ["--bf16_fallback=false"], "bf16-mixed"),  # the user insists
        (True, [], "bf16-mixed"),  # AVX512-BF16 / AMX: bf16 as asked
    ],
)
def test_bf16_falls_back_to_float32_on_a_cpu_without_native_bf16(
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fast_bf16: bool,
    extra: list[str],
    expected: str,
) -> None:
    cli = _cli_on(
        monkeypatch, fast_bf16, image_tree, tmp_path, "--trainer.precision=bf16-mixed", *extra
    )
    assert cli.trainer.precision == expected
    warned = "no native bfloat16" in caplog.text
    assert warned == (expected == "32-true")
    if warned:
        assert "--bf16_fallback false" in caplog.text  # says how to keep bf16


OVERRIDE = "--float32_overrides={model: {network: {drop_path_rate: 0.0}}}"


def _drop_probs(module: ViTClassifier) -> set[float]:
    return {m.drop_prob for m in module.model.modules() if hasattr(m, "drop_prob")}


@pytest.mark.parametrize(
    ("fast_bf16", "extra", "float32"),
    [
        (False, [], True),  # the bf16 fallback trains in float32: the overrides apply
        (True, [], False),  # native bf16: the config as written
        (True, ["--trainer.precision=32-true"], True),  # float32 asked for, on any CPU
        (False, ["--bf16_fallback=false"], False),  # bf16 kept by the user
    ],
)
def test_float32_overrides_apply_only_where_a_cpu_fit_trains_in_float32(
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fast_bf16: bool,
    extra: list[str],
    float32: bool,
) -> None:
    cli = _cli_on(
        monkeypatch, fast_bf16, image_tree, tmp_path, "--trainer.precision=bf16-mixed",
        "--model.network.drop_path_rate=0.1", OVERRIDE, *extra,
    )  # fmt: skip
    rate = 0.0 if float32 else 0.1
    assert cli.config.model.network.drop_path_rate == rate  # what config.yaml will record
    assert max(_drop_probs(cli.model)) == pytest.approx(rate)  # the blocks, as built (float32)
    assert (
        "float32_overrides applied (model.network.drop_path_rate=0.0)" in caplog.text
    ) == float32


@pytest.mark.parametrize("compiler", [True, False])
def test_a_float32_override_s_compile_is_left_out_where_no_cpp_compiler_builds_it(
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    compiler: bool,
) -> None:
    """cpu60.yaml's overrides compile the network where the CPU trains in float32 (and may
    compile the optimizer's update); on a machine without a C++ compiler the fit trains eager,
    saying why, instead of failing at its start."""
    if compiler:
        monkeypatch.setattr("vit.commands.float32_overrides.check_cpp_compiler", lambda: None)
    else:
        monkeypatch.setenv("CXX", "no-such-c++-compiler")
    override = (
        "--float32_overrides={model: {network: {drop_path_rate: 0.0}, torch_compile: true, "
        "optimizer: {compile: true}}}"
    )
    cli = _cli_on(
        monkeypatch,
        False,
        image_tree,
        tmp_path,
        "--trainer.precision=bf16-mixed",
        "--model.optimizer.name=muon",
        override,
    )
    assert cli.config.model.torch_compile is compiler
    assert cli.config.model.optimizer.compile is compiler
    assert cli.config.model.network.drop_path_rate == 0.0  # the other override still applies
    left_out = "model.torch_compile, model.optimizer.compile left out" in caplog.text
    assert left_out is not compiler
    if left_out:
        assert "no-such-c++-compiler" in caplog.text and "install one" in caplog.text
        assert cli.config.float32_overrides == {"model": {"network": {"drop_path_rate": 0.0}}}


def test_float32_overrides_from_a_config_file_reach_the_saved_config(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As experiments/cpu60.yaml writes them: a nested mapping in the YAML; the run's config.yaml
    records the options it trained with."""
    monkeypatch.setattr("vit.system.hardware.cpu_has_fast_bf16", lambda: False)
    config = tmp_path / "f32.yaml"
    config.write_text(
        "trainer: {precision: bf16-mixed}\n"
        "model: {network: {drop_path_rate: 0.1}}\n"
        "float32_overrides:\n  model:\n    network: {drop_path_rate: 0.0}\n"
        "    label_smoothing: 0.05\n"
    )
    runs = tmp_path / "runs"
    args = train_args(image_tree, runs, "-c", str(config), "--trainer.max_epochs=1")
    train_main(args)
    saved = yaml.safe_load((runs / "tiny" / "version_0" / "config.yaml").read_text())
    assert saved["model"]["network"]["drop_path_rate"] == 0.0
    assert saved["model"]["label_smoothing"] == 0.05
    assert saved["trainer"]["precision"] == "32-true"


@pytest.mark.parametrize(
    ("override", "says"),
    [
        (
            "{model: {network: {drop_rate_typo: 0.0}}}",
            "model.network.drop_rate_typo is not an option",
        ),
        ("{model: {network: {drop_path_rate: high}}}", "drop_path_rate"),
    ],
)
def test_float32_overrides_refuse_an_unknown_option_or_a_wrong_value(
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys,
    override: str,
    says: str,
) -> None:
    with pytest.raises((ValueError, SystemExit)) as err:
        _cli_on(monkeypatch, False, image_tree, tmp_path, f"--float32_overrides={override}")
    assert says in str(err.value) + capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("status", "warned"),
    [
        ("not possible: torch was imported first, ...", True),  # AMD, and speed lost
        ("on: MKL (torch's float32 BLAS on x86) takes its AVX2 or AVX-512 kernels (x.so)", False),
        ("not needed: GenuineIntel CPU", False),
        ("off: VIT_MKL_AVX2=0", False),  # the user's choice: nothing to warn about
    ],
)
def test_training_warns_where_the_mkl_shim_could_not_help(
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    status: str,
    warned: bool,
) -> None:
    monkeypatch.setattr("vit.system.mkl_amd._status", status)
    args = train_args(image_tree, tmp_path / "runs")
    ViTCLI(ViTClassifier, CIFAR10DataModule, args=args[1:], run=False)
    assert ("MKL's AVX2 kernels" in caplog.text) == warned
    if warned:
        assert status in caplog.text  # the status says why and how to fix it


@pytest.mark.parametrize(
    ("status", "logged"),
    [
        ("on: glibc 2.36 keeps the memory a step frees (mmap threshold 32 MiB)", True),
        ("off: VIT_KEEP_FREED_MEMORY=0", False),  # the user's choice: nothing to say
    ],
)
def test_training_logs_what_the_malloc_switch_did(
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    status: str,
    logged: bool,
) -> None:
    monkeypatch.setattr("vit.system.malloc._status", status)
    caplog.set_level("INFO")
    ViTCLI(
        ViTClassifier,
        CIFAR10DataModule,
        args=train_args(image_tree, tmp_path / "runs")[1:],
        run=False,
    )
    assert (f"vit.system.malloc: {status}" in caplog.text) == logged


def test_a_run_records_the_precision_it_trained_with(
    image_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("vit.system.hardware.cpu_has_fast_bf16", lambda: False)
    runs = tmp_path / "runs"
    train_main(
        train_args(image_tree, runs, "--trainer.precision=bf16-mixed", "--trainer.max_epochs=1")
    )
    saved = yaml.safe_load((runs / "tiny" / "version_0" / "config.yaml").read_text())
    assert saved["trainer"]["precision"] == "32-true"


def test_vit_train_from_the_command_line_adds_fit_without_lightnings_args_warning(
    image_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recwarn: pytest.WarningsRecorder,
) -> None:
    runs = tmp_path / "runs"
    args = train_args(image_tree, runs, "--trainer.max_epochs=1")
    assert args[0] == "fit"
    monkeypatch.setattr("sys.argv", ["vit-train", *args[1:]])  # as typed: no subcommand
    train_main()
    assert (runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt").is_file()  # fit ran
    lightning_warnings = [str(w.message) for w in recwarn if "args parameter" in str(w.message)]
    assert lightning_warnings == []


def test_class_count_mismatch_is_reported(image_tree: Path, tmp_path: Path) -> None:
    args = train_args(image_tree, tmp_path / "runs")
    args[args.index("--model.network.num_classes=3")] = "--model.network.num_classes=10"
    with pytest.raises(
        ValueError, match="the data has 3 classes.*num_classes=10; set model.network.num_classes: 3"
    ):
        train_main(args)


def test_missing_checkpoint_and_data_are_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no_such.ckpt"):
        run_evaluate([str(tmp_path / "no_such.ckpt")])
    dm = CIFAR10DataModule(data_dir=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="nowhere"):
        dm.prepare_data()


@pytest.mark.parametrize(
    "config", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_experiment_config_parses(config: Path, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the run folders it checks are writable go there
    cli = ViTCLI(ViTClassifier, CIFAR10DataModule, args=["-c", str(config)], run=False)
    assert isinstance(cli.model, ViTClassifier)
    assert cli.trainer.max_epochs >= 1
    assert cli.datamodule.hparams.source in ("auto", "folder", "cifar10")


# what a recipe gets where its YAML says nothing (OptimizerConfig's and MuonConfig's defaults)
OPTIMIZER_DEFAULTS = {"name": "adamw", "weight_decay": 0.05, "betas": [0.9, 0.999], "fused": None}
MUON_DEFAULTS = {
    "lr_scale": 1.0,
    "momentum": 0.95,
    "ns_steps": 5,
    "split_qkv": False,
    "patch_embed": False,
}


@pytest.mark.parametrize(
    "config", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_recipe_s_optimizer_settings_reach_the_optimizer(
    config: Path, tmp_path, monkeypatch
) -> None:
    """Each optimizer setting the YAML writes, read from its text, is found on the groups of the
    optimizer built from the parsed config: a setting lost on the way fails here."""
    monkeypatch.chdir(tmp_path)
    written = yaml.safe_load(config.read_text())["model"]["optimizer"]
    want = {**OPTIMIZER_DEFAULTS, **written}
    muon = {**MUON_DEFAULTS, **(written.get("muon") or {})}
    cli = ViTCLI(ViTClassifier, CIFAR10DataModule, args=["-c", str(config)], run=False)
    model = cli.model.model
    optimizer = build_optimizer(model, cli.model.optimizer_config)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [(g, {names[id(p)] for p in g["params"]}) for g in optimizer.param_groups]
    assert sum(len(n) for _, n in groups) == len(names)  # every parameter, once
    matrices = {n for n, p in model.named_parameters() if p.ndim >= 2} - {"cls_token", "pos_embed"}
    muon_names: set[str] = set()
    if want["name"] == "muon":
        assert isinstance(optimizer, MuonAdamW)
        muon_names = {n for n in matrices if n.startswith("blocks.")}
        if muon["patch_embed"]:
            muon_names.add("patch_embed.proj.weight")
        in_muon = [(g, n) for g, n in groups if g["use_muon"]]
        assert set().union(*(n for _, n in in_muon)) == muon_names
        for g, group_names in in_muon:
            assert g["lr"] == want["lr"] * muon["lr_scale"]
            assert g["weight_decay"] == want["weight_decay"]
            assert (g["momentum"], g["ns_steps"]) == (muon["momentum"], muon["ns_steps"])
            qkv = all(n.endswith("attn.qkv.weight") for n in group_names)
            assert g["split"] == (3 if muon["split_qkv"] and qkv else 1)
        groups = [(g, n) for g, n in groups if not g["use_muon"]]
    else:
        assert type(optimizer) is torch.optim.AdamW and muon == MUON_DEFAULTS
        assert all(g["fused"] == want["fused"] for g, _ in groups)
    decayed, spared = groups  # AdamW's: the other matrices decayed; vectors, CLS, positions not
    assert (
        decayed[1] == matrices - muon_names and decayed[0]["weight_decay"] == want["weight_decay"]
    )
    assert spared[1] == set(names.values()) - matrices - muon_names
    assert spared[0]["weight_decay"] == 0.0
    for g, _ in groups:
        assert g["lr"] == want["lr"] and list(g["betas"]) == want["betas"]


@pytest.mark.slow
@pytest.mark.skipif(
    not CIFAR_ARCHIVE.is_file(), reason=f"CIFAR-10 archive not found at {CIFAR_ARCHIVE}"
)
def test_smoke_on_real_cifar10_beats_chance(tmp_path: Path) -> None:
    """A 1-minute run on 4,000 real CIFAR-10 images must clear 10% chance by a wide margin."""
    runs = tmp_path / "runs"
    args = train_args(CIFAR_ARCHIVE, runs)
    args[args.index("--model.network.num_classes=3")] = "--model.network.num_classes=10"
    args[args.index("--data.batch_size=8")] = "--data.batch_size=64"
    args[args.index("--data.val_size=6")] = "--data.val_size=1000"
    args[args.index(f"--data.cache_dir={runs / 'cache'}")] = "--data.train_subset=4000"
    args[args.index("--model.network.patch_size=8")] = "--model.network.patch_size=4"
    args += [
        "--model.network.embed_dim=64",
        "--model.optimizer.lr=2e-3",
        "--trainer.max_epochs=4",
        "--trainer.precision=bf16-mixed",
    ]
    train_main(args)
    result = run_evaluate(
        [
            str(runs / "tiny/version_0/checkpoints/last.ckpt"),
            "--split",
            "val",
            "--output-dir",
            str(tmp_path / "eval"),
        ]
    )
    assert result["num_images"] == 1000
    assert result["top1"] > 0.25, result["top1"]


def test_unwritable_run_folder_fails_before_training(image_tree: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match="cannot write the run folder.*a_file"):
        train_main(train_args(image_tree, blocker / "runs"))


def test_a_data_setting_found_wrong_at_setup_leaves_no_run_folder(image_tree, tmp_path) -> None:
    # val_size is checked against the data when it is read (setup), after the loggers started
    runs = tmp_path / "runs"
    with pytest.raises(ValueError, match="val_size=100 leaves no training images"):
        train_main(train_args(image_tree, runs, "--data.val_size=100"))
    assert not (runs / "tiny").exists()  # neither version_0 nor the folder made to probe it


def test_a_fast_dev_run_leaves_no_run_folder_and_no_checkpoint(
    image_tree, tmp_path, monkeypatch
) -> None:
    """Lightning swaps the loggers out for fast_dev_run, so the folder probed for them stays
    empty; its ModelCheckpoint would still save last.ckpt at train end, into ./checkpoints."""
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    train_main(train_args(image_tree, runs, "--trainer.fast_dev_run=true"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "tiny"]  # tiny: the images
    assert sorted(p.name for p in runs.iterdir()) == ["cache"]


def test_console_commands_print_user_errors_without_traceback(tmp_path, capsys) -> None:
    from vit.commands.evaluate import evaluate_main

    with pytest.raises(SystemExit) as exit_info:
        evaluate_main([str(tmp_path / "missing.ckpt")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: checkpoint")


@pytest.mark.parametrize(
    ("where", "typo", "said"),
    [
        ("line", "--data.batchsize=64", "unrecognized arguments: --data.batchsize=64; did you "
         "mean --data.batch_size?"),
        ("line", "--model.network.depht=3", "did you mean --model.network.depth?"),
        ("line", "--model.netwrk.depth=3", "did you mean --model.network.depth?"),  # its group
        ("line", "--trainer.max_epoks=3", "did you mean --trainer.max_epochs?"),
        ("line", "--data.nothing_like_it=1", "unrecognized arguments: --data.nothing_like_it=1\n"),
        ("yaml", "batchsize", "does not accept option 'data.batchsize'; did you mean "
         "data.batch_size?"),
        ("yaml", "nothing_like_it", "does not accept option 'data.nothing_like_it'\n"),
    ],
)  # fmt: skip
def test_a_misspelt_option_is_refused_naming_the_closest_ones(
    tmp_path, capsys, where, typo, said
) -> None:
    """An option vit-train does not know, on the command line or in the YAML, is refused before
    any folder is made, with the nearest options it knows where one is close."""
    config = yaml.safe_load((REPO / "experiments" / "quick.yaml").read_text())
    config["trainer"]["logger"][0]["init_args"]["save_dir"] = str(tmp_path / "runs")
    args = [typo]
    if where == "yaml":
        config["data"][typo] = 64
        args = []
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        train_main(["fit", "-c", str(path), *args])
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("--model.network.depth=-3", "error: depth=-3 must be a positive integer."),
        (  # Lightning's refusal, raised inside Lightning: one line as well
            "--trainer.max_epochs=-2",
            "error: `max_epochs` must be a non-negative integer or -1. You passed in -2.",
        ),
    ],
)
def test_vit_train_prints_setting_errors_as_one_line(
    image_tree, tmp_path, setting, message
) -> None:
    # the console command (python -m vit.commands.entry is vit-train): no traceback
    args = train_args(image_tree, tmp_path / "runs", setting)
    run = subprocess.run(
        [sys.executable, "-m", "vit.commands.entry", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in run.stderr
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]  # no run was written
    assert not (tmp_path / "runs" / "tiny").exists()  # nor its folder, made to probe it, kept


def _raise_outside_vit() -> None:
    raise ValueError("from a library")


def test_user_errors_count_only_from_vits_own_code_where_asked(capsys) -> None:
    from vit.data.settings import check_int
    from vit.system.errors import PACKAGE_DIR, exit_on_user_error

    with pytest.raises(SystemExit) as exit_info:  # raised by vit's check: one line, status 2
        exit_on_user_error(lambda: check_int("batch_size", 0, minimum=1), only_from=PACKAGE_DIR)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: batch_size must be an integer >= 1, got 0")
    with pytest.raises(ValueError, match="from a library"):  # raised elsewhere: the traceback
        exit_on_user_error(_raise_outside_vit, only_from=PACKAGE_DIR)
    with pytest.raises(SystemExit):  # the other commands: every user error is one line
        exit_on_user_error(_raise_outside_vit)
    with pytest.raises(SystemExit):  # a type named `anywhere` counts wherever it is raised
        exit_on_user_error(_raise_outside_vit, only_from=PACKAGE_DIR, anywhere=(ValueError,))
    with pytest.raises(KeyError):  # and only that type
        exit_on_user_error(lambda: {}["x"], only_from=PACKAGE_DIR, anywhere=(ValueError,))


def test_a_missing_ckpt_path_fails_before_anything_is_made(image_tree, tmp_path) -> None:
    runs = tmp_path / "runs"
    missing = tmp_path / "gone.ckpt"
    with pytest.raises(FileNotFoundError, match=r"gone.ckpt: no such file.*--ckpt_path last"):
        train_main(train_args(image_tree, runs, f"--ckpt_path={missing}"))
    assert not [p for p in runs.rglob("*") if p.is_file()]  # no data cache, no run
    saved = tmp_path / "old" / "version_3" / "checkpoints"
    saved.mkdir(parents=True)
    (saved / "last.ckpt").write_bytes(b"")
    with pytest.raises(IsADirectoryError, match=r"is a folder.*version_3/checkpoints/last.ckpt"):
        train_main(train_args(image_tree, runs, f"--ckpt_path={tmp_path / 'old'}"))


def test_ckpt_path_check_leaves_lightnings_names_and_urls_alone(tmp_path) -> None:
    from vit.commands.run_folders import check_ckpt_path

    for name in ("best", "last", "hpc", "registry", "registry:my-model:v2", "s3://bucket/a.ckpt"):
        check_ckpt_path(name, "test")
    with pytest.raises(FileNotFoundError) as err:  # resuming is a fit's; test only names files
        check_ckpt_path(str(tmp_path / "gone.ckpt"), "test")
    assert "--ckpt_path last" not in str(err.value)


def test_evaluate_device_is_checked_before_anything_loads(monkeypatch, tmp_path, capsys) -> None:
    from vit.commands.evaluate import evaluate_main
    from vit.system.hardware import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    for name, message in [
        ("cuda", "no CUDA GPU is visible here; use --device cpu"),
        ("gpu0", "expected auto, cpu, cuda or cuda:N"),
        ("meta", "expected auto, cpu, cuda or cuda:N"),
    ]:
        with pytest.raises(ValueError, match=message):
            resolve_device(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match="has 2 CUDA GPU.*cuda:0 to cuda:1"):
        resolve_device("cuda:2")
    # the device error comes first, even for a checkpoint that does not exist
    with pytest.raises(SystemExit):
        evaluate_main([str(tmp_path / "missing.ckpt"), "--device", "cuda:5"])
    assert "cuda:5" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-c", "no_such.yaml"], "File does not exist: "),
        (
            ["-c", str(REPO / "experiments" / "quick.yaml"), "--trainer.max_epochs", "two"],
            "max_epochs",
        ),
    ],
)
def test_a_parse_error_is_a_short_usage_and_the_error_not_every_option(
    args: list[str], said: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train_main(["fit", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    # in a test the program is pytest's, not vit-train
    assert said in err and " fit --help" in err  # where every option is listed
    usage = [line for line in err.splitlines() if line.startswith("usage:")]
    assert len(usage) == 1 and usage[0].endswith("fit [-c CONFIG] [--KEY VALUE ...]"), err
    assert "--trainer.accelerator" not in err  # the long usage listed every option first
