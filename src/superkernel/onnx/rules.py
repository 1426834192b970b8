"""The fusion rules: onnxscript rewriter patterns plus our checks and replacements.

Each class below matches one decomposed form (a *variant*) of a fusion from the catalog
(:mod:`superkernel.onnx.catalog`). The onnxscript pattern API does the structural
matching; ``validate`` checks what the structure cannot express (constants, axes,
shapes, opset) and returns a failed ``MatchResult`` with a reason, which the engine
reports as a near miss. ``rewrite`` builds the replacement, always with operators that
ONNX Runtime's CPU execution provider runs (see docs/graph_autofusion.md).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult

from . import _util as U

MS = "com.microsoft"
QUIET = "~"  # a check failure with this prefix is a variant mismatch, not a near miss worth reporting


def _fail(reason: str, *sources) -> MatchResult:
    return MatchResult().fail(reason, [s for s in sources if s is not None])


def _opset(context) -> int:
    return int(context.model.opset_imports.get("", context.model.opset_imports.get("ai.onnx", 0)) or 0)


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
        self.state = {"opset": _opset(context)}
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


# --------------------------------------------------------------------------------------
# Normalizations
# --------------------------------------------------------------------------------------


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
        if self.state["opset"] < 17:
            return _fail(f"LayerNormalization needs opset 17, model has {self.state['opset']}")
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
        return op.Mul(norm, scale)

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
        if self.params["kind"].startswith("ln"):
            args = [a, b, scale] + ([bias] if bias is not None else [])
            outs = op.SkipLayerNormalization(*args, epsilon=self.state["epsilon"], _domain=MS, _outputs=4)
        else:
            outs = op.SkipSimplifiedLayerNormalization(a, b, scale, epsilon=self.state["epsilon"], _domain=MS,
                                                       _outputs=4)
        return (outs[0], outs[3]) if self.params["sum_out"] else outs[0]

    def benefit_hints(self, b):
        # unused optional outputs (mean, inv_std_dev, and the sum when nothing else reads
        # it) are left unnamed by the engine, so ONNX Runtime does not write them
        return {"row": b["a"]}


class SkipRMSNorm(SkipNorm):
    rule_name = "skip_rmsnorm"


# --------------------------------------------------------------------------------------
# Activations
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# MatMul epilogues
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Rotary embedding and attention
# --------------------------------------------------------------------------------------


def _through_identity(v: ir.Value) -> tuple[ir.Value, float]:
    """Skip Casts to the same float type and Mul by a scalar constant (Hugging Face's
    ``attention_scaling`` and ``.to(dtype)`` after cos/sin); return (source, scale)."""
    scale = 1.0
    for _ in range(6):
        p = v.producer()
        if p is None or p.domain not in ("", "ai.onnx"):
            break
        if p.op_type == "Cast" and p.inputs[0].dtype is not None and U.attr_int(p, "to", 0) == int(p.inputs[0].dtype):
            v = p.inputs[0]
        elif p.op_type == "Mul" and U.scalar(p.inputs[1]) is not None and U.const_array(p.inputs[0]) is None:
            scale *= float(U.scalar(p.inputs[1]))
            v = p.inputs[0]
        elif p.op_type == "Mul" and U.scalar(p.inputs[0]) is not None and U.const_array(p.inputs[1]) is None:
            scale *= float(U.scalar(p.inputs[0]))
            v = p.inputs[1]
        else:
            break
    return v, scale


def _cos_sin_source(cos_u: ir.Value, sin_u: ir.Value):
    """Return ('freqs', f) when cos/sin are Unsqueeze(Cos/Sin(Concat(f, f)), [1]) (optionally
    with a no-op Cast / a scalar Mul after Cos/Sin), ('const', (cos_half, sin_half)) when
    they are constants (or Cos/Sin of a constant) with equal halves, or (None, why)."""
    ca, sa = U.const_array(cos_u), U.const_array(sin_u)
    if ca is not None and sa is not None:
        if ca.ndim != 4 or ca.shape[1] != 1:
            return None, f"constant cos/sin of shape {ca.shape} are not [B, 1, S, H]"
        h = ca.shape[-1] // 2
        if not (np.array_equal(ca[..., :h], ca[..., h:]) and np.array_equal(sa[..., :h], sa[..., h:])):
            return None, "constant cos/sin halves differ (not a half-rotation cache)"
        return "const", (ca[:, 0, :, :h], sa[:, 0, :, :h])
    srcs, scales, consts = [], [], []
    for v, trig in ((cos_u, "Cos"), (sin_u, "Sin")):
        un = v.producer()
        if un is None or un.op_type != "Unsqueeze" or U.ints(un.inputs[1]) not in ([1], [-3]):
            return None, f"{trig.lower()} is not Unsqueeze(..., axis 1) of a computed cache"
        src, sc = _through_identity(un.inputs[0])
        tn = src.producer()
        if tn is None or tn.op_type != trig:
            return None, (f"{trig.lower()} input is not produced by {trig} (found "
                          f"{tn.op_type if tn is not None else 'a graph input'} after skipping no-op Cast/scalar Mul)")
        arg = tn.inputs[0]
        const = U.const_array(arg)
        if const is not None:
            consts.append(const)
            srcs.append(arg)
            scales.append(sc)
            continue
        cn = arg.producer()
        if (cn is None or cn.op_type != "Concat" or len(cn.inputs) != 2 or cn.inputs[0] is not cn.inputs[1]
                or U.attr_int(cn, "axis", 0) not in (-1, 2)):
            return None, f"{trig} argument is not Concat(freqs, freqs) on the last axis"
        srcs.append(cn.inputs[0])
        scales.append(sc)
    if srcs[0] is not srcs[1]:
        return None, "cos and sin come from different frequencies"
    if len(consts) == 2:
        emb = consts[0].astype(np.float64)
        if emb.ndim != 3:
            return None, f"constant rotary angles of shape {emb.shape} are not [B, S, H]"
        h = emb.shape[-1] // 2
        if not np.array_equal(emb[..., :h], emb[..., h:]):
            return None, "constant rotary angles have different halves"
        dt = consts[0].dtype
        return "const", ((np.cos(emb[..., :h]) * scales[0]).astype(dt), (np.sin(emb[..., :h]) * scales[1]).astype(dt))
    return "freqs", (srcs[0], scales[0], scales[1])


class Rotary(FusionPattern):
    rule_name = "rotary"

    def pattern(self, op, x, cos, sin, s0, e0, ax0, st0, s1, e1, ax1, st1):
        x1 = op.Slice(x, s0, e0, ax0, st0)
        x2 = op.Slice(x, s1, e1, ax1, st1)
        rot = op.Concat(op.Neg(x2), x1, _allow_other_attributes=True, _outputs=["cat"])
        return op.Add(op.Mul(x, cos), op.Mul(rot, sin))

    def validate(self, context, x, cos, sin, s0, e0, ax0, st0, s1, e1, ax1, st1, cat, **_):
        xd = U.dims(x)
        if xd is None or len(xd) != 4 or not isinstance(xd[-1], int) or not isinstance(xd[1], int):
            return _fail(f"input shape {xd} is not [B, heads, S, head_dim] with known heads and head_dim", x)
        if x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
            return _fail("input dtype not supported by RotaryEmbedding", x)
        h = xd[-1]
        for ax in (ax0, ax1):
            if U.ints(ax) not in ([3], [-1]):
                return _fail(f"slices along axis {U.ints(ax)}, not the head dimension", ax)
        for st in (st0, st1):
            if st is not None and U.ints(st) != [1]:
                return _fail("slice steps are not 1", st)
        if U.attr_int(cat.producer(), "axis", 0) not in (-1, 3):
            return _fail("rotate_half concatenates along another axis", cat.producer())
        first, second = U.ints(s0), U.ints(e0)
        third, fourth = U.ints(s1), U.ints(e1)
        if not (first == [0] and second == [h // 2] and third == [h // 2] and fourth and fourth[0] >= h):
            return _fail(f"rotate_half split [{first}:{second}] / [{third}:{fourth}] is not two halves of {h}", x)
        kind, src = _cos_sin_source(cos, sin)
        if kind is None:
            return _fail(src, cos)
        self.state.update(kind=kind, src=src, head=h)
        return MatchResult()

    def rewrite(self, op, x, **_):
        pos, cc, sc = rotary_cache(op, self.state)
        return op.RotaryEmbedding(x, pos, cc, sc, interleaved=0, _domain=MS)

    def benefit_hints(self, b):
        h = self.state.get("head", 2)
        x = b["x"]
        d = U.dims(x)
        cache = [d[0], d[2], h // 2] if d else None
        if self.state.get("kind") == "const":
            return {}
        return {"added": [(cache, U.dtype_name(x.dtype), 1), (cache, U.dtype_name(x.dtype), 1)]}


def rotary_cache(op, state):
    """Position ids and cos/sin caches for com.microsoft RotaryEmbedding.

    The decomposed form has a cos/sin row per (batch, position). We flatten those rows into
    a cache of ``batch*seq`` rows and index it with ``position_ids = arange(batch*seq)``
    reshaped to [batch, seq], which is exact for any positions."""
    h2 = state["head"] // 2
    if state["kind"] == "const":
        ch, sh = state["src"]
        b, s = ch.shape[0], ch.shape[1]
        pos = op.Constant(value=ir.tensor(np.arange(b * s, dtype=np.int64).reshape(b, s)))
        cc = op.Constant(value=ir.tensor(np.ascontiguousarray(ch.reshape(b * s, h2))))
        sc = op.Constant(value=ir.tensor(np.ascontiguousarray(sh.reshape(b * s, h2))))
        return pos, cc, sc
    f, cos_scale, sin_scale = state["src"]
    fd = U.dims(f)
    flat = op.Constant(value=ir.tensor(np.array([-1, h2], dtype=np.int64)))
    cos, sin = op.Cos(f), op.Sin(f)
    if cos_scale != 1.0:
        cos = op.Mul(cos, op.Constant(value=ir.tensor(np.array(cos_scale, dtype=U.np_dtype(f.dtype)))))
    if sin_scale != 1.0:
        sin = op.Mul(sin, op.Constant(value=ir.tensor(np.array(sin_scale, dtype=U.np_dtype(f.dtype)))))
    cc = op.Reshape(cos, flat)
    sc = op.Reshape(sin, flat)
    if fd is not None and isinstance(fd[0], int) and isinstance(fd[1], int):
        pos = op.Constant(value=ir.tensor(np.arange(fd[0] * fd[1], dtype=np.int64).reshape(fd[0], fd[1])))
    else:
        bs = op.Shape(f, start=0, end=2)
        n = op.ReduceProd(bs, keepdims=0)
        pos = op.Reshape(op.Range(op.Constant(value_int=0), n, op.Constant(value_int=1)), bs)
    return pos, cc, sc


def _mask_value(mask: ir.Value) -> np.ndarray | None:
    """A constant mask, or Trilu(constant, k) as the exporter leaves large causal masks."""
    m = U.const_array(mask)
    if m is not None:
        return m
    p = mask.producer()
    if p is not None and p.op_type == "Trilu" and p.domain in ("", "ai.onnx"):
        base = U.const_array(p.inputs[0])
        k = U.scalar(p.inputs[1]) if len(p.inputs) > 1 and p.inputs[1] is not None else 0
        if base is not None and k is not None and base.ndim >= 2:
            upper = U.attr_int(p, "upper", 1)
            return np.triu(base, int(k)) if upper else np.tril(base, int(k))
    return None


def _is_causal_mask(mask: ir.Value) -> str | None:
    m = _mask_value(mask)
    if m is None:
        return "mask is not a constant"
    if m.ndim < 2 or any(d != 1 for d in m.shape[:-2]) or m.shape[-1] != m.shape[-2]:
        return f"mask shape {m.shape} is not [S, S] (batch- and head-independent)"
    m2 = m.reshape(m.shape[-2:]).astype(np.float64)
    upper = np.triu(np.ones(m2.shape, dtype=bool), 1)
    if not (np.all(m2[~upper] == 0) and np.all(m2[upper] <= -1e4)):
        return "mask is not causal (0 on and below the diagonal, large negative above)"
    return None


def _heads_view(reshape_shape: ir.Value, src: ir.Value) -> tuple[int, int] | None:
    """(heads, head_dim) from a Reshape target [B, S, heads, head_dim]."""
    s = U.ints(reshape_shape)
    if s is None or len(s) != 4:
        return None
    heads, hd = s[2], s[3]
    d = U.last_dim(src)
    if hd == -1 and heads > 0 and d is not None and d % heads == 0:  # [B, S, heads, -1]
        hd = d // heads
    if heads == -1 and hd > 0 and d is not None and d % hd == 0:  # Hugging Face: [B, S, -1, head_dim]
        heads = d // hd
    if heads <= 0 or hd <= 0 or (d is not None and heads * hd != d):
        return None
    return heads, hd


class CausalGQA(FusionPattern):
    """Causal attention (optionally grouped, optionally with rotary) -> GroupQueryAttention."""

    rule_name = "gqa"
    commute_rule = False

    def pattern(self, op, q3, k3, v3, qs, ks, vs, qpos, qcc, qsc, kpos, kcc, ksc, ek, rk, ev, rv, scale, mask,
                os_):
        q = op.Transpose(op.Reshape(q3, qs, _allow_other_attributes=True), perm=[0, 2, 1, 3])
        k = op.Transpose(op.Reshape(k3, ks, _allow_other_attributes=True), perm=[0, 2, 1, 3])
        v = op.Transpose(op.Reshape(v3, vs, _allow_other_attributes=True), perm=[0, 2, 1, 3])
        if self.params["rotary"]:
            q = op.RotaryEmbedding(q, qpos, qcc, qsc, _domain=MS, _allow_other_attributes=True, _outputs=["qrot"])
            k = op.RotaryEmbedding(k, kpos, kcc, ksc, _domain=MS, _allow_other_attributes=True, _outputs=["krot"])
        if self.params["repeat"]:
            k = op.Reshape(op.Expand(op.Unsqueeze(k, [2]), ek), rk, _allow_other_attributes=True)
            v = op.Reshape(op.Expand(op.Unsqueeze(v, [2]), ev), rv, _allow_other_attributes=True)
        if self.params.get("kt") == "direct":  # the exporter merged both transposes of k
            kt = op.Transpose(op.Reshape(k3, ks, _allow_other_attributes=True), perm=[0, 2, 3, 1])
        else:
            kt = op.Transpose(k, perm=[0, 1, 3, 2])
        scores = op.MatMul(q, kt)
        scores = op.Div(scores, scale) if self.params["op"] == "div" else op.Mul(scores, scale)
        probs = op.Softmax(op.Add(scores, mask), _outputs=["probs"])
        ctx = op.MatMul(probs, v)
        return op.Reshape(op.Transpose(ctx, perm=[0, 2, 1, 3]), os_, _allow_other_attributes=True)

    def validate(self, context, q3, k3, v3, qs, ks, vs, scale, mask, probs, os_, qrot=None, krot=None, **_):
        if q3.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return _fail("GroupQueryAttention on CPU takes float32/float16", q3)
        hq, hk, hv = _heads_view(qs, q3), _heads_view(ks, k3), _heads_view(vs, v3)
        if hq is None or hk is None or hv is None:
            return _fail("q/k/v reshape targets are not constant [B, S, heads, head_dim]", qs)
        if hk != hv or hq[1] != hk[1] or hq[0] % hk[0]:
            return _fail(f"head layout q{hq} k{hk} v{hv} is not grouped-query compatible", ks)
        if not self.params["repeat"] and hq[0] != hk[0]:
            return _fail("kv heads differ from query heads without repeat_kv", ks)
        if U.attr_int(probs.producer(), "axis", -1) not in (-1, 3):
            return _fail(f"softmax over axis {U.attr_int(probs.producer(), 'axis', -1)}, not the key axis",
                         probs.producer())
        why = _is_causal_mask(mask)
        if why:
            return _fail(why, mask)
        sv = U.scalar(scale)
        if sv is None or sv == 0:
            return _fail("attention scale is not a scalar constant", scale)
        osd = U.ints(os_)
        if osd is None or len(osd) != 3 or osd[2] not in (hq[0] * hq[1], -1):
            return _fail(f"output reshape {osd} is not [B, S, heads*head_dim]", os_)
        for rot in (qrot, krot):
            if rot is not None:
                a = {k: v.value for k, v in rot.producer().attributes.items()}
                if a.get("interleaved", 0) or a.get("rotary_embedding_dim", 0) or a.get("is_packed_batching", 0):
                    return _fail("rotary embedding attributes not supported in the 3-D form", rot.producer())
        self.state.update(heads=hq[0], kv_heads=hk[0], head=hq[1],
                          scale=float(1.0 / sv if self.params["op"] == "div" else sv))
        return MatchResult()

    def rewrite(self, op, q3, k3, v3, qpos=None, qcc=None, qsc=None, kpos=None, kcc=None, ksc=None, **_):
        st = self.state
        qd = U.dims(q3)
        if self.params["rotary"]:
            q3 = op.RotaryEmbedding(q3, qpos, qcc, qsc, num_heads=st["heads"], interleaved=0, _domain=MS)
            k3 = op.RotaryEmbedding(k3, kpos, kcc, ksc, num_heads=st["kv_heads"], interleaved=0, _domain=MS)
        if qd is not None and len(qd) == 3 and isinstance(qd[0], int) and isinstance(qd[1], int):
            seqlens = op.Constant(value=ir.tensor(np.full((qd[0],), qd[1] - 1, dtype=np.int32)))
            total = op.Constant(value=ir.tensor(np.array(qd[1], dtype=np.int32)))
        else:
            b = op.Shape(q3, start=0, end=1)
            s = op.Cast(op.Shape(q3, start=1, end=2), to=ir.DataType.INT32)
            seqlens = op.Expand(op.Sub(s, op.Constant(value=ir.tensor(np.array([1], np.int32)))), b)
            total = op.Squeeze(s, op.Constant(value=ir.tensor(np.array([0], np.int64))))
        outs = op.GroupQueryAttention(q3, k3, v3, None, None, seqlens, total, num_heads=st["heads"],
                                      kv_num_heads=st["kv_heads"], scale=st["scale"], _domain=MS, _outputs=3)
        return outs[0]



class PaddedMHA(FusionPattern):
    """Bidirectional attention with an additive mask (BERT) -> MultiHeadAttention."""

    rule_name = "mha"
    commute_rule = False

    def pattern(self, op, q3, k3, v3, qs, ks, vs, scale, mask, os_):
        q = op.Transpose(op.Reshape(q3, qs, _allow_other_attributes=True), perm=[0, 2, 1, 3])
        k4 = op.Reshape(k3, ks, _allow_other_attributes=True)
        if self.params["kt"] == "direct":
            kt = op.Transpose(k4, perm=[0, 2, 3, 1])
        else:
            kt = op.Transpose(op.Transpose(k4, perm=[0, 2, 1, 3]), perm=[0, 1, 3, 2])
        v = op.Transpose(op.Reshape(v3, vs, _allow_other_attributes=True), perm=[0, 2, 1, 3])
        scores = op.MatMul(q, kt)
        scores = op.Div(scores, scale) if self.params["op"] == "div" else op.Mul(scores, scale)
        if self.params["mask"]:
            scores = op.Add(scores, mask)
        probs = op.Softmax(scores, _outputs=["probs"])
        ctx = op.MatMul(probs, v)
        return op.Reshape(op.Transpose(ctx, perm=[0, 2, 1, 3]), os_, _allow_other_attributes=True)

    def validate(self, context, q3, k3, v3, qs, ks, vs, scale, probs, os_, mask=None, **_):
        if q3.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return _fail("MultiHeadAttention on CPU takes float32/float16", q3)
        hq, hk, hv = _heads_view(qs, q3), _heads_view(ks, k3), _heads_view(vs, v3)
        if hq is None or hq != hk or hq != hv:
            return _fail(f"q/k/v head layouts {hq} {hk} {hv} differ or are not constant", qs)
        if U.attr_int(probs.producer(), "axis", -1) not in (-1, 3):
            return _fail(f"softmax over axis {U.attr_int(probs.producer(), 'axis', -1)}, not the key axis",
                         probs.producer())
        sv = U.scalar(scale)
        if sv is None or sv == 0:
            return _fail("attention scale is not a scalar constant", scale)
        if mask is not None:
            md = U.dims(mask)
            if md is None or len(md) != 4 or md[1] != 1:
                return _fail(f"mask shape {md} is not [B|1, 1, S|1, T]", mask)
            if mask.dtype != q3.dtype:
                return _fail("mask dtype differs from the activations", mask)
        osd = U.ints(os_)
        if osd is None or len(osd) != 3 or osd[2] not in (hq[0] * hq[1], -1):
            return _fail(f"output reshape {osd} is not [B, S, heads*head_dim]", os_)
        self.state.update(heads=hq[0], scale=float(1.0 / sv if self.params["op"] == "div" else sv))
        return MatchResult()

    def rewrite(self, op, q3, k3, v3, mask=None, **_):
        bias = None
        if mask is not None:
            md = U.dims(mask)
            if md[2] == 1:  # [B, 1, 1, T] -> [B, 1, S, T]: MHA wants the query axis spelled out
                s = op.Shape(q3, start=1, end=2)
                tgt = op.Concat(op.Shape(mask, start=0, end=2), s, op.Shape(mask, start=3, end=4), axis=0)
                bias = op.Expand(mask, tgt)
            else:
                bias = mask
        return op.MultiHeadAttention(q3, k3, v3, None, None, bias, num_heads=self.state["heads"],
                                     scale=self.state["scale"], _domain=MS)

    def benefit_hints(self, b):
        mask = b.get("mask")
        if mask is None or (U.dims(mask) or [0, 0, 0])[2] != 1:
            return {}
        md, qd = U.dims(mask), U.dims(b["q3"])
        return {"added": [([md[0], 1, qd[1] if qd else 1, md[3]], U.dtype_name(mask.dtype), 1)]}


def _k_of_kt(kt: ir.Value) -> tuple[ir.Value | None, str, list[int] | None]:
    """The key in [B, N, T, hd] such that ``kt`` is it with the last two axes swapped:
    Transpose(k4, [0, 1, 3, 2]) gives (k4, "", None); the dynamo exporter's SDPA form
    Reshape(Transpose(k3, [0, 2, 1]), [B, N, hd, T]) with k3 = Reshape(..., [B*N, T, hd])
    gives (k3, "", [B, N, T, hd]) (the rewrite reshapes k3 back to 4-D)."""
    p = kt.producer()
    if p is None:
        return None, "key^T is a graph input or constant", None
    if p.op_type == "Transpose" and U.attr_ints(p, "perm") == [0, 1, 3, 2]:
        return p.inputs[0], "", None
    if p.op_type == "Transpose" and U.attr_ints(p, "perm") == [0, 2, 3, 1]:
        # both transposes of k merged by the exporter: kt = k[B, S, N, hd].permute(0, 2, 3, 1)
        return p.inputs[0], "", "bsnh"
    if p.op_type == "Reshape":
        t = p.inputs[0].producer()
        if t is not None and t.op_type == "Transpose" and U.attr_ints(t, "perm") == [0, 2, 1]:
            k3 = t.inputs[0]
            d3, ktd = U.dims(k3), U.dims(kt)
            if d3 and ktd and len(d3) == 3 and len(ktd) == 4 and all(isinstance(x, int) for x in d3 + ktd) \
                    and d3[0] == ktd[0] * ktd[1] and d3[1] == ktd[3] and d3[2] == ktd[2]:
                return k3, "", [ktd[0], ktd[1], ktd[3], ktd[2]]
    return None, f"key^T is produced by {p.op_type}, not a transpose of the last two axes of a [B, N, T, hd] key", None


class AttentionCore(FusionPattern):
    """Scaled dot-product attention on [B, N, S, hd] tensors as both exporters write it
    (Hugging Face eager attention, SDPA decompositions with the scale split over q and k^T
    and the IsNaN guard, repeated K/V of grouped-query attention, decode steps whose K/V
    are the concatenation with the past) -> com.microsoft MultiHeadAttention with the
    key/value in [B, N, T, hd] and the mask as attention bias."""

    rule_name = "attention"
    commute_rule = False

    def pattern(self, op, q4, kt, v4, s1, s2, sc, mask, zero, oshape):
        form = self.params["scale"]
        if form == "qk":
            scores = op.MatMul(op.Mul(q4, s1), op.Mul(kt, s2), _outputs=["qk"])
        else:
            scores = op.MatMul(q4, kt, _outputs=["qk"])
            if form == "mul":
                scores = op.Mul(scores, sc)
            elif form == "div":
                scores = op.Div(scores, sc)
        if self.params["mask"]:
            scores = op.Add(scores, mask)
        p = op.Softmax(scores, _outputs=["probs"])
        if self.params["guard"]:
            p = op.Where(op.IsNaN(p), zero, p)
        for i in range(self.params["casts"]):
            p = op.Cast(p, _allow_other_attributes=True, _outputs=[f"cast{i}"])
        ctx = op.MatMul(p, v4)
        if self.params.get("tail"):  # ctx.transpose(1, 2).reshape(B, S, N*hd), part of the fusion
            return op.Reshape(op.Transpose(ctx, perm=[0, 2, 1, 3]), oshape, _allow_other_attributes=True)
        return ctx

    def validate(self, context, q4, kt, v4, probs, s1=None, s2=None, sc=None, mask=None, zero=None, oshape=None,
                 **kw):
        if q4.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return _fail("MultiHeadAttention on CPU takes float32/float16", q4)
        k4, why, k_shape = _k_of_kt(kt)
        if k4 is None:
            return _fail(why, kt)
        kd = U.dims(k4)
        if k_shape == "bsnh":
            kd = [kd[0], kd[2], kd[1], kd[3]] if kd and len(kd) == 4 else None
        elif k_shape is not None:
            kd = k_shape
        qd, vd = U.dims(q4), U.dims(v4)
        if not (qd and kd and vd and len(qd) == len(kd) == len(vd) == 4):
            return _fail(f"q/k/v shapes {qd} {kd} {vd} are not all [B, N, S, hd]", q4)
        n, hd, hdv = qd[1], qd[3], vd[3]
        if not all(isinstance(x, int) for x in (n, hd, hdv)):
            return _fail(f"heads/head size of q {qd} are not static", q4)
        if kd[1] != n or vd[1] != n:
            return _fail(f"q has {n} heads but k/v have {kd[1]}/{vd[1]} (repeat_kv not in the graph)", k4)
        if kd[3] != hd or kd[2] != vd[2]:
            return _fail(f"key {kd} and value {vd} do not fit the query {qd}", k4)
        if U.attr_int(probs.producer(), "axis", -1) not in (-1, 3):
            return _fail(f"softmax over axis {U.attr_int(probs.producer(), 'axis', -1)}, not the key axis",
                         probs.producer())
        form = self.params["scale"]
        if form == "qk":
            a, b = U.scalar(s1), U.scalar(s2)
            if a is None or b is None:
                return _fail("q and k^T scales are not scalar constants", s1)
            scale = float(a) * float(b)
        elif form in ("mul", "div"):
            v = U.scalar(sc)
            if v is None or v == 0:
                return _fail("attention scale is not a non-zero scalar constant", sc)
            scale = float(v) if form == "mul" else 1.0 / float(v)
        else:
            scale = 1.0
        if zero is not None and U.scalar(zero) != 0:
            return _fail("the NaN guard does not replace NaN by 0", zero)
        for i in range(self.params["casts"]):
            c = kw.get(f"cast{i}")
            if c is None or U.attr_int(c.producer(), "to", 0) != int(q4.dtype):
                return _fail("a Cast after the softmax changes the dtype", c.producer() if c is not None else None)
        if mask is not None:
            md = U.dims(mask)
            if md is None or len(md) != 4 or md[1] not in (1, n) or md[0] not in (1, qd[0]) or \
                    md[3] != kd[2] or md[2] not in (1, qd[2]):
                return _fail(f"mask shape {md} is not [B|1, 1|N, S|1, T] for q {qd} and k {kd}", mask)
            if mask.dtype != q4.dtype:
                return _fail("mask dtype differs from the activations", mask)
        if oshape is not None:
            od = U.ints(oshape)
            if od is None or len(od) != 3 or od[2] not in (-1, n * hdv) or od[1] not in (-1, 0, qd[2]):
                return _fail(f"output reshape {od} is not [B, S, heads*head_dim]", oshape)
        self.state.update(heads=n, head=hd, vhead=hdv, scale=scale, k_mode=k_shape,
                          extra_nodes=_kt_chain(kt, k4))
        return self.validate_inputs(q4, k4, v4, kd)

    def validate_inputs(self, q4, k4, v4, kd) -> MatchResult:
        return MatchResult()

    def _bias(self, op, q4, mask):
        if mask is None:
            return None
        md, qd = U.dims(mask), U.dims(q4)
        if md[2] == 1 and qd[2] != 1:  # MultiHeadAttention/Attention want the query axis spelled out
            tgt = op.Concat(op.Shape(mask, start=0, end=2), op.Shape(q4, start=2, end=3),
                            op.Shape(mask, start=3, end=4), axis=0)
            return op.Expand(mask, tgt)
        return mask

    def _out(self, op, out3):
        if self.params.get("tail"):
            return out3
        st = self.state
        out4 = op.Reshape(out3, op.Constant(value=ir.tensor(np.array([0, 0, st["heads"], st["vhead"]],
                                                                         dtype=np.int64))))
        return op.Transpose(out4, perm=[0, 2, 1, 3])

    def rewrite(self, op, q4, kt, v4, mask=None, **_):
        st = self.state
        k4, _why, k_shape = _k_of_kt(kt)
        if k_shape == "bsnh":
            k4 = op.Transpose(k4, perm=[0, 2, 1, 3])
        elif k_shape is not None:
            k4 = op.Reshape(k4, op.Constant(value=ir.tensor(np.array(k_shape, dtype=np.int64))))
        n, hd, hdv = st["heads"], st["head"], st["vhead"]
        q3 = op.Reshape(op.Transpose(q4, perm=[0, 2, 1, 3]),
                        op.Constant(value=ir.tensor(np.array([0, 0, n * hd], dtype=np.int64))))
        out3 = op.MultiHeadAttention(q3, k4, v4, None, None, self._bias(op, q4, mask), num_heads=n,
                                     scale=st["scale"], _domain=MS)
        return self._out(op, out3)


def _kt_chain(kt: ir.Value, k_src: ir.Value) -> list[ir.Node]:
    """The nodes from ``k_src`` to ``kt`` (the transpose of the key), in graph order, when
    each is used only on that path (they die with the fusion), else []."""
    chain, v = [], kt
    while v is not k_src:
        p = v.producer()
        if p is None or len(v.uses()) != 1 or v.is_graph_output():
            return []
        chain.append(p)
        v = p.inputs[0]
        if len(chain) > 3:
            return []
    return list(reversed(chain))


def _projection(v4: ir.Value, mode=None):
    """For q/k/v in [B, N, S, hd] that are Transpose(Reshape(x @ W [+ b], [B, S, N, hd]),
    [0, 2, 1, 3]) return (x, W, b or None, intermediates), else (None, why).
    ``mode`` 'bsnh': the value given is already the Reshape output [B, S, N, hd];
    'k3': it is Reshape(k4, [B*N, T, hd]) of such a k4."""
    chain = []
    v = v4
    if mode == "k3":
        p = v.producer()
        if p is None or p.op_type != "Reshape":
            return None, "key is not a reshape of a [B, N, T, hd] projection"
        chain.append(p)
        v = p.inputs[0]
    if mode != "bsnh":
        t = v.producer()
        if t is None or t.op_type != "Transpose" or U.attr_ints(t, "perm") != [0, 2, 1, 3]:
            return None, "not Transpose(..., [0, 2, 1, 3]) of a head view"
        chain.append(t)
        v = t.inputs[0]
    r = v.producer()
    if r is None or r.op_type != "Reshape":
        return None, "not a head view (Reshape) of a projection"
    chain.append(r)
    proj = r.inputs[0]
    p = proj.producer()
    bias = None
    if p is not None and p.op_type == "Add":
        a, b = p.inputs
        if U.const_array(b) is not None and a.producer() is not None and a.producer().op_type == "MatMul":
            bias, mm = b, a.producer()
        elif U.const_array(a) is not None and b.producer() is not None and b.producer().op_type == "MatMul":
            bias, mm = a, b.producer()
        else:
            return None, "projection bias is not a constant added to a MatMul"
        chain.append(p)
    elif p is not None and p.op_type == "MatMul":
        mm = p
    else:
        return None, "head view input is not a MatMul projection"
    chain.append(mm)
    x, w = mm.inputs
    if U.const_array(w) is None or U.rank(w) != 2:
        return None, "projection weight is not a constant 2-D matrix"
    if bias is not None and U.rank(bias) != 1:
        return None, "projection bias is not 1-D"
    for n in chain:
        for o in n.outputs:
            if len(o.uses()) != 1 or o.is_graph_output():
                return None, f"projection intermediate {o.name} has other uses"
    return (x, w, bias, chain), ""


class PackedAttention(AttentionCore):
    """Self-attention whose q, k and v are projections of one input with constant weights
    -> com.microsoft Attention with the three weights packed into one [D, 3D] matrix (one
    GEMM instead of three) and the mask as attention bias."""

    rule_name = "packed_attention"

    def validate_inputs(self, q4, k4, v4, kd) -> MatchResult:
        mode = self.state["k_mode"]
        kq, why = _projection(q4)
        if kq is None:
            return _fail(f"query: {why}", q4)
        kk, why = _projection(k4, "bsnh" if mode == "bsnh" else "k3" if mode is not None else None)
        if kk is None:
            return _fail(f"key: {why}", k4)
        kv, why = _projection(v4)
        if kv is None:
            return _fail(f"value: {why}", v4)
        if not (kq[0] is kk[0] is kv[0]):
            return _fail("q, k and v are projections of different inputs (not self-attention)", k4)
        ws = [U.const_array(t[1]) for t in (kq, kk, kv)]
        if len({w.shape[0] for w in ws}) != 1 or ws[0].shape[1] != ws[1].shape[1]:
            return _fail(f"projection weights {[w.shape for w in ws]} do not pack", kq[1])
        if ws[0].dtype != np.dtype(U.np_dtype(q4.dtype)):
            return _fail("projection weights have another dtype than the activations", kq[1])
        xd = U.dims(kq[0])
        if xd is None or len(xd) != 3:
            return _fail(f"attention input shape {xd} is not [B, S, D]", kq[0])
        bs = []
        for t, w in zip((kq, kk, kv), ws):
            b = U.const_array(t[2]) if t[2] is not None else np.zeros((w.shape[1],), dtype=w.dtype)
            bs.append(b.astype(w.dtype))
        self.state.update(x=kq[0], w=np.concatenate(ws, axis=1), b=np.concatenate(bs),
                          hidden=(ws[0].shape[1], ws[1].shape[1], ws[2].shape[1]))
        # the projections die with the fusion: measured and counted with it
        extra = [n for t in (kq, kk, kv) for n in reversed(t[3])]
        self.state["extra_nodes"] = extra + [n for n in self.state.get("extra_nodes", []) if n not in extra]
        return MatchResult()

    def rewrite(self, op, q4, kt, v4, mask=None, **_):
        st = self.state
        w = op.Constant(value=ir.tensor(np.ascontiguousarray(st["w"])))
        b = op.Constant(value=ir.tensor(np.ascontiguousarray(st["b"])))
        qh, kh, vh = st["hidden"]
        attrs = {} if qh == kh == vh else {"qkv_hidden_sizes": [qh, kh, vh]}
        out3 = op.Attention(st["x"], w, b, None, None, self._bias(op, q4, mask), num_heads=st["heads"],
                            scale=st["scale"], _domain=MS, **attrs)
        return self._out(op, out3)



class EmbedLayerNorm(FusionPattern):
    """LayerNorm(Gather(word_table, input_ids) + constant position [+ token type] rows)
    -> com.microsoft EmbedLayerNormalization (the constant rows summed into its position
    table, indexed by the default positions 0..S-1)."""

    rule_name = "embed_layernorm"

    def pattern(self, op, table, ids, e2, e3, scale, bias):
        word = op.Gather(table, ids, _allow_other_attributes=True, _outputs=["word"])
        s = op.Add(word, e2)
        if self.params["extra"]:
            s = op.Add(s, e3)
        return op.LayerNormalization(s, scale, bias, _allow_other_attributes=True, _outputs=["norm"])

    def validate(self, context, table, ids, e2, scale, bias, word, norm, e3=None, **_):
        w = U.const_array(table)
        if w is None or w.ndim != 2 or w.dtype != np.float32:
            return _fail("word embedding table is not a constant float32 [V, D] matrix", table)
        if U.attr_int(word.producer(), "axis", 0) != 0:
            return _fail("Gather is not along the table rows", word.producer())
        idd = U.dims(ids)
        if ids.dtype not in (ir.DataType.INT64, ir.DataType.INT32) or idd is None or len(idd) != 2 \
                or not isinstance(idd[1], int):
            return _fail(f"token ids {idd} are not [B, S] integers with a static S", ids)
        node = norm.producer()
        if U.attr_int(node, "axis", -1) not in (-1, 2) or any(o.uses() or o.is_graph_output()
                                                             for o in node.outputs[1:]):
            return _fail("normalization is not over the hidden axis or its statistics are used", node)
        seq, d = idd[1], w.shape[1]
        rows = np.zeros((seq, d), dtype=np.float32)
        for e in (e2, e3):
            if e is None:
                continue
            a = U.eval_const(e)
            if a is None:
                return _fail("position/token-type embedding is not computed from constants "
                             "(e.g. position ids from an input)", e)
            a = np.asarray(a, dtype=np.float32)
            if a.ndim == 3 and (a.shape[0] == 1 or all(np.array_equal(a[0], a[i]) for i in range(1, a.shape[0]))):
                a = a[0]  # the same rows for every batch entry
            if a.shape != (seq, d):
                return _fail(f"position/token-type rows of shape {a.shape} are not [S, D] = [{seq}, {d}] "
                             "(batch-independent)", e)
            rows = rows + a
        eps = node.attributes.get("epsilon")
        self.state.update(rows=rows, epsilon=float(eps.value) if eps is not None else 1e-5)
        return MatchResult()

    def rewrite(self, op, table, ids, scale, bias, **_):
        ids32 = op.Cast(ids, to=ir.DataType.INT32) if ids.dtype != ir.DataType.INT32 else ids
        pos = op.Constant(value=ir.tensor(self.state["rows"]))
        outs = op.EmbedLayerNormalization(ids32, None, table, pos, None, scale, bias,
                                          epsilon=self.state["epsilon"], _domain=MS, _outputs=2)
        return outs[0]


# --------------------------------------------------------------------------------------
# Composite forms: the epilogue fused together with a decomposed norm / activation, so that
# they are found (and measured) even where the inner fusion alone is not kept.
# --------------------------------------------------------------------------------------


class SkipRMSNormDecomposed(RMSNormDecomposed):
    """Add(a, b) [-> Cast to the same dtype] -> decomposed RMSNorm
    -> com.microsoft SkipSimplifiedLayerNormalization (4th output = the sum when used later)."""

    rule_name = "skip_rmsnorm"
    commute_rule = False  # written out in the operand orders both exporters use (commuting it all is slow)

    def pattern(self, op, a, b, two, axes, eps, scale, one):
        s = op.Add(a, b, _outputs=["s"])
        x = op.Cast(s, _allow_other_attributes=True, _outputs=["x"]) if self.params.get("in_cast") else s
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
        outs = op.SkipSimplifiedLayerNormalization(a, b, scale, epsilon=self.state["epsilon"], _domain=MS,
                                                   _outputs=4)
        return (outs[0], outs[3]) if self.params["sum_out"] else outs[0]

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
