"""Tests for vit/io/ and vit/io/timm_interop.py: safe loads, errors, resizing, sharing."""

from __future__ import annotations

import decimal
import fractions
import importlib.util
import json
import os
import pickle
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import TINY, forward_sums, sum_tol
from vit.io.checkpoint import load_checkpoint
from vit.io.load import export_safetensors, load_model, load_weights
from vit.io.safetensors_file import load_safetensors
from vit.io.state_dict import strip_prefixes
from vit.model.embed import sinusoidal_table
from vit.model.vision_transformer import VisionTransformer

TINY3 = {**TINY, "num_classes": 3}
needs_timm = pytest.mark.skipif(
    importlib.util.find_spec("timm") is None, reason='timm not installed: pip install -e ".[timm]"'
)


def _model(seed: int = 0, **overrides: Any) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(**{**TINY3, **overrides}).eval()


def _save_lightning_like(path: Path, model: VisionTransformer, *, prefix: str = "model.") -> Path:
    """A vit-train-shaped checkpoint (hyper_parameters + prefixed state_dict + metric state)."""
    state = {prefix + k: v for k, v in model.state_dict().items()}
    state["metrics.val_acc1.tp"] = torch.zeros(3)
    hp = {
        "network": {"preset": "vit_nano", **TINY3},
        "optimizer": {"lr": 1e-3},
        "class_names": ["a", "b", "c"],
    }
    torch.save({"state_dict": state, "hyper_parameters": hp, "epoch": 1}, path)
    return path


# ---- 1. weights-only: a pickle payload is refused and never runs, through every path that
# reads a checkpoint: tests/test_hostile.py


# ---- 2. damaged files and mismatched shapes: messages that name the file and the problem ----


