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
from tests.helpers import TINY, recorded_test_metrics, vit_train_checkpoint
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
    assert handed["load_model(shipped)"].card_metadata["test_top1"] == str(
        recorded_test_metrics()["top1"]
    )
    assert handed["load_model(.ckpt)"].card_metadata["weights"] == "live"
    x = torch.randn(2, 3, 32, 32)
    plain = vit.io.load.load_model(SHIPPED)[0]  # the plain class, the same numbers
    assert type(plain) is vision_transformer.VisionTransformer
    assert torch.equal(plain(x), handed["from_pretrained(shipped)"](x))


def test_a_timm_model_converts_to_the_hub_class(tmp_path: Path) -> None:
    timm = pytest.importorskip("timm")
    source = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, num_classes=10, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0
    ).eval()
    model = vit.from_timm(source)
    assert type(model) is vit.VisionTransformer
    model.save_pretrained(tmp_path / "from-timm")
    x = torch.randn(2, 3, 32, 32)
    again = vit.VisionTransformer.from_pretrained(tmp_path / "from-timm")
    assert torch.equal(again(x), model(x))


def test_a_folder_of_the_older_layout_loads(tmp_path: Path) -> None:
    model = tiny()
    folder = save_pretrained(model, tmp_path / "old")  # the weights file's format is unchanged
    # config.json as vit wrote it before 2026-11-28, by hand: the arguments nested in "config"
    older = {
        "format": "vit.VisionTransformer",
        "config": {
            **{"img_size": 32, "patch_size": 8, "in_chans": 3, "num_classes": 10},
            **{"embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0, "qkv_bias": True},
            **{"class_token": True, "global_pool": "token", "pos_embed": "learned"},
            **{"lsa": True, "spt": False},
        },
        "class_names": NAMES,
        "recipe": "experiments/finetune.yaml",
        "test_top1": "0.912",
    }
    (folder / "config.json").write_text(json.dumps(older, indent=2))
    again = vit.VisionTransformer.from_pretrained(folder)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(again(x), model(x)) and again.class_names == NAMES
    assert again.card_metadata == {"recipe": "experiments/finetune.yaml", "test_top1": "0.912"}
    again.save_pretrained(tmp_path / "new")  # saved again: the new layout, the same model
    config = json.loads((tmp_path / "new" / "config.json").read_text())
    assert "config" not in config and config["lsa"] is True and config["test_top1"] == "0.912"


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
            cards.append((Path(folder_path) / "README.md").read_text())
            uploads.append((repo_id, files, config["class_names"], self.token))
            return f"https://huggingface.co/{repo_id}/commit/0"

    cards: list[str] = []
    monkeypatch.setattr(huggingface_hub.hub_mixin, "HfApi", HfApi)
    model = tiny()
    model.class_names = NAMES
    model.push_to_hub("me/tiny-vit", token="t0k")
    assert uploads == [
        ("me/tiny-vit", ["README.md", "config.json", "model.safetensors"], NAMES, "t0k")
    ]
    # the uploaded card tells its readers to load the repository, not a folder of the uploader's
    assert 'vit.VisionTransformer.from_pretrained("me/tiny-vit")' in cards[0]
    assert "vit-predict hf-hub:me/tiny-vit photo.jpg" in cards[0] and "path/to" not in cards[0]
    model.push_to_hub("tiny-vit")  # no owner yet (the Hub adds it): the card names no repository
    assert 'from_pretrained("path/to/tiny-vit")' in cards[1]
    model.save_pretrained(tmp_path / "later")  # after a push, a folder's card is a folder's again
    assert 'from_pretrained("path/to/later")' in (tmp_path / "later" / "README.md").read_text()


def test_the_cards_header_is_what_the_hub_reads(tmp_path: Path) -> None:
    front = yaml.safe_load(shipped_card(SHIPPED).split("---\n")[1])
    assert front["library_name"] == "vit" and front["datasets"] == ["cifar10"]
    ((index,),) = [entry["results"] for entry in front["model-index"]]
    assert index["dataset"] == {"name": "CIFAR-10", "type": "cifar10", "split": "test"}
    assert (
        index["metrics"][0]["type"] == "accuracy"
        and index["metrics"][0]["value"] == recorded_test_metrics()["top1"]
    )
    tuned = save_pretrained(
        tiny(), tmp_path / "tuned",
        metadata={"init_from": "hf-hub:owner/base-vit", "data": "CIFAR-10 train", "test_top1": "0.9"},
    )  # fmt: skip
    front = yaml.safe_load((tuned / "README.md").read_text().split("---\n")[1])
    assert front["base_model"] == "owner/base-vit"
    local = save_pretrained(tiny(), tmp_path / "local", metadata={"init_from": "runs/x.ckpt"})
    assert "base_model" not in yaml.safe_load((local / "README.md").read_text().split("---\n")[1])


def test_a_fine_tunes_card_names_the_base_its_checkpoint_records(tmp_path: Path) -> None:
    """vit-train records --model.init_from in the checkpoint's hyper_parameters; from there it
    reaches the card's base_model, through vit.load_model's model and through the function."""
    ckpt = vit_train_checkpoint(tmp_path / "tuned.ckpt")
    saved = torch.load(ckpt, weights_only=True)
    saved["hyper_parameters"]["init_from"] = "hf-hub:owner/base-vit"
    torch.save(saved, ckpt)
    model, _ = vit.load_model(ckpt)
    model.save_pretrained(tmp_path / "method")
    save_pretrained(ckpt, tmp_path / "function")
    for folder in ("method", "function"):
        card = (tmp_path / folder / "README.md").read_text()
        assert yaml.safe_load(card.split("---\n")[1])["base_model"] == "owner/base-vit", folder
        assert "| started from | hf-hub:owner/base-vit |" in card, folder


def test_bad_folders_are_named(tmp_path: Path) -> None:
    folder = save_pretrained(tiny(), tmp_path / "ok")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "embed_dimm": 64}))
    with pytest.raises(ValueError, match=r"\['embed_dimm'\] are not VisionTransformer arguments"):
        vit.VisionTransformer.from_pretrained(folder)
    # a string value would pass for a note: its closeness to an argument's name gives it away
    (folder / "config.json").write_text(json.dumps({**config, "global_pol": "avg"}))
    with pytest.raises(ValueError, match="'global_pol': did you mean 'global_pool'"):
        vit.VisionTransformer.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(
        ValueError, match=r"keys \['architectures'\] are another library's\. Load it with"
    ):
        vit.VisionTransformer.from_pretrained(folder)
    (folder / "config.json").unlink()
    with pytest.raises(IsADirectoryError, match=re.escape("expected config.json and model.")):
        vit.VisionTransformer.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"metadata keys \['depth'\]"):
        save_pretrained(tiny(), tmp_path / "x", metadata={"depth": "3"})  # an argument's name
    with pytest.raises(ValueError, match="repo_id 'no-owner': expected owner/name"):
        save_pretrained(tiny(), tmp_path / "z", repo_id="no-owner")  # the card would name it
    model = tiny()
    model.card_metadata = {"kernal": "fused"}  # would read back as a misspelt argument
    with pytest.raises(ValueError, match=r"metadata keys \['kernal'\]"):
        model.save_pretrained(tmp_path / "y")


def test_generate_model_card_is_the_card_save_pretrained_writes(tmp_path: Path) -> None:
    model = tiny()
    model.class_names, model.card_metadata = NAMES, {"data": "CIFAR-10", "test_top1": "0.9"}
    model.save_pretrained(tmp_path / "my-vit")
    card = model.generate_model_card(name="my-vit")
    assert str(card) == (tmp_path / "my-vit" / "README.md").read_text()
    # the header holds all the mixin was told in the class statement, and the mixin's own tag
    told = vit.VisionTransformer._hub_mixin_info.model_card_data.to_dict()
    assert told["library_name"] == "vit" and "model_hub_mixin" in told["tags"]
    assert {k: card.data.to_dict()[k] for k in told} == told
    assert card.data.eval_results[0].metric_value == 0.9  # the model-index, read back
