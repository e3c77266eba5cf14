"""vit-inspect: its JSON holds vit.maps.inspection's numbers for the model and images given, its
figures are labelled, a run's snapshots make the training strip in step order, and bad input is
refused before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import (
    REPO,
    TINY,
    forward_sums,
    sum_tol,
    train_args,
    write_image_tree,
    write_safetensors,
)
from vit.commands.inspect_model import inspect_main, run_inspect
from vit.commands.visualize import load_image_files
from vit.data.datasets import preprocess
from vit.maps.capture import patch_grid
from vit.maps.inspect_plots import (
    filter_mosaic,
    plot_attention_distance,
    plot_filter_components,
    plot_position_similarity,
    plot_training_strip,
    similarity_mosaic,
)
from vit.maps.inspection import (
    filter_components,
    mean_attention_distance,
    patch_distances,
    position_similarity,
)
from vit.model.vision_transformer import VisionTransformer

CLASSES = [f"class {k}" for k in range(10)]
ROUNDING = 0.5e-6  # the JSON keeps 6 decimals


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "patch_size": 4, "spt": True})
    return write_safetensors(model, tmp_path / "tiny.safetensors", class_names=CLASSES)


@pytest.fixture
def picture_files(tmp_path: Path) -> list[Path]:
    from PIL import Image

    paths = []
    for i in range(3):
        paths.append(tmp_path / f"picture{i}.png")
        pixels = torch.randint(0, 256, (32, 32, 3), generator=torch.Generator().manual_seed(i))
        Image.fromarray(pixels.to(torch.uint8).numpy()).save(paths[-1])
    return paths


def _close(got, expected: torch.Tensor, *, atol: float = ROUNDING) -> None:
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64), expected.double(), rtol=0, atol=atol
    )


def test_the_json_holds_the_numbers_of_vit_maps(weights, picture_files, tmp_path) -> None:
    out = tmp_path / "inspect"
    args = [str(weights), "--images", *map(str, picture_files), "--output-dir", str(out)]
    paths = run_inspect([*args, "--components", "5"])
    assert [p.name for p in paths] == [
        "attention_distance.png",
        "filters.png",
        "positions.png",
        "inspect.json",
    ]
    numbers = json.loads((out / "inspect.json").read_text())
    import vit

    model = vit.load_model(weights)[0]
    x = preprocess(load_image_files(picture_files, size=32))
    distance = mean_attention_distance(model, x)
    comps, ratio = filter_components(model, k=5)
    assert numbers["images"] == 3 and numbers["grid"] == [8, 8] and numbers["patch_size"] == 4
    _close(numbers["attention_distance"]["pixels"], distance.pixels)
    _close(numbers["attention_distance"]["patches"], distance.patches)
    _close(numbers["attention_distance"]["cls_share"], distance.cls_share)
    assert numbers["attention_distance"]["uniform_pixels"] == pytest.approx(
        distance.uniform * 4, abs=ROUNDING
    )
    _close(numbers["filters"]["explained_variance_ratio"], ratio)
    _close(numbers["filters"]["components"], comps)
    assert torch.tensor(numbers["filters"]["components"]).shape == (5, 5, 3, 4, 4)
    _close(numbers["positions"]["cosine_similarity"], position_similarity(model))
    from PIL import Image

    for path in paths[:3]:
        with Image.open(path) as png:
            assert png.format == "PNG" and min(png.size) > 300  # drawn, not an empty canvas


def test_an_existing_output_is_kept_unless_overwrite(weights, picture_files, tmp_path) -> None:
    out = tmp_path / "inspect"
    args = [str(weights), "--images", *map(str, picture_files), "--output-dir", str(out)]
    run_inspect(args)
    (out / "inspect.json").write_text("mine")
    with pytest.raises(FileExistsError, match=r"4 file\(s\) would be overwritten.*--overwrite"):
        run_inspect(args)
    assert (out / "inspect.json").read_text() == "mine"
    run_inspect([*args, "--overwrite"])
    assert json.loads((out / "inspect.json").read_text())["images"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-images", "0"], "--num-images=0 must be at least 1."),
        (["--components", "0"], "--components=0 must be at least 1."),
        (["--strip-images", "-1"], "--strip-images=-1 must be at least 1."),
    ],
)
def test_counts_below_one_are_refused(weights, tmp_path, capsys, args, message) -> None:
    with pytest.raises(SystemExit) as exit_:
        inspect_main([str(weights), *args, "--output-dir", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_folder_without_checkpoints_and_missing_files_are_named(tmp_path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"holds no \.ckpt files"):
        run_inspect([str(empty), "--output-dir", str(tmp_path / "out")])
    with pytest.raises(FileNotFoundError, match=re.escape("'nope.ckpt'")):
        run_inspect(["nope.ckpt", str(empty), "--output-dir", str(tmp_path / "out")])


def test_a_folder_of_two_runs_asks_for_one(tmp_path) -> None:
    for run in ("version_0", "version_1"):
        (tmp_path / "runs" / run).mkdir(parents=True)
        (tmp_path / "runs" / run / "last.ckpt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"checkpoints of 2 runs.*pass one run's folder"):
        run_inspect([str(tmp_path / "runs"), "--output-dir", str(tmp_path / "out")])


def test_the_figures_label_their_axes_and_units(weights) -> None:
    import vit

    model = vit.load_model(weights)[0]
    distance = mean_attention_distance(model, torch.randn(2, 3, 32, 32))
    ax = plot_attention_distance(distance).axes[0]
    assert ax.get_xlabel() == "network depth (layer)"
    # layers numbered from 0, as the maps' "layer 0" rows and inspect.json's first row name them
    assert [int(t) for t in ax.get_xticks()] == list(range(TINY["depth"]))
    assert {round(float(x)) for c in ax.collections for x in c.get_offsets()[:, 0]} == set(
        range(TINY["depth"])
    )
    assert ax.get_ylabel() == "mean attention distance (pixels)"
    assert len(ax.collections) == TINY["num_heads"]  # one marker set per head
    assert len({c.get_paths()[0].vertices.tobytes() for c in ax.collections}) == 2  # shapes differ
    positions = plot_position_similarity(position_similarity(model), (8, 8))
    assert positions.axes[0].get_xlabel() == "input patch column"
    assert positions.axes[1].get_ylabel() == "cosine similarity"  # the colour bar
    comps, ratio = filter_components(model, k=3)
    titles = [a.get_title() for a in plot_filter_components(comps, ratio).axes if a.get_title()]
    assert titles == [f"PC{i + 1}: {float(r):.1%}" for i, r in enumerate(ratio)]
    for fig in (positions,):
        assert any("Dosovitskiy" in t.get_text() for t in fig.texts)  # the caption


def test_the_captions_say_whether_a_cls_token_was_left_out() -> None:
    def caption(fig) -> str:
        return " ".join(t.get_text() for t in fig.texts)

    x = torch.randn(2, 3, 32, 32)
    for model, cls in [
        (VisionTransformer(**TINY), True),
        (VisionTransformer(**TINY, class_token=False, global_pool="avg"), False),
    ]:
        distance = mean_attention_distance(model, x)
        assert distance.num_prefix_tokens == int(cls)
        text = caption(plot_attention_distance(distance))
        assert ("weight on the CLS token left out" in text) is cls
        assert ("no CLS token" in text) is not cls
        g = patch_grid(model)[0]
        strip = plot_training_strip(
            torch.zeros(3, 32, 32, dtype=torch.uint8),
            torch.rand(2, g, g),
            torch.rand(2, 2, g, g),
            labels=["step 1", "step 2"],
            num_prefix_tokens=int(cls),
        )
        assert ("what the CLS token attends to" in caption(strip)) is cls
        assert ("the mean of the patch queries" in caption(strip)) is not cls


def test_mosaics_place_each_map_and_scale_each_component() -> None:
    sim = torch.arange(16.0).reshape(4, 4)  # grid (2, 2): position p's map is row p
    mosaic = similarity_mosaic(sim, (2, 2))
    assert mosaic.shape == (5, 5)
    assert torch.equal(mosaic[3:5, 0:2], sim[2].reshape(2, 2).double())  # position (1, 0)
    assert torch.isnan(mosaic[2]).all() and torch.isnan(mosaic[:, 2]).all()
    comps = torch.stack([torch.full((5, 3, 2, 2), v) for v in (1.0, -1.0)])
    comps[0, 4, 0, 1, 1] = 3.0  # the left-up copy's corner: the component's maximum
    tiles = filter_mosaic(comps)
    assert tiles.shape == (2, 2, 14, 3)
    assert tiles[0, 1, 13, 0] == 1.0 and tiles[0, 0, 0, 0] == 0.0  # scaled to its own range
    assert torch.equal(tiles[:, :, 2], torch.ones(2, 2, 3))  # the white gap between copies


@pytest.mark.slow
def test_a_run_of_the_quick_recipe_makes_the_strip_in_step_order(tmp_path) -> None:
    from vit.commands.train import train_main

    recipe = yaml.safe_load((REPO / "experiments" / "quick.yaml").read_text())
    snapshots = [
        c
        for c in recipe["trainer"]["callbacks"]
        if c["class_path"].endswith("ModelCheckpoint") and c["init_args"].get("save_top_k") == -1
    ]
    assert len(snapshots) == 1, "quick.yaml keeps snapshots for the strip"
    snapshot = {**snapshots[0], "init_args": {**snapshots[0]["init_args"]}}
    snapshot["init_args"]["every_n_train_steps"] = 2  # the recipe's callback, at this run's scale
    runs = tmp_path / "runs"
    train_main(
        train_args(
            write_image_tree(tmp_path / "tiny"),
            runs,
            f"--trainer.callbacks+={json.dumps(snapshot)}",
        )
    )
    run = runs / "tiny" / "version_0"
    names = sorted(p.name for p in run.rglob("*.ckpt"))
    assert {"step-00002.ckpt", "step-00004.ckpt", "last.ckpt"} <= set(names)
    out = tmp_path / "strip"
    paths = run_inspect(
        [str(run), "--strip-images", "2", "--num-images", "4", "--output-dir", str(out)]
    )
    assert [p.name for p in paths] == [
        "strip_0.png",
        "strip_1.png",
        "distance_over_training.png",
        "inspect.json",
    ]
    numbers = json.loads((out / "inspect.json").read_text())
    steps = [c["step"] for c in numbers["checkpoints"]]
    assert steps == sorted(set(steps)) and steps[0] == 2 and 4 in steps  # best and last too
    assert len(numbers["attention_distance_pixels"]) == len(steps)
    first = run / "checkpoints" / "step-00002.ckpt"
    one = run_checkpoint_distance(first, tmp_path)
    # both rounded to 6 decimals, from float32 forwards of other batches: each weight is off by
    # up to the forward's sums' bound, and a distance weighs them by at most the grid's diagonal
    import vit

    model = vit.load_model(first)[0]
    diagonal = float(patch_distances(patch_grid(model)).max()) * model.patch_embed.patch_size
    tol = 2 * ROUNDING + sum_tol(torch.float32, forward_sums(model), diagonal)
    _close(numbers["attention_distance_pixels"][0], one, atol=tol)


def run_checkpoint_distance(ckpt: Path, tmp_path: Path) -> torch.Tensor:
    """The same checkpoint through the one-model path: its attention distance in pixels."""
    out = tmp_path / "one"
    run_inspect([str(ckpt), "--num-images", "4", "--output-dir", str(out)])
    return torch.tensor(
        json.loads((out / "inspect.json").read_text())["attention_distance"]["pixels"]
    )


def test_one_checkpoint_is_not_a_strip(tmp_path, weights) -> None:
    with pytest.raises(ValueError, match=r"takes vit-train \.ckpt files"):
        run_inspect([str(weights), str(weights), "--output-dir", str(tmp_path / "out")])


def test_one_step_twice_is_not_a_strip(tmp_path) -> None:
    from tests.helpers import vit_train_checkpoint

    ckpt = vit_train_checkpoint(tmp_path / "last.ckpt")
    with pytest.raises(ValueError, match=r"found 1 distinct checkpoint .*a strip needs at least 2"):
        run_inspect([str(ckpt), str(ckpt), "--output-dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_checkpoints_of_two_architectures_are_refused_before_any_work(
    tmp_path, picture_files, capsys
) -> None:
    """Two runs' checkpoints (depth 2 and depth 1) cannot make one strip: one line names both
    and what differs, exit 2, where the maps of other depths used to fail to stack."""
    from tests.helpers import tiny_classifier, vit_train_checkpoint

    a = vit_train_checkpoint(tmp_path / "a.ckpt")  # depth 2, step 12
    other = tiny_classifier(network={"num_classes": 3, "depth": 1})
    ckpt = torch.load(a, weights_only=True)
    ckpt.update(global_step=24, state_dict=other.state_dict(), hyper_parameters=dict(other.hparams))
    b = tmp_path / "b.ckpt"
    torch.save(ckpt, b)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        inspect_main(
            [str(a), str(b), "--images", *map(str, picture_files), "--output-dir", str(out)]
        )
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert (
        f"{a} and {b} are not checkpoints of one run: their networks differ (depth 2 vs 1)" in err
    )
    assert not out.exists()


def test_images_may_be_a_folder(weights, picture_files, tmp_path) -> None:
    folder = tmp_path / "pictures"
    folder.mkdir()
    for picture in picture_files:
        picture.rename(folder / picture.name)
    run_inspect([str(weights), "--images", str(folder), "--output-dir", str(tmp_path / "out")])
    assert json.loads((tmp_path / "out" / "inspect.json").read_text())["images"] == 3