def test_damaged_files_name_the_file_and_the_problem(tmp_path) -> None:
    good = _save_lightning_like(tmp_path / "good.ckpt", _model())
    data = good.read_bytes()
    cases = {
        "truncated.ckpt": (data[: len(data) // 2], "truncated or corrupt"),
        "random.ckpt": (os.urandom(4096), "not a PyTorch checkpoint"),
        "text.ckpt": (b"hello, not a checkpoint\n", "not a PyTorch checkpoint"),
        "empty.ckpt": (b"", "is empty"),
    }
    for name, (content, expected) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        for loader in (load_checkpoint, load_model):
            with pytest.raises(ValueError, match=expected) as err:
                loader(path)
            assert str(path) in str(err.value), name


DAMAGED = (
    "{path!r} looks like a {kind} PyTorch checkpoint but cannot be read: it is probably truncated "
    "or corrupt (an interrupted save or copy?). Copy or save it again. Details: "
)


@pytest.mark.parametrize(
    ("zip_format", "kind", "details"),
    [  # torch's error, cut to its first sentence: the rest of it is advice for torch's own users
        (True, "zip", r"RuntimeError: PytorchStreamReader failed reading zip archive: [^.]*\."),
        (False, "legacy", r"RuntimeError: unexpected EOF, expected \d+ more bytes\."),
    ],
)
def test_a_truncated_checkpoint_names_its_format_and_torchs_first_sentence(
    tmp_path, zip_format: bool, kind: str, details: str
) -> None:
    path = tmp_path / "cut.ckpt"
    torch.save({"w": torch.zeros(300)}, path, _use_new_zipfile_serialization=zip_format)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    message = re.escape(DAMAGED.format(path=str(path), kind=kind)) + details
    with pytest.raises(ValueError, match=f"^{message}$"):
        load_checkpoint(path)


def _not_a_checkpoint(path: Path) -> str:
    return (
        f"{str(path)!r} is not a PyTorch checkpoint: its first bytes match neither format that "
        "torch.save writes (random bytes, another file type, or the wrong path?). Pass a .ckpt "
        "written by vit-train or a file from torch.save."
    )


REFUSED = re.compile(
    r"^refusing to load (?P<path>'[^']*'): besides tensors and plain values it holds Python "
    r"objects \((?P<names>.*)\), and unpickling them could run code\. Nothing from the file was "
    r"run\. If you trust its origin, load it once with torch\.load\(path, weights_only=False\) "
    r"and torch\.save only its state_dict and hyper_parameters; share that \(or "
    r"export_safetensors of it\)\.$"
)


def _refused_names(path: Path) -> list[str]:
    with pytest.raises(ValueError) as err:
        load_checkpoint(path)
    found = REFUSED.match(str(err.value))
    assert found, str(err.value)
    assert found["path"] == repr(str(path))
    return found["names"].split(", ")


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_a_refused_checkpoint_names_the_objects_it_holds(tmp_path, zip_format: bool) -> None:
    """A zip checkpoint's objects are all listed from its pickle, sorted (torch gives a set, and
    the message should read the same each time); of a legacy one, torch's error names the first
    it met."""
    path = tmp_path / "objects.ckpt"
    held = {"a": fractions.Fraction(1, 3), "b": decimal.Decimal("0.1")}
    torch.save({"state_dict": {}, **held}, path, _use_new_zipfile_serialization=zip_format)
    names = ["decimal.Decimal", "fractions.Fraction"] if zip_format else ["fractions.Fraction"]
    assert _refused_names(path) == names


def test_files_that_are_not_checkpoints_say_what_to_use(tmp_path) -> None:
    damaged = tmp_path / "bad.safetensors"
    damaged.write_bytes(b"\x08" + b"\x00" * 7 + b"garbage!")
    message = (
        f"{str(damaged)!r} is not a torch.save checkpoint; read .safetensors files with "
        "load_safetensors or load_weights."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_checkpoint(damaged)
    # torch's own header holds its magic number within the first 32 bytes: the same number
    # further on (here ending at byte 33) is no sign of a checkpoint
    text = tmp_path / "notes.pt"
    text.write_bytes(b"#" * 23 + b"l\xfc\x9cF\xf9 j\xa8P\x19" + b"#" * 40)
    with pytest.raises(ValueError, match=f"^{re.escape(_not_a_checkpoint(text))}$"):
        load_checkpoint(text)


def test_other_class_count_names_parameters_and_shapes(tmp_path) -> None:
    path = _save_lightning_like(tmp_path / "three.ckpt", _model())
    with pytest.raises(ValueError) as err:
        load_model(path, num_classes=10)
    msg = str(err.value)
    assert str(path) in msg
    assert "head.weight: checkpoint (3, 32) vs model (10, 32)" in msg
    assert "head.bias: checkpoint (3,) vs model (10,)" in msg
    assert "blocks.0" not in msg  # only what differs


def test_load_weights_into_another_width_summarises(tmp_path) -> None:
    path = _save_lightning_like(tmp_path / "w32.ckpt", _model())
    wide = VisionTransformer(**{**TINY3, "embed_dim": 64, "depth": 3})
    with pytest.raises(ValueError) as err:
        load_weights(wide, path)
    msg = str(err.value)
    assert str(path) in msg and "cls_token: checkpoint (1, 1, 32) vs model (1, 1, 64)" in msg
    assert "more" in msg and "missing from the checkpoint: blocks.2.norm1.weight" in msg
    assert len(msg) < 1500  # a summary, not torch's wall of text


def test_unknown_override_is_a_value_error(tmp_path) -> None:
    path = _save_lightning_like(tmp_path / "a.ckpt", _model())
    with pytest.raises(ValueError, match="num_class"):
        load_model(path, num_class=10)


# ---- 3. plain models without Lightning; prefixes; safetensors export -----------------------


@pytest.mark.parametrize("prefix", ["model.", "module.model.", "_orig_mod.", "module._orig_mod."])
def test_wrapper_prefixes_are_stripped(tmp_path, prefix) -> None:
    src = _model(seed=1)
    path = _save_lightning_like(tmp_path / "p.ckpt", src, prefix=prefix)
    model, ckpt = load_model(path)
    assert ckpt["epoch"] == 1 and not model.training
    for key, value in src.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert set(strip_prefixes(ckpt["state_dict"])) == set(src.state_dict())  # metrics dropped


def test_real_lightning_checkpoint_loads_plain(tiny_checkpoint) -> None:
    model, ckpt = load_model(tiny_checkpoint)
    raw = torch.load(tiny_checkpoint, weights_only=True)["state_dict"]
    assert torch.equal(model.head.weight, raw["model.head.weight"])
    assert model.head.out_features == 3 and ckpt["hyper_parameters"]["class_names"]


def test_safetensors_round_trip_is_exact(tiny_checkpoint, tmp_path) -> None:
    from safetensors import safe_open

    out = export_safetensors(tiny_checkpoint, tmp_path / "share" / "tiny.safetensors")
    with safe_open(str(out), framework="pt") as f:
        meta = f.metadata()
    assert json.loads(meta["config"])["num_classes"] == 3
    assert json.loads(meta["class_names"]) == ["bird", "cat", "dog"]
    original, _ = load_model(tiny_checkpoint)
    shared = load_safetensors(out)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(shared(x), original(x))
    fresh = load_weights(VisionTransformer(**json.loads(meta["config"])), out)
    assert torch.equal(fresh.pos_embed, original.pos_embed)


def test_foreign_safetensors_is_refused(tmp_path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="export_safetensors") as err:
        load_safetensors(path)
    assert str(path) in str(err.value)
    (tmp_path / "bad.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"garbage!")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_safetensors(tmp_path / "bad.safetensors")


# ---- 4. another image size ------------------------------------------------------------------


def test_load_at_another_image_size_resizes_positions(tmp_path) -> None:
    path = _save_lightning_like(tmp_path / "s.ckpt", _model(seed=2))
    same, _ = load_model(path)
    same_again, _ = load_model(path, img_size=32)
    assert torch.equal(same.pos_embed, same_again.pos_embed)
    big, _ = load_model(path, img_size=48)
    assert big.pos_embed.shape == (1, 1 + 6 * 6, 32)
    assert torch.equal(big.pos_embed[:, 0], same.pos_embed[:, 0])  # CLS row kept
    assert torch.equal(big.patch_embed.proj.weight, same.patch_embed.proj.weight)
    with torch.no_grad():
        assert big(torch.randn(2, 3, 48, 48)).shape == (2, 3)


def test_sincos_table_is_rebuilt_for_the_new_size(tmp_path) -> None:
    path = tmp_path / "sincos.ckpt"
    src = _model(pos_embed="sincos")
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in src.state_dict().items()},
            "hyper_parameters": {"network": {"preset": "vit_nano", **TINY3, "pos_embed": "sincos"}},
        },
        path,
    )
    big, _ = load_model(path, img_size=64)
    assert torch.equal(big.pos_embed[0], sinusoidal_table(1 + 8 * 8, 32))
    with torch.no_grad():
        assert big(torch.randn(1, 3, 64, 64)).shape == (1, 3)


# ---- 5. timm interop --------------------------------------------------------------------------


def _randomize(module: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.2)


CONFIGS = [
    {},
    {"global_pool": "avg"},
    {"global_pool": "avg", "class_token": False, "qkv_bias": False},
    {"mlp_ratio": 3.0, "num_heads": 4},
    {"pos_embed": "sincos"},
]


@needs_timm
@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda c: ",".join(c) or "default")
def test_to_timm_and_back_agree(overrides) -> None:
    from vit.io.timm_interop import from_timm, to_timm

    ours = _model(**overrides)
    _randomize(ours, seed=3)
    theirs = to_timm(ours)
    assert type(theirs).__module__ == "timm.models.vision_transformer" and not theirs.training
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected = ours(x)  # timm's code sums in its own order
        tol = sum_tol(torch.float32, forward_sums(ours), max(1.0, expected.abs().max()))
        torch.testing.assert_close(theirs(x), expected, rtol=0, atol=tol)
    back = from_timm(theirs)
    for key, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


