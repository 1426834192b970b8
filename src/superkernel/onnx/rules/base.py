"""The rule base class and helpers every rule uses."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult



MS = "com.microsoft"
QUIET = "~"  # a check failure with this prefix is a variant mismatch, not a near miss worth reporting


def _fail(reason: str, *sources) -> MatchResult:
    return MatchResult().fail(reason, [s for s in sources if s is not None])


def _opset(context) -> int:
    return int(context.model.opset_imports.get("", context.model.opset_imports.get("ai.onnx", 0)) or 0)


def softmax_on_last_axis(node: ir.Node, rank: int, opset: int) -> int | None:
    """None when Softmax ``node`` normalizes over the last of ``rank`` axes only, else its axis.
    Below opset 13 Softmax flattens the axes from ``axis`` on (default 1), so only an explicit
    last axis means the same as from opset 13 on (default -1)."""
    a = node.attributes.get("axis")
    axis = int(a.value) if a is not None else (-1 if opset >= 13 else 1)
    return None if axis in (-1, rank - 1) else axis


def shape_range(op, v, start: int, end: int, opset: int):
    """``Shape(v)[start:end]``: Shape with start/end from opset 15, Slice of Shape before."""
    if opset >= 15:
        return op.Shape(v, start=start, end=end)
    return op.Slice(op.Shape(v), op.Constant(value=ir.tensor(np.array([start], dtype=np.int64))),
                    op.Constant(value=ir.tensor(np.array([end], dtype=np.int64))))


def squeeze0(op, v, opset: int):
    """Squeeze axis 0: axes as an input from opset 13, as an attribute before."""
    if opset >= 13:
        return op.Squeeze(v, op.Constant(value=ir.tensor(np.array([0], dtype=np.int64))))
    return op.Squeeze(v, axes=[0])


class FusionPattern(pattern.RewriteRuleClassBase):
    """Base of all rules: records near misses and remembers what the rewrite needs."""

    rule_name: str = ""
    commute_rule: bool = True

    def __init__(self, variant: str = "", **params: Any):
        super().__init__(name=f"{self.rule_name}/{variant}" if variant else self.rule_name)
        self.variant = variant
        self.params = params
        self.near_misses: list[tuple[ir.Node, str]] = []
        self.state: dict[str, Any] = {}

    # onnxscript calls check(context, **bindings)
    def check(self, context, **bindings) -> MatchResult:
        self.state = {"opset": _opset(context), "root": context.root}
        result = self.validate(context, **bindings)
        if not result and not (result.reason or "").startswith(QUIET):
            self.near_misses.append((context.root, result.reason or "check failed"))
        return result

    def validate(self, context, **bindings) -> MatchResult:  # pragma: no cover - overridden
        return MatchResult()

    # Extra inputs to the benefit model, computed on the match's bindings.
    def benefit_hints(self, bindings: dict[str, Any]) -> dict[str, Any]:
        """``row``: value whose last-axis row is the fused kernel's working set;
        ``added``: helper tensors the replacement writes in addition, as
        (value or dims, dtype name, reads)."""
        return {}
