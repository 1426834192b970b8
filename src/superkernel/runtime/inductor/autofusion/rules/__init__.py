"""The planner's rules, one pattern per module (see each module's docstring)."""

from __future__ import annotations

import torch.fx as fx


def is_get_attr(node: fx.Node) -> bool:
    """A constant of the graph (a frozen weight): the rules' default test for "this operand is a weight"."""
    return node.op == "get_attr"
