"""Normalizations: LayerNorm, RMSNorm and their residual (skip) forms."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult

from superkernel.onnx import _util as U
from superkernel.onnx.rules.base import FusionPattern, MS, QUIET, _fail


class LayerNormDecomposed(FusionPattern):
    rule_name = "layernorm"

    def pattern(self, op, x, axes1, axes2, two, eps, scale, bias):
        if self.params.get("axes_attr"):  # opset < 18: ReduceMean(x) with an axes attribute
            mean = op.ReduceMean(x, _allow_other_attributes=True, _outputs=["mean"])
        else:
            mean = op.ReduceMean(x, axes1, _allow_other_attributes=True, _outputs=["mean"])
        d = op.Sub(x, mean)
        sq = pattern.OrValue([op.Pow(d, two), op.Mul(d, d)])
        if self.params.get("axes_attr"):
            var = op.ReduceMean(sq, _allow_other_attributes=True, _outputs=["var"])
        else:
            var = op.ReduceMean(sq, axes2, _allow_other_attributes=True, _outputs=["var"])
        if self.params["eps"]:
            var = op.Add(var, eps)
        std = op.Sqrt(var)
        norm = pattern.OrValue([op.Div(d, std), op.Mul(d, op.Reciprocal(std))])
        y = op.Mul(norm, scale)
        if self.params["bias"]:
            y = op.Add(y, bias)
        return y

    def validate(self, context, x, axes1, axes2, two, eps, scale, bias, mean, var, **_):
        if x.dtype not in U.FLOAT_TYPES:
            return _fail(f"input dtype {x.dtype} is not a float type", x)
        r = U.rank(x)
        if self.params.get("axes_attr"):
            a1, a2 = U.attr_ints(mean.producer(), "axes"), U.attr_ints(var.producer(), "axes")
        else:
            a1, a2 = U.ints(axes1), U.ints(axes2)
        if not (U.is_last_axis(a1, r) and U.is_last_axis(a2, r)):
            return _fail(f"mean/variance reduce axes {a1}/{a2} are not the last axis", x)
        for node in (mean.producer(), var.producer()):
            if U.attr_int(node, "keepdims", 1) != 1:
                return _fail("ReduceMean without keepdims", node)
        if two is not None and U.scalar(two) != 2.0:
            return _fail(f"variance uses Pow exponent {U.scalar(two)} instead of 2", two)
        e = 0.0
        if self.params["eps"]:
            e = U.scalar(eps)
            if e is None:
                return _fail("epsilon is not a scalar constant", eps)
        d = U.last_dim(x)
        for name, v in (("scale", scale), ("bias", bias)):
            if v is None:
                continue
            vd = U.dims(v)
            if vd is None or len(vd) != 1 or (d is not None and vd[0] != d):
                return _fail(f"{name} shape {vd} is not [{d}] (the normalized axis)", v)
        self.state["epsilon"] = float(e)
        return MatchResult()

    def rewrite(self, op, x, scale, bias=None, **_):
        # Below opset 17 this is ONNX Runtime's own LayerNormalization schema (ONNX domain,
        # since version 1; its optimizer writes the same node): it runs in ONNX Runtime, while
        # onnx.checker only knows LayerNormalization from opset 17 on.
        args = [x, scale] + ([bias] if bias is not None else [])
        return op.LayerNormalization(*args, axis=-1, epsilon=self.state["epsilon"], stash_type=1)

    def benefit_hints(self, b):
        return {"row": b["x"]}


class RMSNormDecomposed(FusionPattern):
    """Variants: ``axes_attr`` (ReduceMean with an ``axes`` attribute, opset < 18, the
    TorchScript exporter's form) and ``cast`` (a Cast to the input's own dtype between the
    normalization and the scale, Hugging Face's ``.to(input_dtype)``)."""

    rule_name = "rmsnorm"

    def pattern(self, op, x, two, axes, eps, scale, one):
        return op.Mul(self.normalized(op, x, two, axes, eps, one), scale)

    def normalized(self, op, x, two, axes, eps, one):
        """``x / sqrt(mean(x^2) + eps)`` in every form the exporters write it (before the scale)."""
        sq = pattern.OrValue([op.Pow(x, two), op.Mul(x, x)], tag_var="sform", tag_values=("pow", "mul"))
        if self.params.get("axes_attr"):
            ms = op.ReduceMean(sq, _allow_other_attributes=True, _outputs=["ms"])
        else:
            ms = op.ReduceMean(sq, axes, _allow_other_attributes=True, _outputs=["ms"])
        r = op.Sqrt(op.Add(ms, eps))
        norm = pattern.OrValue([op.Mul(x, op.Reciprocal(r)), op.Div(x, r), op.Mul(x, op.Div(one, r))],
                               tag_var="rform", tag_values=("reciprocal", "div", "one_over"))
        if self.params.get("cast"):
            norm = op.Cast(norm, _allow_other_attributes=True, _outputs=["cast"])
        return norm

    def validate(self, context, x, two, axes, eps, scale, ms, one=None, cast=None, rform=None, sform=None, **_):
        if x.dtype not in U.FLOAT_TYPES:
            return _fail(f"input dtype {x.dtype} is not a float type", x)
        ax = U.attr_ints(ms.producer(), "axes") if self.params.get("axes_attr") else U.ints(axes)
        if not U.is_last_axis(ax, U.rank(x)):
            return _fail(f"mean of squares reduces axes {ax}, not the last axis", x)
        if U.attr_int(ms.producer(), "keepdims", 1) != 1:
            return _fail("ReduceMean without keepdims")
        if two is not None and U.scalar(two) != 2.0:
            return _fail(f"Pow exponent {U.scalar(two)} is not 2", two)
        if one is not None and U.scalar(one) != 1.0:
            return _fail(f"Div({U.scalar(one)}, sqrt) is not a reciprocal", one)
        if cast is not None and U.attr_int(cast.producer(), "to", 0) != int(x.dtype):
            return _fail("the Cast before the scale changes the dtype", cast.producer())
        e = U.scalar(eps)
        if e is None:
            return _fail("epsilon is not a scalar constant", eps)
        d = U.last_dim(x)
        sd = U.dims(scale)
        if sd is None or len(sd) != 1 or (d is not None and sd[0] != d):
            return _fail(f"scale shape {sd} is not [{d}]", scale)
        if scale.dtype != x.dtype:
            return _fail("scale dtype differs from the input", scale)
        self.state["epsilon"] = float(e)
        return MatchResult()

    def rewrite(self, op, x, scale, **_):
        if self.state["opset"] >= 23:
            return op.RMSNormalization(x, scale, axis=-1, epsilon=self.state["epsilon"], stash_type=1)
        # ONNX Runtime registers SimplifiedLayerNormalization in the ONNX domain (its own
        # optimizer emits the same node); the standard RMSNormalization needs opset 23.
        return op.SimplifiedLayerNormalization(x, scale, axis=-1, epsilon=self.state["epsilon"], stash_type=1)

    def benefit_hints(self, b):
        return {"row": b["x"]}


def _same_shape(a: ir.Value, b: ir.Value) -> bool:
    da, db = U.dims(a), U.dims(b)
    return da is not None and db is not None and len(da) == len(db) and all(
        x is not None and x == y for x, y in zip(da, db))


class SkipNorm(FusionPattern):
    """Add(a, b) -> LayerNormalization / SimplifiedLayerNormalization / RMSNormalization."""

    rule_name = "skip_layernorm"

    def pattern(self, op, a, b, scale, bias):
        s = op.Add(a, b)
        kind = self.params["kind"]
        if kind == "ln":
            y = op.LayerNormalization(s, scale, bias, _allow_other_attributes=True, _outputs=["norm"])
        elif kind == "ln_nobias":
            y = op.LayerNormalization(s, scale, _allow_other_attributes=True, _outputs=["norm"])
        elif kind == "sln":
            y = op.SimplifiedLayerNormalization(s, scale, _allow_other_attributes=True, _outputs=["norm"])
        else:
            y = op.RMSNormalization(s, scale, _allow_other_attributes=True, _outputs=["norm"])
        return (y, s) if self.params["sum_out"] else y

    def validate(self, context, a, b, scale, norm, bias=None, **_):
        node = norm.producer()
        if U.attr_int(node, "axis", -1) not in (-1, (U.rank(a) or 0) - 1):
            return _fail(f"normalization axis {U.attr_int(node, 'axis', -1)} is not the last axis", node)
        if U.attr_int(node, "stash_type", 1) != 1:
            return _fail("stash_type is not float", node)
        if any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return _fail("mean / inv_std_dev outputs of the normalization are used", node)
        if U.rank(a) != 3:
            return _fail(f"input rank {U.rank(a)} (the skip op takes [batch, seq, hidden])", a)
        if not _same_shape(a, b):
            return _fail(f"residual operands have different shapes {U.dims(a)} and {U.dims(b)}", b)
        if self.params["sum_out"]:
            s = node.inputs[0]
            if not (s.is_graph_output() or any(u is not node for u, _ in s.uses())):
                return _fail(QUIET + "the sum is not used elsewhere (the single-output variant applies)")
        eps = node.attributes.get("epsilon")
        self.state["epsilon"] = float(eps.value) if eps is not None else 1e-5
        return MatchResult()

    def rewrite(self, op, a, b, scale, bias=None, **_):
        return skip_norm(op, a, b, scale, bias, epsilon=self.state["epsilon"],
                         simplified=not self.params["kind"].startswith("ln"), sum_out=self.params["sum_out"])

    def benefit_hints(self, b):
        # unused optional outputs (mean, inv_std_dev, and the sum when nothing else reads
        # it) are left unnamed by the engine, so ONNX Runtime does not write them
        return {"row": b["a"]}


def skip_norm(op, a, b, scale, bias=None, *, epsilon: float, simplified: bool, sum_out: bool):
    """com.microsoft Skip(Simplified)LayerNormalization of ``a + b``; with ``sum_out`` also the
    sum itself (the op's 4th output) for the later residual."""
    if simplified:
        outs = op.SkipSimplifiedLayerNormalization(a, b, scale, epsilon=epsilon, _domain=MS, _outputs=4)
    else:
        args = [a, b, scale] + ([bias] if bias is not None else [])
        outs = op.SkipLayerNormalization(*args, epsilon=epsilon, _domain=MS, _outputs=4)
    return (outs[0], outs[3]) if sum_out else outs[0]


class SkipRMSNorm(SkipNorm):
    rule_name = "skip_rmsnorm"


class SumLayerNorm(FusionPattern):
    """Add(a, b) -> LayerNormalization rewritten as Sum(a, b) -> LayerNormalization.

    Not a fusion but the opposite: ONNX Runtime's optimizer fuses Add + LayerNormalization into
    its ``SkipLayerNormalization``, and on CPU that kernel measured several times slower than
    the two separate ops (ORT 1.32, 1 thread, [1, 128, 768]: 580 us against 107 us,
    benchmarks/results/onnx_kernel_alternatives.md). Its
    fusion looks for ``Add``; the same sum written as ``Sum`` is left alone. Calibration
    measures exactly that (the unfused micro-model runs under ORT_ENABLE_ALL, so it is the
    fused kernel), so where the fused kernel is faster this rule is not kept."""

    rule_name = "sum_layernorm"

    def pattern(self, op, a, b, scale, bias):
        s = op.Add(a, b, _outputs=["resid"])
        if self.params["kind"] == "ln":
            y = op.LayerNormalization(s, scale, bias, _allow_other_attributes=True, _outputs=["norm"])
        else:
            y = op.LayerNormalization(s, scale, _allow_other_attributes=True, _outputs=["norm"])
        return (y, s) if self.params["sum_out"] else y

    def validate(self, context, a, b, scale, norm, resid, bias=None, **_):
        node = norm.producer()
        if any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return _fail("mean / inv_std_dev outputs of the normalization are used", node)
        if U.rank(a) != 3 or not _same_shape(a, b):
            # the residual form ONNX Runtime fuses; a broadcast operand is a bias add, not a residual
            return _fail(QUIET + f"residual operands {U.dims(a)} and {U.dims(b)} are not one [B, S, D] shape", b)
        if self.params["sum_out"] and not (resid.is_graph_output() or any(u is not node for u, _ in resid.uses())):
            return _fail(QUIET + "the sum is not used elsewhere (the single-output variant applies)")
        self.state["attrs"] = {k: v.value for k, v in node.attributes.items()}
        return MatchResult()

    def rewrite(self, op, a, b, scale, bias=None, **_):
        s = op.Sum(a, b)
        args = [s, scale] + ([bias] if bias is not None else [])
        y = op.LayerNormalization(*args, **self.state["attrs"])
        return (y, s) if self.params["sum_out"] else y

    def benefit_hints(self, b):
        # the Sum writes the same tensor the Add wrote: nothing is saved that the estimate can see
        # (what is saved is ONNX Runtime's slower kernel, which only calibration measures)
        s = b["resid"]
        return {"row": b["a"], "added": [(s, U.dtype_name(s.dtype), 1)]}
