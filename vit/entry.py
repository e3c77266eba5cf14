"""The console commands' targets: process-wide switches first, then the command.

MKL's AVX2 kernels on AMD CPUs (vit/mkl_amd.py) only switch on before torch loads, so this module
imports no torch and nothing that does: each target switches, then imports its command. `python -m
vit.entry` is vit-train (how DDP relaunches it). VIT_MKL_AVX2=0 leaves MKL as torch ships it.
"""

from __future__ import annotations

import logging

from vit import mkl_amd


def train() -> None:
    """`vit-train`: the LightningCLI (vit/cli.py), which logs the switch's status as a run starts."""
    mkl_amd.enable()
    from vit.cli import train_main

    train_main()


def evaluate() -> None:
    """`vit-evaluate`: a checkpoint's metrics JSON and confusion matrix (vit/cli.py)."""
    switch_mkl()
    from vit.cli import evaluate_main

    evaluate_main()


def visualize() -> None:
    """`vit-visualize`: attention pictures from a checkpoint (vit/visualize.py)."""
    switch_mkl()
    from vit.visualize import visualize_main

    visualize_main()


def explore() -> None:
    """`vit-explore`: one self-contained HTML page to look inside attention (vit/explore.py)."""
    switch_mkl()
    from vit.explore import explore_main

    explore_main()


def switch_mkl() -> None:
    """The switch, logged once, for the commands that log plain messages (scripts/benchmark.py
    too); call it before anything imports torch."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mkl_amd.enable()
    mkl_amd.report()


if __name__ == "__main__":
    train()
