"""MatMul epilogues: bias + GELU, Gemm, scale, transposed operands."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult

from superkernel.onnx import _util as U
from superkernel.onnx.rules.base import FusionPattern, MS, _fail


def _bias_ok(x: ir.Value, bias: ir.Value) -> str | None:
    bd = U.dims(bias)
    d = U.last_dim(x)
    if U.const_array(bias) is None:
        return "bias is not a constant"
    if bd is None or len(bd) != 1:
        return f"bias shape {bd} is not 1-D"
    if d is None or bd[0] != d:
        return f"bias length {bd[0]} does not match the last dimension {d}"
    return None


class BiasGelu(FusionPattern):
    rule_name = "bias_gelu"

    def pattern(self, op, x, bias):
        s = op.Add(x, bias)
        form = self.params["form"]
        if form == "ms_gelu":
            return op.Gelu(s, _domain=MS)
        if form == "ms_fast":
            return op.FastGelu(s, _domain=MS)
        return op.Gelu(s, _allow_other_attributes=True, _outputs=["g"])

    def validate(self, context, x, bias, g=None, **_):
        why = _bias_ok(x, bias)
        if why:
            return _fail(why, bias)
        self.state["tanh"] = self.params["form"] == "ms_fast" or (
            g is not None and g.producer().attributes.get("approximate") is not None
            and g.producer().attributes["approximate"].value == "tanh")
        return MatchResult()

    def rewrite(self, op, x, bias, **_):
        if self.state["tanh"]:
            return op.FastGelu(x, bias, _domain=MS)
        return op.BiasGelu(x, bias, _domain=MS)


class Gemm(FusionPattern):
    rule_name = "gemm"

    def pattern(self, op, a, b, c):
        return op.Add(op.MatMul(a, b), c)

    def validate(self, context, a, b, c, **_):
        if U.rank(a) != 2 or U.rank(b) != 2:
            return _fail(f"MatMul operands have ranks {U.rank(a)} and {U.rank(b)}; Gemm takes 2-D", a)
        if a.dtype not in U.FLOAT_TYPES:
            return _fail("operands are not float", a)
        cd = U.dims(c)
        n = U.last_dim(b)
        if cd is None or len(cd) > 2 or n is None or cd[-1] not in (n, 1):
            return _fail(f"bias shape {cd} is not unidirectionally broadcastable to [M, {n}]", c)
        if len(cd) == 2 and cd[0] != 1 and cd[0] != (U.dims(a) or [None])[0]:
            return _fail(f"bias shape {cd} does not broadcast to the output rows", c)
        return MatchResult()

    def rewrite(self, op, a, b, c, **_):
        return op.Gemm(a, b, c)


class MatMulScale(FusionPattern):
    rule_name = "fused_matmul_scale"

    def pattern(self, op, a, b, s):
        mm = op.MatMul(a, b)
        if self.params["op"] == "div":
            return op.Div(mm, s)
        return op.Mul(mm, s)

    def validate(self, context, a, b, s, **_):
        v = U.scalar(s)
        if v is None:
            return _fail(f"scale {U.dims(s)} is not a scalar constant", s)
        if a.dtype not in U.FLOAT_TYPES:
            return _fail("operands are not float", a)
        if U.rank(a) is None or U.rank(b) is None or U.rank(a) < 2 or U.rank(b) < 2:
            return _fail("MatMul operands are not known to be at least 2-D", a)
        if self.params["op"] == "div" and v == 0:
            return _fail("division by zero", s)
        self.state["alpha"] = float(1.0 / v if self.params["op"] == "div" else v)
        return MatchResult()

    def rewrite(self, op, a, b, **_):
        return op.FusedMatMul(a, b, alpha=self.state["alpha"], _domain=MS)


class MatMulTranspose(FusionPattern):
    rule_name = "fused_matmul_transpose"
    commute_rule = False

    def pattern(self, op, a, b):
        side = self.params["side"]
        if self.params["base"] == "matmul":
            if side == "b":
                return op.MatMul(a, op.Transpose(b, _allow_other_attributes=True, _outputs=["t"]),
                                 _outputs=["mm"])
            return op.MatMul(op.Transpose(a, _allow_other_attributes=True, _outputs=["t"]), b, _outputs=["mm"])
        if side == "b":
            return op.FusedMatMul(a, op.Transpose(b, _allow_other_attributes=True, _outputs=["t"]), _domain=MS,
                                  _allow_other_attributes=True, _outputs=["mm"])
        return op.FusedMatMul(op.Transpose(a, _allow_other_attributes=True, _outputs=["t"]), b, _domain=MS,
                              _allow_other_attributes=True, _outputs=["mm"])

    def validate(self, context, a, b, t, mm, **_):
        src = b if self.params["side"] == "b" else a
        r = U.rank(src)
        perm = U.attr_ints(t.producer(), "perm")
        if r is None or r < 2:
            return _fail("transposed operand rank unknown or < 2", src)
        want = list(range(r - 2)) + [r - 1, r - 2]
        if perm != want:
            return _fail(f"Transpose perm {perm} is not a swap of the last two axes ({want})", t.producer())
        if U.rank(a) != U.rank(b):
            return _fail("operands of different rank (batch broadcasting)", a)
        if src.dtype not in U.FLOAT_TYPES:
            return _fail("operands are not float", src)
        attrs = {}
        if self.params["base"] == "fused":
            attrs = {k: v.value for k, v in mm.producer().attributes.items()}
            key = "transB" if self.params["side"] == "b" else "transA"
            if attrs.get(key, 0):
                return _fail(f"FusedMatMul already has {key}", mm.producer())
            if attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0):
                return _fail("FusedMatMul uses batch transposition", mm.producer())
        attrs["transB" if self.params["side"] == "b" else "transA"] = 1
        self.state["attrs"] = attrs
        return MatchResult()

    def rewrite(self, op, a, b, **_):
        return op.FusedMatMul(a, b, _domain=MS, **self.state["attrs"])
