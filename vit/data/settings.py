"""The data module's settings checked before anything is read: each bad value a config can hold
gets an error naming the setting and how to fix it (vit/train/datamodule.py calls it)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from vit.data.cifar100_source import LabelKind

SourceKind = Literal["auto", "folder", "cifar10", "cifar100"]


def check_int(name: str, value: Any, *, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        none = " or None" if optional else ""
        raise ValueError(
            f"{name} must be an integer >= {minimum}{none}, got {value!r}; "
            f"fix `{name}` in the data config."
        )


def check_data_settings(settings: dict[str, Any]) -> None:
    """Raise ValueError for the first setting of CIFAR10DataModule's that cannot work."""
    source, labels = settings["source"], settings["cifar100_labels"]
    if source not in get_args(SourceKind):
        raise ValueError(
            f"source must be 'auto', 'folder', 'cifar10' or 'cifar100', got {source!r}; "
            "fix `data.source` (auto finds CIFAR-10 by itself)."
        )
    if labels not in get_args(LabelKind):
        raise ValueError(
            f"cifar100_labels must be 'fine' (100 classes) or 'coarse' (20 superclasses), "
            f"got {labels!r}; fix `data.cifar100_labels`."
        )
    if labels != "fine" and source != "cifar100":
        raise ValueError(
            f"cifar100_labels={labels!r} applies to `data.source: cifar100` only "
            f"(source is {source!r}); set the source or drop the option."
        )
    for name, minimum, optional in (  # the order errors are reported in
        ("image_size", 1, False),
        ("batch_size", 1, False),
        ("val_size", 0, False),
        ("seed", 0, False),
        ("split_seed", 0, True),
        ("num_workers", 0, False),
        ("crop_padding", 0, False),
        ("eval_batch_size", 1, True),
        ("train_subset", 1, True),
    ):
        check_int(name, settings[name], minimum=minimum, optional=optional)
    for name in ("device_data", "compile_augment"):
        if settings[name] and settings["augment_in_loader"]:
            raise ValueError(
                f"{name} augments the training images on the device; augment_in_loader "
                "augments them on the CPU in the loader: choose one."
            )