@needs_timm
@pytest.mark.parametrize("global_pool", ["token", "avg"])
def test_from_timm_agrees(global_pool) -> None:
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    from vit.io.timm_interop import from_timm

    kwargs = dict(img_size=32, patch_size=8, num_classes=5, embed_dim=48, depth=2, num_heads=3)
    theirs = TimmViT(**kwargs, global_pool=global_pool, fc_norm=False).eval()
    _randomize(theirs, seed=4)
    ours = from_timm(theirs)
    assert ours.head.out_features == 5 and len(ours.blocks) == 2
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = theirs(x)  # timm's code sums in its own order
        tol = sum_tol(torch.float32, forward_sums(ours), max(1.0, expected.abs().max()))
        torch.testing.assert_close(ours(x), expected, rtol=0, atol=tol)


@needs_timm
@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"global_pool": "avg"}, "fc_norm"),  # timm's default for avg: norm after pooling
        ({"reg_tokens": 2}, "reg_tokens=2"),
        ({"init_values": 0.1}, "ls1.gamma"),  # layer scale
        ({"global_pool": "max"}, "global_pool='max'"),
    ],
)
def test_from_timm_refuses_what_it_cannot_represent(extra, expected) -> None:
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    from vit.io.timm_interop import from_timm

    theirs = TimmViT(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, **extra)
    with pytest.raises(ValueError, match="cannot be represented|cannot copy") as err:
        from_timm(theirs)
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("option", "refusal"),
    [("lsa", "locality self-attention"), ("spt", "shifted patch tokenization")],
)
def test_lsa_or_spt_model_rebuilds_from_its_checkpoint_and_refuses_timm(
    tmp_path, option: str, refusal: str
) -> None:
    from vit.io.timm_interop import to_timm

    ours = _model(**{option: True})
    with torch.no_grad():  # move every weight off its init (temperatures, the SPT norm's ones)
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / f"{option}.ckpt"
    hp = {"network": {"preset": "vit_nano", **TINY3, option: True}}
    torch.save(
        {
            "state_dict": {"model." + k: v for k, v in ours.state_dict().items()},
            "hyper_parameters": hp,
        },
        path,
    )
    back, _ = load_model(path)
    assert back.blocks[0].attn.lsa == (option == "lsa")
    assert back.patch_embed.spt == (option == "spt")
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(back(x), ours(x))  # the same weights and kernels: bit for bit
    with pytest.raises(ValueError, match=refusal):
        to_timm(ours)


