"""vit.VisionTransformer in the Hugging Face Hub's conventions (vit/io/hub_model.py), offline:
save_pretrained / from_pretrained as methods round-trip bitwise, every model the package hands
out has them, folders of the older layout load, the download options reach huggingface_hub, the
card's header is what the Hub reads, and bad folders are named."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
import torch
import yaml

import vit
from tests.helpers import TINY, vit_train_checkpoint
from vit.io.hub import save_pretrained, shipped_card
from vit.model import vision_transformer

NAMES = [f"class {k}" for k in range(10)]
SHIPPED = "vit-tiny-d4-cifar10-cpu60"


def tiny() -> vit.VisionTransformer:
    torch.manual_seed(0)
    return vit.VisionTransformer(**{**TINY, "lsa": True}).eval()


def test_the_methods_round_trip_bitwise_and_carry_the_class_names(tmp_path: Path) -> None:
    model = tiny()
    model.class_names = NAMES
    model.save_pretrained(tmp_path / "mine")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    again = vit.VisionTransformer.from_pretrained(tmp_path / "mine")
    x = torch.randn(3, 3, 32, 32)
    assert type(again) is vit.VisionTransformer and not again.training
    assert torch.equal(again(x), model(x)) and again.class_names == NAMES
    config = json.loads((tmp_path / "mine" / "config.json").read_text())
    # the constructor's arguments at the top level, as ModelHubMixin reads a config
    assert config["embed_dim"] == TINY["embed_dim"] and config["lsa"] is True
    assert "config" not in config and config["format"] == "vit.VisionTransformer"
    model.save_pretrained(tmp_path / "mine")  # again: replaced, as the Hub's libraries do
    wider = vit.VisionTransformer.from_pretrained(tmp_path / "mine", img_size=48)
    assert wider.patch_embed.img_size == 48  # a keyword replaces a constructor argument


def test_every_model_handed_out_has_the_methods(tmp_path: Path) -> None:
    ckpt = vit_train_checkpoint(tmp_path / "last.ckpt")
    safetensors = vit.export_safetensors(ckpt, tmp_path / "m.safetensors")
    handed = {
        "create_model": vit.create_model("vit_nano"),
        "load_model(.ckpt)": vit.load_model(ckpt)[0],
        "load_model(.safetensors)": vit.load_model(safetensors)[0],
        "load_model(shipped)": vit.load_model(SHIPPED)[0],
        "from_pretrained(shipped)": vit.from_pretrained(SHIPPED),
    }
    for where, model in handed.items():
        assert isinstance(model, vision_transformer.VisionTransformer), where
        for method in ("save_pretrained", "push_to_hub", "from_pretrained"):
            assert callable(getattr(model, method)), (where, method)
    assert handed["load_model(shipped)"].class_names[:2] == ["airplane", "automobile"]
    assert handed["load_model(shipped)"].card_metadata["test_top1"] == "0.8529"
    assert handed["load_model(.ckpt)"].card_metadata["weights"] == "live"
    x = torch.randn(2, 3, 32, 32)
    plain = vit.io.load.load_model(SHIPPED)[0]  # the plain class, the same numbers
    assert type(plain) is vision_transformer.VisionTransformer
    assert torch.equal(plain(x), handed["from_pretrained(shipped)"](x))


def test_a_folder_of_the_older_layout_loads(tmp_path: Path) -> None:
    model = tiny()
    folder = save_pretrained(model, tmp_path / "old", class_names=NAMES)
    config = json.loads((folder / "config.json").read_text())
    arguments = {k: config.pop(k) for k in list(config) if k in vit.io.hub_folder.ARGUMENTS}
    (folder / "config.json").write_text(json.dumps({**config, "config": arguments}))  # nested
    again = vit.VisionTransformer.from_pretrained(folder)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(again(x), model(x)) and again.class_names == NAMES


def test_the_download_options_reach_huggingface_hub(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub

    folder = save_pretrained(tiny(), tmp_path / "on-the-hub", class_names=NAMES)
    calls = []

    def snapshot_download(repo_id: str, **kwargs: object) -> str:
        calls.append((repo_id, kwargs))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    model = vit.VisionTransformer.from_pretrained(
        "owner/tiny", revision="v1", token="t0k", cache_dir=tmp_path / "c",
        local_files_only=True, force_download=True,
    )  # fmt: skip
    assert model.class_names == NAMES
    ((repo, kwargs),) = calls
    assert repo == "owner/tiny"
    assert {k: kwargs[k] for k in ("revision", "token", "local_files_only", "force_download")} == {
        "revision": "v1",
        "token": "t0k",
        "local_files_only": True,
        "force_download": True,
    }
    assert kwargs["cache_dir"] == str(tmp_path / "c")


def test_push_to_hub_uploads_what_save_pretrained_writes(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub.hub_mixin

    uploads = []

    class HfApi:
        def __init__(self, token: object = None) -> None:
            self.token = token

        def create_repo(self, repo_id: str, **kwargs: object) -> object:
            return types.SimpleNamespace(repo_id=repo_id)

        def upload_folder(self, *, repo_id: str, folder_path: str, **kwargs: object) -> str:
            files = sorted(p.name for p in Path(folder_path).iterdir())
            config = json.loads((Path(folder_path) / "config.json").read_text())
            uploads.append((repo_id, files, config["class_names"], self.token))
            return f"https://huggingface.co/{repo_id}/commit/0"

    monkeypatch.setattr(huggingface_hub.hub_mixin, "HfApi", HfApi)
    model = tiny()
    model.class_names = NAMES
    model.push_to_hub("me/tiny-vit", token="t0k")
    assert uploads == [
        ("me/tiny-vit", ["README.md", "config.json", "model.safetensors"], NAMES, "t0k")
    ]


def test_the_cards_header_is_what_the_hub_reads(tmp_path: Path) -> None:
    front = yaml.safe_load(shipped_card(SHIPPED).split("---\n")[1])
    assert front["library_name"] == "vit" and front["datasets"] == ["cifar10"]
    ((index,),) = [entry["results"] for entry in front["model-index"]]
    assert index["dataset"] == {"name": "CIFAR-10", "type": "cifar10", "split": "test"}
    assert index["metrics"][0]["type"] == "accuracy" and index["metrics"][0]["value"] == 0.8529
    tuned = save_pretrained(
        tiny(), tmp_path / "tuned",
        metadata={"init_from": "hf-hub:owner/base-vit", "data": "CIFAR-10 train", "test_top1": "0.9"},
    )  # fmt: skip
    front = yaml.safe_load((tuned / "README.md").read_text().split("---\n")[1])
    assert front["base_model"] == "owner/base-vit"
    local = save_pretrained(tiny(), tmp_path / "local", metadata={"init_from": "runs/x.ckpt"})
    assert "base_model" not in yaml.safe_load((local / "README.md").read_text().split("---\n")[1])


def test_bad_folders_are_named(tmp_path: Path) -> None:
    folder = save_pretrained(tiny(), tmp_path / "ok")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "embed_dimm": 64}))
    with pytest.raises(ValueError, match=r"\['embed_dimm'\] are not VisionTransformer arguments"):
        vit.VisionTransformer.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match="does not describe a vit model"):
        vit.VisionTransformer.from_pretrained(folder)
    (folder / "config.json").unlink()
    with pytest.raises(IsADirectoryError, match=re.escape("not one save_pretrained wrote")):
        vit.VisionTransformer.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"metadata keys \['depth'\]"):
        save_pretrained(tiny(), tmp_path / "x", metadata={"depth": "3"})  # an argument's name
