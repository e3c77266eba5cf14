"""The Hub's layout (vit/io/hub.py), offline: save_pretrained and from_pretrained round-trip the
logits exactly; the card states the recipe, data, accuracy and command; the shipped weights carry
the same card; broken folders are named; Hub downloads and uploads go through huggingface_hub,
stood in for here by a fake module (no test touches the network)."""

from __future__ import annotations

import json
import types

import pytest
import torch
import yaml

from tests.helpers import REPO, TINY, TINY_DATA_CLASSES, vit_train_checkpoint
from vit.data.datasets import CIFAR10_MEAN, CIFAR10_STD
from vit.io import hub
from vit.io.hub import model_card, push_to_hub, save_pretrained, shipped_card
from vit.io.hub_model import from_pretrained, load_model
from vit.model.vision_transformer import VisionTransformer

NAMES = ["apple", "boat", "cloud"]
MADE = {
    "recipe": "experiments/finetune.yaml",
    "data": "three made-up classes, 12 test images",
    "test_top1": "0.912",
    "command": "vit-train fit -c experiments/finetune.yaml",
}


def tiny(**options: object) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(**{**TINY, "num_classes": 3, **options}).eval()


@pytest.mark.parametrize(
    "options",
    [{}, {"lsa": True, "spt": True}, {"pos_embed": "sincos", "global_pool": "avg"}],
    ids=["plain", "lsa-spt", "sincos-avg"],
)
def test_save_and_load_give_the_same_logits(tmp_path, options) -> None:
    model = tiny(**options)
    folder = save_pretrained(model, tmp_path / "my-vit", class_names=NAMES, metadata=MADE)
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(from_pretrained(folder)(x), model(x))
    again, info = load_model(folder)
    assert torch.equal(again(x), model(x))
    assert info["hyper_parameters"]["class_names"] == NAMES
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == "vit.VisionTransformer" and config["class_names"] == NAMES
    assert config["lsa"] == bool(options.get("lsa")) and config["test_top1"] == "0.912"


def test_the_card_states_recipe_data_accuracy_and_command(tmp_path) -> None:
    card = (
        save_pretrained(tiny(), tmp_path / "my-vit", class_names=NAMES, metadata=MADE) / "README.md"
    ).read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] == "mit" and front["pipeline_tag"] == "image-classification"
    assert "model-index" not in front and "datasets" not in front  # not CIFAR-10: no benchmark
    for row in (
        "| recipe | experiments/finetune.yaml |",
        "| data (test split) | three made-up classes, 12 test images |",
        "| test top-1 | 91.20% |",
        "| command | `vit-train fit -c experiments/finetune.yaml` |",
        "| classes | 3: apple, boat, cloud |",
    ):
        assert row in card, row
    assert 'vit.VisionTransformer.from_pretrained("path/to/my-vit")' in card
    bare = (save_pretrained(tiny(), tmp_path / "bare") / "README.md").read_text()
    assert "| test top-1 | not recorded" in bare and "names not recorded" in bare


def test_the_card_states_the_preprocessing_the_data_module_uses() -> None:
    assert (hub.MEAN, hub.STD) == (CIFAR10_MEAN, CIFAR10_STD)
    card = shipped_card("vit-tiny-d4-cifar10-cpu60")
    assert "(0.4914, 0.4822, 0.4465)" in card and "(0.2470, 0.2435, 0.2616)" in card


def test_the_shipped_weights_carry_the_same_card(tmp_path) -> None:
    name = "vit-tiny-d4-cifar10-cpu60"
    shipped = (REPO / "vit" / "io" / "weights" / f"{name}.md").read_text()
    assert shipped == shipped_card(name)  # regenerate: vit.io.hub.shipped_card(name)
    assert "| test top-1 | 88.28% |" in shipped and "| recipe | experiments/cpu60.yaml |" in shipped
    folder = save_pretrained(name, tmp_path / name)
    assert (folder / "README.md").read_text() == shipped
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(from_pretrained(folder)(x), load_model(name)[0](x))


def test_a_checkpoint_saves_with_its_class_names_and_data(tmp_path) -> None:
    ckpt = vit_train_checkpoint(tmp_path / "last.ckpt")
    folder = save_pretrained(ckpt, tmp_path / "from-ckpt", metadata={"test_top1": "0.5"})
    config = json.loads((folder / "config.json").read_text())
    assert config["class_names"] == list(TINY_DATA_CLASSES) and config["weights"] == "live"
    assert config["data"] == f"folder source at {tmp_path}"
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(from_pretrained(folder)(x), load_model(ckpt)[0](x))


