"""scripts/count_step_ops.py's split of a phase's profiled ops: the launch proxy for a GPU fit
(experiments/record/benchmarks/step_ops.md) counts a compiled graph's run as one CUDA-graph
replay, so which ops ran inside one must be told apart from those dispatched outside."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from tests.helpers import load_script

ops = load_script("count_step_ops")


def event(name: str, parent: SimpleNamespace | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, cpu_parent=parent)


def test_ops_inside_a_compiled_graph_are_told_from_those_outside() -> None:
    region = event("Torch-Compiled Region: 0/0")
    graph = event(f"{ops.GRAPH_CALL} abc ##", event("CompiledFunction", region))
    addmm = event("aten::addmm", graph)
    backward = event(f"{ops.GRAPH_CALL} def ##", event("CompiledFunctionBackward"))
    accumulate = event("torch::autograd::AccumulateGrad")
    events = [
        region, graph, addmm,
        event("aten::mm", addmm),  # under an aten op: not top level, not counted
        event("aten::t", event("some python range", graph)),  # inside, however deep
        backward, event("aten::mm", backward),
        event("aten::detach", accumulate), event("aten::detach", accumulate),  # outside
        event("aten::cross_entropy_loss"),  # outside, at the top
    ]  # fmt: skip
    outside, inside, calls = ops.top_level_ops(events)
    assert outside == Counter({"aten::detach": 2, "aten::cross_entropy_loss": 1})
    assert inside == Counter({"aten::addmm": 1, "aten::t": 1, "aten::mm": 1})
    assert calls == 2
