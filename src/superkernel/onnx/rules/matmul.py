"""MatMul epilogues: bias + GELU, Gemm, scale, transposed operands."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult

from superkernel.onnx import _util as U
from superkernel.onnx.rules.base import FusionPattern, MS, QUIET, _fail


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
        other = U.rank(a if src is b else b)
        if U.rank(a) != U.rank(b) and (r != 2 or other is None or other < 2):
            # a 2-D transposed matrix broadcasts over the other operand's batch like MatMul's
            # (the tied LM head: hidden [B, S, H] @ Transpose(embedding [V, H]))
            return _fail("operands of different rank (batch broadcasting) and the transposed one is not 2-D", a)
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


def _concat_operand(x: ir.Value, w: ir.Value, like: ir.Value | None = None) -> str | None:
    """Why ``MatMul(x, w)`` cannot take part in a weight concatenation (None when it can)."""
    p = w.producer()
    if p is not None and p.op_type == "Transpose" and p.domain in ("", "ai.onnx"):
        return f"weight {w.name} is a Transpose output (transposed B), not a stored matrix"
    arr = U.const_array(w)
    if arr is None:
        return f"weight {w.name} is not a constant (initializer or Constant)"
    if arr.ndim != 2:
        return f"weight {w.name} of shape {list(arr.shape)} is not a 2-D matrix"
    if x.dtype not in U.FLOAT_TYPES:
        return f"input {x.name} dtype {x.dtype} is not a float type"
    if w.dtype is not None and w.dtype != x.dtype or arr.dtype != np.dtype(U.np_dtype(x.dtype)):
        return f"weight {w.name} dtype {arr.dtype} differs from the input's {U.dtype_name(x.dtype)}"
    if like is not None:
        ref = U.const_array(like)
        if ref is None or ref.dtype != arr.dtype or ref.shape[0] != arr.shape[0]:
            return f"weight {w.name} ({arr.dtype} {list(arr.shape)}) does not concatenate with {like.name}"
    return None


class MatMulConcat(FusionPattern):
    """MatMuls reading the same input with constant 2-D weights of one dtype (Q/K/V projections
    where attention is not fused, gate + up of a SwiGLU MLP) -> one MatMul on the weights
    concatenated along N, then Split (ONNX Runtime's CPU provider has no such fusion).

    The pattern roots at the group's first MatMul in graph order; the others (``siblings``)
    die with the fusion and their outputs are replaced by the Split's outputs (the engine
    reads ``state["also_replaces"]``)."""

    rule_name = "matmul_concat"
    commute_rule = False

    def pattern(self, op, x, w):
        return op.MatMul(x, w, _outputs=["y"])

    def validate(self, context, x, w, y, **_):
        root = y.producer()
        why = _concat_operand(x, w)
        if why:
            return _fail(QUIET + why)  # every lone MatMul would say this: not a near miss
        group, rejected = [root], []
        for user, idx in x.uses():
            if user is root or idx != 0 or user.op_type != "MatMul" or user.domain not in ("", "ai.onnx") \
                    or user in group or len(user.inputs) != 2:
                continue
            why = _concat_operand(x, user.inputs[1], like=w)
            if why:
                rejected.append((user, why))
            else:
                group.append(user)
        if len(group) < 2:
            if rejected:
                return _fail(f"the other MatMul of {x.name} cannot join: {rejected[0][1]}", rejected[0][0])
            return _fail(QUIET + f"no other MatMul reads {x.name}")
        graph = root.graph
        order = {n: i for i, n in enumerate(graph)} if graph is not None else {}
        group.sort(key=lambda n: order.get(n, 0))
        if group[0] is not root:
            return _fail(QUIET + "not the first MatMul of its group (the group is matched at its first)")
        self.state.update(siblings=group[1:], extra_nodes=group[1:],
                          sizes=[int(U.const_array(n.inputs[1]).shape[1]) for n in group])
        return MatchResult()

    def rewrite(self, op, x, w, **_):
        st = self.state
        weights = [U.const_array(w)] + [U.const_array(n.inputs[1]) for n in st["siblings"]]
        wc = op.Constant(value=ir.tensor(np.ascontiguousarray(np.concatenate(weights, axis=1))))
        y = op.MatMul(x, wc)
        k = len(weights)
        if st["opset"] >= 13:
            sizes = op.Constant(value=ir.tensor(np.array(st["sizes"], dtype=np.int64)))
            outs = op.Split(y, sizes, axis=-1, _outputs=k)
        else:  # opset 11-12: the sizes are an attribute
            outs = op.Split(y, axis=-1, split=st["sizes"], _outputs=k)
        st["also_replaces"] = [(n.outputs[0], o) for n, o in zip(st["siblings"], outs[1:])]
        return outs[0]

    def benefit_hints(self, b):
        # the concatenated product is written once and read by the Split
        y = b["y"]
        d = U.dims(y)
        if d is None:
            return {}
        return {"added": [([*d[:-1], sum(self.state.get("sizes", [0]))], U.dtype_name(y.dtype), 1)]}
