"""vit-visualize writes PNGs of the expected size; the callback logs attention to TensorBoard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers import REPO, train_args
from vit.commands.train import train_main
from vit.commands.visualize import run_visualize
from vit.train.callbacks.pictures import AttentionMapLogger


def _size(path: Path) -> tuple[int, int]:
    with Image.open(path) as png:
        assert png.format == "PNG"
        png.load()  # fully decodable
        return png.size


def test_script_writes_pngs_from_dataset_images(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "pictures"
    paths = run_visualize(
        [str(tiny_checkpoint), "--num-images", "3", "--layer", "1", "--output-dir", str(out)]
    )
    names = sorted(p.name for p in paths)
    assert names == sorted(
        ["rollout.png"]
        + [f"heads_layer1_{i}.png" for i in range(3)]
        + [f"layers_heads_{i}.png" for i in range(3)]
    )
    assert _size(out / "rollout.png") == (480, 210 * 3)  # figsize (4.8, 2.1 per image) at 100 dpi
    assert _size(out / "layers_heads_0.png") == (150 * 3, 150 * 2)  # 2 heads + image, 2 layers
    assert _size(out / "heads_layer1_0.png") == (150 * 3, 150)

    before = (out / "rollout.png").read_bytes()
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_visualize([str(tiny_checkpoint), "--num-images", "3", "--output-dir", str(out)])
    assert (out / "rollout.png").read_bytes() == before  # nothing was touched
    run_visualize(
        [
            str(tiny_checkpoint),
            "--num-images",
            "3",
            "--output-dir",
            str(out),
            "--overwrite",
            "--discard-ratio",
            "0.5",
            "--head-fusion",
            "max",
        ]
    )


def test_script_takes_image_files_of_any_size_and_mode(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    rgb = tmp_path / "big.png"
    Image.fromarray(rng.integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(rgb)
    gray = tmp_path / "gray.jpg"
    Image.fromarray(rng.integers(0, 255, (32, 32), dtype=np.uint8)).save(gray)
    out = tmp_path / "files"
    run_visualize([str(tiny_checkpoint), "--images", str(rgb), str(gray), "--output-dir", str(out)])
    assert _size(out / "rollout.png") == (480, 420)
    with pytest.raises(FileNotFoundError, match="missing.png"):
        run_visualize(
            [
                str(tiny_checkpoint),
                "--images",
                str(tmp_path / "missing.png"),
                "--output-dir",
                str(tmp_path / "x"),
            ]
        )


def test_callback_logs_attention_images_to_tensorboard(image_tree: Path, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    callbacks = (
        '[{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint"}, '
        '{"class_path": "vit.train.callbacks.AttentionMapLogger", '
        '"init_args": {"every_n_epochs": 1, "num_images": 2}}]'
    )
    args = train_args(image_tree, tmp_path / "runs", "--trainer.max_epochs=1")
    args = [a for a in args if not a.startswith("--trainer.callbacks")]
    train_main([*args, f"--trainer.callbacks={callbacks}"])
    events = EventAccumulator(str(tmp_path / "runs" / "tiny" / "version_0")).Reload()
    assert {"attention/rollout", "attention/layers_heads_0"} <= set(events.Tags()["images"])
    with pytest.raises(ValueError, match="every_n_epochs=0"):
        AttentionMapLogger(every_n_epochs=0)


def test_figures_stay_outside_pyplot_and_the_backend_is_the_callers(tmp_path: Path) -> None:
    """Scripts writing many figures (vit-visualize, vit-evaluate, plot_curve) keep none open, and
    importing the plots leaves a notebook's backend (its inline pictures) alone."""
    import subprocess
    import sys

    import matplotlib.pyplot as plt
    import torch

    from vit.maps.plots import plot_confusion_matrix, save_figure

    open_before = set(plt.get_fignums())
    fig = plot_confusion_matrix(torch.eye(3, dtype=torch.long), classes=["a", "b", "c"])
    save_figure(fig, tmp_path / "cm.png", dpi=50)
    assert set(plt.get_fignums()) == open_before
    check = "import matplotlib; matplotlib.use('svg'); import vit.maps.plots; "
    check += "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()"
    subprocess.run([sys.executable, "-c", check], check=True, cwd=REPO)
    assert _size(tmp_path / "cm.png")[0] > 0


def _write_pictures(folder: Path, names: list[str], *, size: tuple[int, int] = (32, 32)) -> None:
    rng = np.random.default_rng(1)
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)  # (H, W, 3)
        Image.fromarray(pixels).save(folder / name)


