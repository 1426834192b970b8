"""Activations: GELU (erf and tanh), SiLU, QuickGELU."""

from __future__ import annotations

import math

from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult

from superkernel.onnx import _util as U
from superkernel.onnx.rules.base import FusionPattern, MS, _fail


def _close(v: float | None, ref: float, rtol: float = 1e-3) -> bool:
    return v is not None and math.isclose(v, ref, rel_tol=rtol)


def _half_times(op, x, half, p, form):
    if form == "a":  # x * (0.5 * p)
        return op.Mul(x, op.Mul(half, p))
    if form == "b":  # (x * 0.5) * p
        return op.Mul(op.Mul(x, half), p)
    return op.Mul(op.Mul(x, p), half)  # (x * p) * 0.5


class GeluErf(FusionPattern):
    rule_name = "gelu_erf"

    def pattern(self, op, x, c, one, half):
        inner = pattern.OrValue([op.Div(x, c, _outputs=["scaled"]), op.Mul(x, c, _outputs=["scaled"])])
        p = op.Add(op.Erf(inner), one)
        return _half_times(op, x, half, p, self.params["form"])

    def validate(self, context, x, c, one, half, scaled, **_):
        if x.dtype not in U.FLOAT_TYPES:
            return _fail("input is not a float type", x)
        cv = U.scalar(c)
        want = math.sqrt(2.0) if scaled.producer().op_type == "Div" else 1 / math.sqrt(2.0)
        if not _close(cv, want):
            return _fail(f"erf argument scale {cv} is not {want:.6f} (x/sqrt(2))", c)
        if U.scalar(one) != 1.0 or U.scalar(half) != 0.5:
            return _fail(f"constants {U.scalar(half)}*(x)*({U.scalar(one)}+erf) are not 0.5 and 1", half)
        return MatchResult()

    def rewrite(self, op, x, **_):
        if self.state["opset"] >= 20:
            return op.Gelu(x)
        return op.Gelu(x, _domain=MS)


class GeluTanh(FusionPattern):
    rule_name = "gelu_tanh"

    def pattern(self, op, x, three, k, c, one, half):
        cube = pattern.OrValue([op.Pow(x, three), op.Mul(x, op.Mul(x, x))])
        inner = op.Add(x, op.Mul(k, cube))
        p = op.Add(op.Tanh(op.Mul(c, inner)), one)
        return _half_times(op, x, half, p, self.params["form"])

    def validate(self, context, x, three, k, c, one, half, **_):
        if x.dtype not in U.FLOAT_TYPES:
            return _fail("input is not a float type", x)
        if three is not None and U.scalar(three) != 3.0:
            return _fail(f"Pow exponent {U.scalar(three)} is not 3", three)
        if not _close(U.scalar(k), 0.044715):
            return _fail(f"cubic coefficient {U.scalar(k)} is not 0.044715", k)
        if not _close(U.scalar(c), math.sqrt(2 / math.pi)):
            return _fail(f"tanh scale {U.scalar(c)} is not sqrt(2/pi)", c)
        if U.scalar(one) != 1.0 or U.scalar(half) != 0.5:
            return _fail("outer constants are not 0.5 and 1", half)
        return MatchResult()

    def rewrite(self, op, x, **_):
        if self.state["opset"] >= 20:
            return op.Gelu(x, approximate="tanh")
        return op.FastGelu(x, _domain=MS)


class SiLU(FusionPattern):
    rule_name = "silu"

    def pattern(self, op, x):
        return op.Mul(x, op.Sigmoid(x))

    def validate(self, context, x, **_):
        if x.dtype not in U.FLOAT_TYPES:
            return _fail("input is not a float type", x)
        return MatchResult()

    def rewrite(self, op, x, **_):
        return op.QuickGelu(x, alpha=1.0, _domain=MS)


class QuickGelu(FusionPattern):
    rule_name = "quick_gelu"

    def pattern(self, op, x, alpha):
        return op.Mul(x, op.Sigmoid(op.Mul(x, alpha)))

    def validate(self, context, x, alpha, **_):
        a = U.scalar(alpha)
        if a is None:
            return _fail("sigmoid argument scale is not a scalar constant", alpha)
        if x.dtype not in U.FLOAT_TYPES:
            return _fail("input is not a float type", x)
        self.state["alpha"] = float(a)
        return MatchResult()

    def rewrite(self, op, x, **_):
        return op.QuickGelu(x, alpha=self.state["alpha"], _domain=MS)