def test_missing_timm_says_how_to_install(monkeypatch) -> None:
    from vit.io.timm_interop import to_timm

    monkeypatch.setitem(sys.modules, "timm", None)
    monkeypatch.setitem(sys.modules, "timm.models.vision_transformer", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[timm\]"'):
        to_timm(_model())


# ---- 6. every message in full: each names the file and says what to pass instead ------------


def test_missing_file_and_directory_say_what_to_pass(tmp_path) -> None:
    missing = tmp_path / "nope.ckpt"
    message = (
        f"checkpoint {str(missing)!r} does not exist. Pass the path of a .ckpt that vit-train "
        "wrote, e.g. runs/quick/version_0/checkpoints/last.ckpt."
    )
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(message)}$"):
        load_checkpoint(missing)
    # load_model also offers the shipped weights' names (tests/test_pretrained.py)
    with pytest.raises(FileNotFoundError, match="does not exist") as err:
        load_model(missing)
    assert str(missing) in str(err.value)
    message = (
        f"{str(tmp_path)!r} is a directory, not a checkpoint file; pass the file inside it, e.g. "
        f"{str(tmp_path) + os.sep + 'last.ckpt'!r} (vit-train writes "
        "version_N/checkpoints/*.ckpt)."
    )
    with pytest.raises(IsADirectoryError, match=f"^{re.escape(message)}$"):
        load_checkpoint(tmp_path)


def test_a_file_holding_no_dict_names_what_it_holds(tmp_path) -> None:
    path = tmp_path / "list.pt"
    torch.save([torch.zeros(2)], path)
    message = (
        f"{str(path)!r} holds a list, not a checkpoint dict; expected a .ckpt from vit-train or a "
        "saved state_dict."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_checkpoint(path)


def test_a_bare_pickle_of_objects_is_not_a_checkpoint(tmp_path) -> None:
    """Weights-only unpickling refuses its object, but the file is no torch.save format at all:
    the message says so rather than listing objects."""
    path = tmp_path / "bare.pkl"
    path.write_bytes(pickle.dumps(fractions.Fraction(1, 3), protocol=2))
    with pytest.raises(ValueError, match=f"^{re.escape(_not_a_checkpoint(path))}$"):
        load_checkpoint(path)


def test_a_file_refused_for_no_named_object_says_unknown(tmp_path) -> None:
    """Refused for something other than a named object (a named one: the test above)."""
    # torch.save's legacy header, then a pickle opcode (INT) the weights-only unpickler refuses
    opcode = tmp_path / "opcode.ckpt"
    opcode.write_bytes(pickle.dumps(torch.serialization.MAGIC_NUMBER, protocol=2) + b"I1\n.")
    assert _refused_names(opcode) == ["unknown"]


def test_weights_only_holds_even_where_the_environment_turns_it_off(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.load's default yields to TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD; load_checkpoint's
    explicit weights_only=True does not, so a hostile file is still refused."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    path = tmp_path / "objects.ckpt"
    torch.save({"a": fractions.Fraction(1, 3)}, path)
    assert _refused_names(path) == ["fractions.Fraction"]


def test_a_checkpoint_saved_on_a_gpu_loads_onto_the_cpu(tmp_path) -> None:
    """A checkpoint trained on CUDA reads on a machine without one (and stays on the CPU where
    there is one). Made here by renaming the storage's device in a CPU save's pickle."""
    cpu = tmp_path / "cpu.ckpt"
    torch.save({"w": torch.arange(3.0)}, cpu)
    gpu = tmp_path / "gpu.ckpt"
    with zipfile.ZipFile(cpu) as src, zipfile.ZipFile(gpu, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                assert b"X\x03\x00\x00\x00cpu" in data  # the storage's location, as pickled
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            dst.writestr(info, data)
    w = load_checkpoint(gpu)["w"]
    assert w.device == torch.device("cpu")
    assert torch.equal(w, torch.arange(3.0))