def test_images_may_be_folders_and_the_pictures_name_their_files(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """A folder's images are found as vit-predict finds them (recursively, sorted, hidden files
    and other suffixes left out); each picture's title names its file; sizes read W x H."""
    import logging

    import torch

    import vit
    import vit.maps.plots
    from vit.commands.predict import find_images

    photos = tmp_path / "my_photos"
    _write_pictures(photos, ["b.png", "sub/a.jpg", ".hidden/c.png"])
    _write_pictures(tmp_path, ["wide.png"], size=(48, 40))  # 48 wide, 40 high
    (photos / "notes.txt").write_text("not a picture")
    drawn = {}
    monkeypatch.setattr(
        vit.maps.plots, "save_figure", lambda fig, path, **_: drawn.update({path.name: fig})
    )
    caplog.set_level(logging.INFO, logger="vit.commands.visualize")
    inputs = [photos, tmp_path / "wide.png"]
    run_visualize(
        [str(tiny_checkpoint), "--images", *map(str, inputs), "--output-dir", str(tmp_path / "out")]
    )
    names = [p.name for p in find_images(inputs)]
    assert names == ["b.png", "a.jpg", "wide.png"]
    # the images' column, then the overlays', then a colour bar per overlay (added last)
    axes = drawn["rollout.png"].axes
    rows = [ax.get_title().split("\n")[0] for ax in axes[: 2 * len(names) : 2]]
    assert rows == names
    bars = axes[2 * len(names) :]
    assert [ax.get_ylabel() for ax in bars] == ["share of the map's max"] * len(names)
    assert all(ax.get_ylim() == (0.0, 1.0) for ax in bars)  # each map scaled to its own max
    for i, name in enumerate(names):
        assert drawn[f"layers_heads_{i}.png"].get_suptitle().startswith(f"{name}: pred: ")
        assert drawn[f"heads_layer1_{i}.png"].get_suptitle().startswith(f"{name}: pred: ")
    assert f"resizing {tmp_path / 'wide.png'} from 48x40 to 32x32" in caplog.messages
    # render takes the names with the images, one each
    rollout_titles = [ax.get_title() for ax in axes[: 2 * len(names) : 2]]
    assert all(t.split("\n")[1].startswith("pred: ") for t in rollout_titles)
    model = vit.load_model(tiny_checkpoint)[0]
    with pytest.raises(ValueError, match="2 names for 1 images: give one per image"):
        vit.maps.plots.render(
            model, torch.zeros(1, 3, 32, 32, dtype=torch.uint8), classes=["a"] * 10,
            labels=None, names=["x.png", "y.png"],
        )  # fmt: skip


def test_paths_that_hold_no_images_are_named_in_one_line(
    tiny_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    import os

    from vit.commands.visualize import visualize_main

    empty, notes, pipe = tmp_path / "empty", tmp_path / "notes.txt", tmp_path / "pipe"
    empty.mkdir()
    notes.write_text("not a picture")
    os.mkfifo(pipe)
    cases = {
        empty: f"folder {str(empty)!r} holds no images",
        notes: f"{str(notes)!r} is neither an image nor a folder of images; --images takes",
        pipe: f"{str(pipe)!r} is neither an image nor a folder of images; --images takes",
        tmp_path / "nope": "does not exist",
    }
    for path, message in cases.items():
        with pytest.raises(SystemExit) as exit_:
            visualize_main(
                [str(tiny_checkpoint), "--images", str(path), "--output-dir", str(tmp_path / "out")]
            )
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_val_images_of_weights_trained_on_every_image_are_refused(tmp_path: Path, capsys) -> None:
    """The shipped weights record no data config, so the val split would fall back to 5,000
    images they trained on; their metadata says so, and vit-visualize (and vit-explore, through
    the same draw) refuses as vit-evaluate does."""
    from vit.commands.visualize import visualize_main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        visualize_main(["vit-tiny-d4-cifar10-cpu60", "--split", "val", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert "was trained on the whole training split" in err and "--split test" in err
    assert not out.exists()


@pytest.mark.parametrize("n", [10, 20, 21, 100])
def test_the_confusion_matrix_annotates_small_ones_and_keeps_large_ones_to_a_screen(
    n: int, tmp_path: Path
) -> None:
    """Up to ANNOTATED_CLASSES each cell shows its count; past it (CIFAR-100's 100 classes) no
    counts, a colour bar, every class still named, the figure within LARGEST_SIDE_INCHES."""
    import torch

    from vit.maps.plots import (
        ANNOTATED_CLASSES,
        LARGEST_SIDE_INCHES,
        plot_confusion_matrix,
        save_figure,
    )

    counts = torch.randint(0, 5, (n, n), generator=torch.Generator().manual_seed(n))
    counts[0] = 0  # a class without test images: its row reads zero, not NaN
    classes = [f"class_{i:03d}" for i in range(n)]
    fig = plot_confusion_matrix(counts, classes=classes)
    ax = fig.axes[0]
    shown = torch.from_numpy(np.asarray(ax.images[0].get_array()))
    expected = counts.float() / counts.sum(dim=1, keepdim=True).clamp(min=1)
    assert torch.allclose(shown.float(), expected) and shown[0].eq(0).all()
    assert [t.get_text() for t in ax.get_yticklabels()] == classes
    assert [t.get_text() for t in ax.get_xticklabels()] == classes
    texts = [t.get_text() for t in ax.texts]
    if n <= ANNOTATED_CLASSES:
        assert texts == [str(int(c)) for c in counts.flatten()] and len(fig.axes) == 1
    else:
        assert texts == [] and len(fig.axes) == 2  # the colour bar's axes
        assert fig.axes[1].get_ylabel() == "share of the true class"
        width, height = fig.get_size_inches()
        assert height <= LARGEST_SIDE_INCHES + 1.0 and width <= LARGEST_SIDE_INCHES + 2.0
    save_figure(fig, tmp_path / "cm.png", dpi=120, bbox_inches="tight")  # as vit-evaluate does
    assert max(_size(tmp_path / "cm.png")) <= 120 * (LARGEST_SIDE_INCHES + 2.5)
