"""vit-export and vit/io/export.py: the shipped weights as ONNX agree with PyTorch under
onnxruntime at any batch size, a torch.export program gives PyTorch's logits, the file carries
what a deployment needs, and bad input is refused with the fix."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vit
from tests.helpers import REPO, SHIPPED, TINY, forward_sums, sum_tol, write_safetensors
from vit.commands.export import export_main, run_export
from vit.data.datasets import CIFAR10_MEAN, CIFAR10_STD
from vit.io.export import EXPORT_KERNEL, export_program, for_export
from vit.model.vision_transformer import VisionTransformer

ONNX_ATOL = 1e-4  # the bound for onnxruntime against PyTorch, float32


def images(n: int, *, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def shipped_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnxscript", reason="pip install -e '.[export]'")
    out = tmp_path_factory.mktemp("onnx") / "vit.onnx"
    run_export([SHIPPED, "--output", str(out)])
    return out


def test_onnxruntime_agrees_with_pytorch_at_any_batch_size(shipped_onnx: Path) -> None:
    onnxruntime = pytest.importorskip("onnxruntime", reason="pip install -e '.[export]'")
    model = vit.load_model(SHIPPED)[0]
    runtime = onnxruntime.InferenceSession(str(shipped_onnx), providers=["CPUExecutionProvider"])
    (given,) = runtime.get_inputs()
    assert given.name == "images" and isinstance(given.shape[0], str)  # a named, free batch axis
    for batch in (1, 5):  # the export traced a batch of 2: other sizes prove the axis dynamic
        x = images(batch, seed=batch)
        with torch.inference_mode():
            expected = model(x)
        got = torch.from_numpy(runtime.run(None, {"images": x.numpy()})[0])
        assert got.shape == (batch, 10)
        torch.testing.assert_close(got, expected, rtol=0, atol=ONNX_ATOL)


def test_the_onnx_file_says_how_to_feed_it(shipped_onnx: Path) -> None:
    onnx = pytest.importorskip("onnx")
    props = {p.key: p.value for p in onnx.load(str(shipped_onnx)).metadata_props}
    assert json.loads(props["mean"]) == list(CIFAR10_MEAN)
    assert json.loads(props["std"]) == list(CIFAR10_STD)
    assert json.loads(props["class_names"])[:2] == ["airplane", "automobile"]
    assert json.loads(props["config"])["depth"] == 4 and props["source"] == SHIPPED
    assert props["input"].startswith("images: float (batch, 3, 32, 32)")
    assert not list(shipped_onnx.parent.glob("*.data"))  # one file, the weights inside


def test_a_torch_export_program_gives_the_models_logits(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "lsa": True, "spt": True}).eval()
    path = export_program(model, tmp_path / "tiny.pt2")
    program = torch.export.load(str(path)).module()
    for batch in (1, 3):
        x = images(batch)
        with torch.inference_mode():
            expected = model(x)  # float32 on CPU: auto is the fused kernel, the one pinned
            got = program(x)
        # the same ops in the same order, unless the program's graph fuses or reorders a sum
        tol = sum_tol(torch.float32, forward_sums(model), expected.abs().max())
        torch.testing.assert_close(got, expected, rtol=0, atol=tol)


def test_export_pins_the_kernel_and_keeps_the_given_model(tmp_path: Path) -> None:
    model = VisionTransformer(**{**TINY, "kernel": "explicit", "lsa": True}).train()
    pinned = for_export(model)
    assert {b.attn.kernel for b in pinned.blocks} == {EXPORT_KERNEL} and not pinned.training
    assert {b.attn.kernel for b in model.blocks} == {"explicit"} and model.training
    pairs = zip(model.state_dict().values(), pinned.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    with pytest.raises(ValueError, match="expected a vit VisionTransformer, got Linear"):
        for_export(torch.nn.Linear(2, 2))


def test_the_command_writes_a_program_named_after_the_weights(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**TINY)
    weights = write_safetensors(model, tmp_path / "tiny.safetensors",
                                class_names=[str(k) for k in range(10)])  # fmt: skip
    monkeypatch.chdir(tmp_path)
    export_main([str(weights), "--format", "torch-export"])
    assert (tmp_path / "tiny.pt2").is_file()  # WEIGHTS' name, in the current folder
    said = capsys.readouterr().out
    gap = float(re.search(r"within ([0-9.e+-]+) of PyTorch", said).group(1))
    assert gap <= sum_tol(torch.float32, forward_sums(model), 10.0)  # logits of size < 10


def test_an_existing_output_is_kept_unless_overwrite(tmp_path: Path, capsys) -> None:
    out = tmp_path / "model.pt2"
    out.write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        export_main([SHIPPED, "--format", "torch-export", "--output", str(out)])
    assert exit_.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert out.read_text() == "mine"
    run_export([SHIPPED, "--format", "torch-export", "--output", str(out), "--overwrite"])
    assert out.stat().st_size > 1_000_000  # the weights, a few MB


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-weights"], "'no-such-weights' does not exist"),
        ([SHIPPED, "--output", "{tmp}"], "is a folder; name a file"),
        ([SHIPPED, "--format", "torch-export", "--output", "{tmp}/m.onnx"], "name it 'm.pt2'"),
        ([SHIPPED, "--output", "{tmp}/a-file/m.onnx"], "which is a file, not a folder"),
    ],
)
def test_bad_input_is_named(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    (tmp_path / "a-file").write_text("in the way")
    with pytest.raises(SystemExit) as exit_:
        export_main([a.format(tmp=tmp_path) for a in args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_an_unknown_format_lists_the_formats(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        export_main([SHIPPED, "--format", "tflite"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err  # argparse quotes the choices in some Python versions only
    assert "invalid choice: 'tflite'" in err and re.search(r"onnx'?, '?torch-export", err)


def test_without_onnx_the_extra_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # an import of it now fails
    with pytest.raises(SystemExit) as exit_:
        export_main([SHIPPED, "--output", str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "pip install 'vit[export]'" in err and "onnxscript" in err
    assert not (tmp_path / "m.onnx").exists()


def test_the_format_follows_the_outputs_suffix_into_new_folders(tmp_path: Path) -> None:
    torch.manual_seed(0)
    weights = write_safetensors(VisionTransformer(**TINY), tmp_path / "tiny.safetensors",
                                class_names=[str(k) for k in range(10)])  # fmt: skip
    out = tmp_path / "new" / "deeper" / "model.pt2"
    done = run_export([str(weights), "--output", str(out)])
    assert done["format"] == "torch-export" and done["output"] == out
    assert torch.export.load(str(out)).module()(images(1)).shape == (1, 10)


def test_the_installed_command_exports_and_refuses_without_a_traceback(tmp_path: Path) -> None:
    """End to end, as a user runs it: the console script, in its own process."""
    if "MUTANT_UNDER_TEST" in os.environ:
        pytest.skip("another process imports vit/ without mutmut's trampolines' state")
    onnxruntime = pytest.importorskip("onnxruntime", reason="pip install -e '.[export]'")
    pytest.importorskip("onnxscript", reason="pip install -e '.[export]'")
    torch.manual_seed(0)
    model = VisionTransformer(**TINY).eval()
    weights = write_safetensors(model, tmp_path / "tiny.safetensors",
                                class_names=[str(k) for k in range(10)])  # fmt: skip
    done = _command(str(weights), "--format", "onnx", "--output", "out/tiny.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wrote out/tiny.onnx" in done.stdout
    path = str(tmp_path / "out" / "tiny.onnx")
    runtime = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = images(3)
    got = torch.from_numpy(runtime.run(None, {"images": x.numpy()})[0])
    with torch.inference_mode():
        torch.testing.assert_close(got, model(x), rtol=0, atol=ONNX_ATOL)
    refused = _command("no-such-weights.ckpt", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    # the last line (on an AMD CPU the MKL switch's status line comes first) lists what is shipped
    last = refused.stderr.splitlines()[-1]
    assert last.startswith("error: ") and SHIPPED in last


def _command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """vit-export as installed ([project.scripts]), else its entry function."""
    script = Path(sys.executable).parent / "vit-export"
    entry = "import sys; from vit.commands import entry; sys.argv[0] = 'vit-export'; entry.export()"
    head = [str(script)] if script.is_file() else [sys.executable, "-c", entry]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [*head, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )
