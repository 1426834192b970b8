"""Capture: Dynamo's graph -> the inference ATen graph every later stage works on.

Also reads what Dynamo says about the graph it hands over (the graph-break reason that
ended it, the process-wide graph-break count).
"""

from __future__ import annotations

from typing import Any, Callable

import torch.fx as fx


def break_text(reason: Any) -> str:
    where = ""
    stack = getattr(reason, "user_stack", None) or []
    if stack:
        frame = stack[-1]
        where = f" at {frame.filename}:{frame.lineno}"
    text = (getattr(reason, "reason", "") or "graph break").strip().splitlines()[0]
    return f"{text}{where}"


def capture(gm: fx.GraphModule, example_inputs: list[Any], fw_compiler: Callable[..., Any],
            decompositions: dict[Any, Any] | None = None) -> Callable[..., Any]:
    """Run AOTAutograd on Dynamo's graph; ``fw_compiler`` receives the inference ATen graph.

    Input mutations (a KV cache written in place) stay in the graph as ``copy_`` nodes,
    as TorchInductor keeps them, so every stage sees them.
    """
    from torch._functorch.aot_autograd import aot_module_simplified

    return aot_module_simplified(
        gm, example_inputs, fw_compiler=fw_compiler, decompositions=decompositions,
        keep_inference_input_mutations=True,
    )


def dynamo_graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))
