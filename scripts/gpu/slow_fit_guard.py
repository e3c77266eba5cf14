"""SlowFitGuard: stop a fit early when its loop runs far below what the step can do, so that a
scarce GPU call spends its remaining minutes on a fit that can reach its target
(scripts/gpu/run_gpu8.sh then runs one without CUDA graphs) instead of finishing one that cannot.
Added on the command line after the recipe's callbacks:

    PYTHONPATH=scripts/gpu vit-train fit -c experiments/gpu8.yaml ... \
        --trainer.callbacks+=slow_fit_guard.SlowFitGuard \
        --trainer.callbacks.init_args.min_img_s 6000 --trainer.callbacks.init_args.report check.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn


def compile_stats() -> dict[str, Any]:
    """What the compiler has done so far in this process: dynamo's graphs and graph breaks, and on
    a GPU the CUDA-graph trees' recordings, re-recordings, skips and allocator checkpoints. Read
    at the first step and at the check, the difference says whether the loop keeps compiling or
    recording (the first H100 fit's suspect). torch internals: best effort."""
    from torch._dynamo.utils import counters

    stats: dict[str, Any] = {
        "dynamo_graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
    }
    if not torch.cuda.is_available():
        return stats
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_container(torch.cuda.current_device()).tree_manager
        if manager is not None:
            stats |= cudagraph_tree_stats(manager)
    except Exception as err:  # noqa: BLE001  (internals move between torch versions)
        stats["cudagraph_trees_error"] = repr(err)
    return stats


def cudagraph_tree_stats(manager: Any) -> dict[str, int]:
    """A CUDA-graph tree manager's (torch/_inductor/cudagraph_trees.py) counts. The depths tell
    the first H100 fit's fault apart from a sound loop: there every step recorded one node more
    below the last (a path as deep as the steps), where a loop that starts a generation per step
    replays a path of a few nodes (forward, backward) from a root.

    - cudagraph_path_depth: nodes from the root to the current node (0: none current)
    - cudagraph_tree_depth: the deepest path recorded so far, over all roots
    - cudagraph_nodes: the recorded nodes in the tree (warm-up runs are not recorded)"""
    depth, node = 0, manager.current_node
    while node is not None:
        depth, node = depth + 1, node.parent
    deepest, nodes = 0, 0
    stack = [(root, 1) for roots in manager.roots.values() for root in roots]
    while stack:  # iterative: a faulty tree can be thousands of nodes deep
        node, level = stack.pop()
        deepest, nodes = max(deepest, level), nodes + 1
        stack.extend(
            (child, level + 1) for kids in getattr(node, "children", {}).values() for child in kids
        )
    return {
        "cudagraph_functions": len(manager.ids_to_funcs),
        "cudagraphs_recorded": int(repr(manager.graph_counter)[6:-1]),  # count(N)
        "cudagraph_rerecords": sum(sum(f.values()) for f in manager.num_rerecord.values()),
        "allocator_checkpoints": manager.debug_checkpointing_counter,
        "cudagraph_path_depth": depth,
        "cudagraph_tree_depth": deepest,
        "cudagraph_nodes": nodes,
    }


class SlowFitGuard(L.Callback):
    """Once, `after_s` seconds after the first training step ended (its compile and CUDA-graph
    recording behind it), compare the images per second trained since then with `min_img_s`,
    write what was seen to `report` (JSON: the rate, the compiler's counts at the first step and
    at the check, and whether it stopped the fit) and, below the floor, stop the fit (Lightning
    validates and saves as at any stop). No device sync: over half a minute the queue's lag is
    noise.

    Args:
        min_img_s: The slowest loop worth finishing, in training images per second.
        report: The JSON file written at the check, whatever it finds.
        after_s: Seconds of training, from the end of the first step, before the one check.
    """

    def __init__(self, *, min_img_s: float, report: str, after_s: float = 60.0) -> None:
        if not min_img_s > 0 or not after_s > 0:
            raise ValueError(
                f"SlowFitGuard min_img_s={min_img_s} and after_s={after_s} must be positive."
            )
        self.min_img_s, self.report, self.after_s = min_img_s, Path(report), after_s
        self.clock = time.monotonic  # tests replace it with a fake clock
        self._since: float | None = None
        self._at_first_step: dict[str, Any] = {}
        self._images = 0
        self._checked = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        if self._checked:
            return
        if self._since is None:  # the first step: compiles and recordings, not the loop
            self._since, self._at_first_step = self.clock(), compile_stats()
            return
        labels = batch[1] if isinstance(batch, (tuple, list)) else batch
        self._images += len(labels) * trainer.world_size
        seconds = self.clock() - self._since
        if seconds < self.after_s:
            return
        self._checked = True
        img_s = self._images / seconds
        slow = img_s < self.min_img_s
        seen = {
            "img_s": round(img_s, 1),
            "min_img_s": self.min_img_s,
            "seconds": round(seconds, 1),
            "step": trainer.global_step,
            "compiler_at_first_step": self._at_first_step,
            "compiler_at_check": compile_stats(),
            "stopped": slow,
        }
        if trainer.is_global_zero:
            self.report.parent.mkdir(parents=True, exist_ok=True)
            self.report.write_text(json.dumps(seen) + "\n")
        if not slow:
            return
        rank_zero_warn(f"SlowFitGuard: the loop ran {img_s:.0f} img/s < {self.min_img_s}: stopping")
        trainer.should_stop = True
