"""The console commands' targets: process-wide switches first, then the command.

MKL's AVX2 kernels on AMD CPUs (vit/system/mkl_amd.py) only switch on before torch loads, and the
inductor cache's folder per ATEN_CPU_CAPABILITY (vit/system/inductor_cache.py) before torch's
compiler loads, so this module imports no torch and nothing that does: each target switches, then
imports its command. `python -m vit.commands.entry` is vit-train (how DDP relaunches it).
VIT_MKL_AVX2=0 leaves MKL as torch ships it. glibc's malloc keeps the memory a step frees
(vit/system/malloc.py); VIT_KEEP_FREED_MEMORY=0 leaves glibc's defaults.
"""

from __future__ import annotations

import logging

from vit.system import inductor_cache, malloc, mkl_amd
from vit.system.errors import PACKAGE_DIR, exit_on_user_error, interruptible


@interruptible
def train() -> None:
    """`vit-train`: the LightningCLI (vit/commands/), which logs the switch's status as a run starts."""
    switch()
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from vit.commands.train import train_main

    # vit's own checks print their one line, and so does Lightning's refusal of a setting
    # (--trainer.max_epochs -2); any other error from inside Lightning or torch, its traceback
    exit_on_user_error(train_main, only_from=PACKAGE_DIR, anywhere=(MisconfigurationException,))


@interruptible
def evaluate() -> None:
    """`vit-evaluate`: a checkpoint's metrics JSON and confusion matrix (vit/commands/)."""
    switch_mkl()
    from vit.commands.evaluate import evaluate_main

    evaluate_main()


@interruptible
def visualize() -> None:
    """`vit-visualize`: attention pictures from a checkpoint (vit/commands/visualize.py)."""
    switch_mkl()
    from vit.commands.visualize import visualize_main

    visualize_main()


@interruptible
def explore() -> None:
    """`vit-explore`: one self-contained HTML page to look inside attention (vit/commands/explore.py)."""
    switch_mkl()
    from vit.commands.explore import explore_main

    explore_main()


@interruptible
def inspect() -> None:
    """`vit-inspect`: a model as a whole (attention distance, filters, positions) or one run's
    checkpoints over training (vit/commands/inspect_model.py)."""
    switch_mkl()
    from vit.commands.inspect_model import inspect_main

    inspect_main()


@interruptible
def export() -> None:
    """`vit-export`: a model as ONNX or a torch.export program (vit/commands/export.py)."""
    switch_mkl()
    from vit.commands.export import export_main

    export_main()


@interruptible
def predict() -> None:
    """`vit-predict`: the top-k classes of your own images (vit/commands/predict.py)."""
    switch_mkl()
    from vit.commands.predict import predict_main

    predict_main()


def switch() -> None:
    """The process-wide switches, silent: MKL's kernels on AMD, malloc's thresholds, the inductor
    cache's folder."""
    mkl_amd.enable()
    malloc.keep_freed_memory()
    inductor_cache.separate_by_capability()


def plain_logging() -> None:
    """Messages as plain lines on stderr, each once. Lightning's root package prints its loggers'
    records with a handler of its own ("INFO: ..."), and they propagate to the root logger too:
    the root's handler leaves them to it. A root logger already set up (an application's,
    pytest's) is left as it is."""
    root = logging.getLogger()
    if root.handlers:
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root.handlers[0].addFilter(lambda record: not record.name.startswith("lightning."))


def switch_mkl() -> None:
    """The switches, MKL's and malloc's logged once, for the commands that log plain messages
    (scripts/benchmark.py too); call it before anything imports torch."""
    plain_logging()
    switch()
    mkl_amd.report()
    malloc.report()


if __name__ == "__main__":
    train()
