"""Rotary embedding: cos/sin caches applied to half-rotated q/k, as com.microsoft RotaryEmbedding."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult

from superkernel.onnx import _util as U
from superkernel.onnx.rules.base import FusionPattern, MS, _fail, shape_range


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
        if un is None or un.op_type != "Unsqueeze" or U.axes_of(un) not in ([1], [-3]):
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
        bs = shape_range(op, f, 0, 2, state["opset"])
        n = op.ReduceProd(bs, keepdims=0)
        pos = op.Reshape(op.Range(op.Constant(value_int=0), n, op.Constant(value_int=1)), bs)
    return pos, cc, sc
