"""Composite forms: the epilogue fused together with a decomposed norm / activation, so that
they are found (and measured) even where the inner fusion alone is not kept."""

from __future__ import annotations

from superkernel.onnx import _util as U
from superkernel.onnx.rules.activations import GeluErf
from superkernel.onnx.rules.base import MS, QUIET, _fail
from superkernel.onnx.rules.matmul import BiasGelu, _bias_ok
from superkernel.onnx.rules.norms import RMSNormDecomposed, _same_shape, skip_norm


class SkipRMSNormDecomposed(RMSNormDecomposed):
    """Add(a, b) [-> Cast to the same dtype] -> decomposed RMSNorm
    -> com.microsoft SkipSimplifiedLayerNormalization (4th output = the sum when used later)."""

    rule_name = "skip_rmsnorm"
    commute_rule = False  # written out in the operand orders both exporters use (commuting it all is slow)

    def pattern(self, op, a, b, two, axes, eps, scale, one):
        s = op.Add(a, b, _outputs=["s"])
        x = op.Cast(s, _allow_other_attributes=True, _outputs=["x"]) if self.params.get("in_cast") else s
        norm = self.normalized(op, x, two, axes, eps, one)
        y = op.Mul(scale, norm) if self.params.get("scale_first", True) else op.Mul(norm, scale)
        # the sum used later: the Add output, or with the no-op Cast the Cast output (the
        # TorchScript exporter's residual reads it)
        return (y, x) if self.params["sum_out"] else y

    def validate(self, context, a, b, s, two, axes, eps, scale, ms, x=None, mform=None, **kw):
        x = s if x is None else x
        if x is not s and U.attr_int(x.producer(), "to", 0) != int(s.dtype or 0):
            return _fail("the Cast after the residual add changes the dtype", x.producer())
        r = super().validate(context, x, two, axes, eps, scale, ms, **kw)
        if not r:
            return r
        if U.rank(a) != 3:
            return _fail(f"input rank {U.rank(a)} (the skip op takes [batch, seq, hidden])", a)
        if not _same_shape(a, b):
            return _fail(f"residual operands have different shapes {U.dims(a)} and {U.dims(b)}", b)
        if self.params["sum_out"]:
            sq = ms.producer().inputs[0].producer()
            internal = (2 if sq is not None and sq.op_type == "Mul" else 1) + 1  # square and normalization
            if not (x.is_graph_output() or len(x.uses()) > internal):
                return _fail(QUIET + "the sum is not used elsewhere (the single-output variant applies)")
        return r

    def rewrite(self, op, a, b, scale, **_):
        return skip_norm(op, a, b, scale, epsilon=self.state["epsilon"], simplified=True, sum_out=self.params["sum_out"])

    def benefit_hints(self, b):
        return {"row": b["a"]}


class BiasGeluErf(GeluErf):
    """Add(x, constant bias) -> decomposed erf GELU -> com.microsoft BiasGelu."""

    rule_name = "bias_gelu"

    def pattern(self, op, x0, bias, c, one, half):
        x = op.Add(x0, bias, _outputs=["x"])
        return super().pattern(op, x, c, one, half)

    def validate(self, context, x0, bias, x, c, one, half, scaled, **_):
        why = _bias_ok(x0, bias)
        if why:
            return _fail(why, bias)
        return super().validate(context, x, c, one, half, scaled)

    def rewrite(self, op, x0, bias, **_):
        return op.BiasGelu(x0, bias, _domain=MS)