def test_bad_folders_and_arguments_are_named(tmp_path) -> None:
    folder = save_pretrained(tiny(), tmp_path / "ok", class_names=NAMES)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_pretrained(tiny(), folder)
    save_pretrained(tiny(), folder, overwrite=True)
    with pytest.raises(ValueError, match="2 class_names given for a model with 3 outputs"):
        save_pretrained(tiny(), tmp_path / "x", class_names=["a", "b"])
    with pytest.raises(ValueError, match=r"metadata keys \['config', 'test_top1'\]"):
        save_pretrained(tiny(), tmp_path / "y", metadata={"test_top1": 0.9, "config": "{}"})

    (tmp_path / "empty").mkdir()
    with pytest.raises(IsADirectoryError, match="not one save_pretrained wrote") as refused:
        from_pretrained(tmp_path / "empty")
    assert "Pass a checkpoint file (e.g. runs/NAME/version_0/" in str(refused.value)
    run = tmp_path / "runs" / "tiny" / "version_0"  # a run folder given for its weights
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    for given in (run, run / "checkpoints"):
        with pytest.raises(IsADirectoryError, match="run's checkpoints: pass ") as refused:
            from_pretrained(given)
        assert repr(str(run / "checkpoints" / "last.ckpt")) in str(refused.value)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        from_pretrained(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"format": "timm", "config": {}}))
    with pytest.raises(ValueError, match="does not describe a vit model"):
        from_pretrained(folder)


def test_weights_that_do_not_fit_the_config_are_named(tmp_path) -> None:
    folder = save_pretrained(tiny(), tmp_path / "ok", class_names=NAMES)
    config = json.loads((folder / "config.json").read_text())
    config["depth"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing from the checkpoint: blocks.2"):
        from_pretrained(folder)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch) -> types.SimpleNamespace:
    """huggingface_hub stood in for: downloads come from a local folder, uploads are recorded."""
    calls = types.SimpleNamespace(downloads=[], uploads=[], repos=[])
    source = save_pretrained(tiny(), tmp_path / "on-the-hub", class_names=NAMES)

    def snapshot_download(repo_id: str, **kwargs: object) -> str:
        calls.downloads.append((repo_id, kwargs))
        if repo_id == "someone/absent":
            raise OSError("404 Client Error: Repository Not Found for url\nmore detail")
        return str(source)

    class HfApi:
        def __init__(self, token: str | None = None) -> None:
            self.token = token

        def create_repo(self, repo_id: str, **kwargs: object) -> str:
            calls.repos.append((repo_id, kwargs, self.token))
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, **kwargs: object) -> None:
            calls.uploads.append(kwargs)

    import huggingface_hub
    import huggingface_hub.hub_mixin

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "HfApi", HfApi)
    monkeypatch.setattr(huggingface_hub.hub_mixin, "HfApi", HfApi)  # model.push_to_hub's
    return calls


def test_a_hub_repository_loads_by_its_id(fake_hub, tmp_path) -> None:
    x = torch.randn(2, 3, 32, 32)
    want = tiny()(x)
    assert torch.equal(from_pretrained("someone/tiny-vit")(x), want)  # the Hub's convention
    assert torch.equal(load_model("hf-hub:someone/tiny-vit")[0](x), want)  # timm's prefix
    assert [repo for repo, _ in fake_hub.downloads] == ["someone/tiny-vit"] * 2
    assert set(fake_hub.downloads[0][1]["allow_patterns"]) == {
        "config.json",
        "model.safetensors",
        "README.md",
    }
    with pytest.raises(ValueError, match="not a Hub repository id"):
        load_model("hf-hub:no-owner")
    with pytest.raises(ValueError, match=r"could not download 'someone/absent' .*\(404 Client"):
        from_pretrained("someone/absent")  # a mistyped local folder reads the same


def test_push_to_hub_uploads_the_three_files(fake_hub, tmp_path) -> None:
    folder = save_pretrained(tiny(), tmp_path / "mine", class_names=NAMES)
    url = push_to_hub(folder, "me/tiny-vit", token="t0ken", private=True)
    assert url == "https://huggingface.co/me/tiny-vit"
    assert fake_hub.repos == [("me/tiny-vit", {"private": True, "exist_ok": True}, "t0ken")]
    (upload,) = fake_hub.uploads
    assert upload["repo_id"] == "me/tiny-vit" and upload["folder_path"] == str(folder)
    assert upload["allow_patterns"] == ["config.json", "model.safetensors", "README.md"]
    with pytest.raises(ValueError, match="expected owner/name"):
        push_to_hub(folder, "tiny-vit")
    (tmp_path / "other").mkdir()
    with pytest.raises(IsADirectoryError, match="not one save_pretrained wrote"):
        push_to_hub(tmp_path / "other", "me/other")
    assert len(fake_hub.uploads) == 1  # nothing uploaded for the bad calls


def test_model_card_is_markdown_with_front_matter() -> None:
    meta = {"format": "vit.VisionTransformer", "config": json.dumps({**TINY, "mlp_ratio": 2.0})}
    card = model_card(meta, name="x", num_params=1234)
    front, body = card.split("---\n")[1:3]
    assert "library_name: vit" in front and body.lstrip().startswith("# x")
    assert "| parameters | 0.00 M |" in card and "10, names not recorded (labels 0 to 9)" in card
