"""One Inductor compile per distinct partition graph within a graph compile.

A decoder's layers are cut into partitions whose graphs are identical except for the names
FX gave their nodes; their weights are inputs, not constants. TorchInductor's own FX graph
cache keys on the graph's code including those names, so each layer misses it and is
compiled again (measured: 8 misses for 4 identical layers). :func:`structural_key` names a
partition by what decides its generated code — the graph with canonical node names, the
inputs' shapes, strides, storage offsets, dtypes and devices, and the caller's codegen
options — so a repeat reuses the first compiled kernel. A graph holding constants
(``get_attr``) or symbolic shapes has no key and is always compiled on its own.
"""

from __future__ import annotations

import copy
from typing import Any, Hashable

import torch
import torch.fx as fx


def _input_signature(value: Any) -> Hashable | None:
    if isinstance(value, torch.Tensor):
        parts = (*value.shape, *value.stride(), value.storage_offset())
        if any(not isinstance(p, int) for p in parts):
            return None  # symbolic: the compiled code may carry guards of its own
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.storage_offset(),
                str(value.dtype), str(value.device), bool(value.requires_grad))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", type(value).__name__, value)
    return None


def structural_key(gm: fx.GraphModule, example_inputs: list[Any], options: Hashable) -> Hashable | None:
    """A key equal for two partitions whose Inductor compile is interchangeable, or None."""
    if any(n.op == "get_attr" for n in gm.graph.nodes):
        return None
    signature = tuple(_input_signature(v) for v in example_inputs)
    if any(s is None for s in signature):
        return None
    graph = copy.deepcopy(gm.graph)
    for i, node in enumerate(graph.nodes):
        node.name = f"n{i}"  # FX names differ per layer (arg3_1 vs arg15_1); meaning does not
        if node.op == "placeholder":
            node.target = node.name
    code = graph.python_code(root_module="self").src
    return code, signature, options
