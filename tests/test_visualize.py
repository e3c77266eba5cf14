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
    assert _size(out / "rollout.png") == (420, 210 * 3)  # figsize (4.2, 2.1 per image) at 100 dpi
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
    assert _size(out / "rollout.png") == (420, 420)
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
