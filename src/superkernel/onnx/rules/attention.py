"""Attention as exported today: HF eager and SDPA decompositions, causal/padding masks,
repeat_kv (GQA) and packed Q/K/V projections. The decode step with past K/V is in
:mod:`superkernel.onnx.rules.attention_decode`."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult

from superkernel.onnx import _util as U
from superkernel.onnx.rules.base import FusionPattern, MS, _fail, shape_range, softmax_on_last_axis, squeeze0


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


def _rotary_3d_ok(rot: ir.Node) -> bool:
    """Whether a 4-D RotaryEmbedding can be applied in the 3-D form before GroupQueryAttention
    (not interleaved, the whole head rotated, no packed batching)."""
    a = {k: x.value for k, x in rot.attributes.items()}
    return not (a.get("interleaved", 0) or a.get("rotary_embedding_dim", 0) or a.get("is_packed_batching", 0))


def _rotary_3d(rot: ir.Node, heads: int) -> dict:
    """The attributes of a 4-D RotaryEmbedding for its 3-D form ([B, S, heads*hd] input)."""
    attrs = {k: a.value for k, a in rot.attributes.items()}
    attrs.update(num_heads=heads, interleaved=attrs.get("interleaved", 0))
    return attrs


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
            # axes as an input (opset >= 13) or an attribute (11-12): checked in validate
            uk = op.Unsqueeze(k, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["uk"])
            uv = op.Unsqueeze(v, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["uv"])
            k = op.Reshape(op.Expand(uk, ek), rk, _allow_other_attributes=True)
            v = op.Reshape(op.Expand(uv, ev), rv, _allow_other_attributes=True)
        if self.params.get("kt") == "direct":  # the exporter merged both transposes of k
            kt = op.Transpose(op.Reshape(k3, ks, _allow_other_attributes=True), perm=[0, 2, 3, 1])
        else:
            kt = op.Transpose(k, perm=[0, 1, 3, 2])
        scores = op.MatMul(q, kt)
        scores = op.Div(scores, scale) if self.params["op"] == "div" else op.Mul(scores, scale)
        probs = op.Softmax(op.Add(scores, mask), _outputs=["probs"])
        ctx = op.MatMul(probs, v)
        return op.Reshape(op.Transpose(ctx, perm=[0, 2, 1, 3]), os_, _allow_other_attributes=True)

    def validate(self, context, q3, k3, v3, qs, ks, vs, scale, mask, probs, os_, qrot=None, krot=None, uk=None,
                 uv=None, **_):
        if q3.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return _fail("GroupQueryAttention on CPU takes float32/float16", q3)
        for u in (uk, uv):
            if u is not None and U.axes_of(u.producer()) != [2]:
                return _fail(f"repeat_kv Unsqueeze axes {U.axes_of(u.producer())} are not [2]", u.producer())
        hq, hk, hv = _heads_view(qs, q3), _heads_view(ks, k3), _heads_view(vs, v3)
        if hq is None or hk is None or hv is None:
            return _fail("q/k/v reshape targets are not constant [B, S, heads, head_dim]", qs)
        if hk != hv or hq[1] != hk[1] or hq[0] % hk[0]:
            return _fail(f"head layout q{hq} k{hk} v{hv} is not grouped-query compatible", ks)
        if not self.params["repeat"] and hq[0] != hk[0]:
            return _fail("kv heads differ from query heads without repeat_kv", ks)
        axis = softmax_on_last_axis(probs.producer(), 4, self.state["opset"])
        if axis is not None:
            return _fail(f"softmax over axis {axis}, not the key axis", probs.producer())
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
            if rot is not None and not _rotary_3d_ok(rot.producer()):
                return _fail("rotary embedding attributes not supported in the 3-D form", rot.producer())
        self.state.update(heads=hq[0], kv_heads=hk[0], head=hq[1],
                          scale=float(1.0 / sv if self.params["op"] == "div" else sv),
                          qrot=qrot.producer() if qrot is not None else None,
                          krot=krot.producer() if krot is not None else None)
        return MatchResult()

    def rewrite(self, op, q3, k3, v3, qpos=None, qcc=None, qsc=None, kpos=None, kcc=None, ksc=None, **_):
        st = self.state
        qd = U.dims(q3)
        if self.params["rotary"]:
            # the 4-D nodes' own attributes (scale) carry over; only the head count changes
            q3 = op.RotaryEmbedding(q3, qpos, qcc, qsc, **_rotary_3d(st["qrot"], st["heads"]), _domain=MS)
            k3 = op.RotaryEmbedding(k3, kpos, kcc, ksc, **_rotary_3d(st["krot"], st["kv_heads"]), _domain=MS)
        if qd is not None and len(qd) == 3 and isinstance(qd[0], int) and isinstance(qd[1], int):
            seqlens = op.Constant(value=ir.tensor(np.full((qd[0],), qd[1] - 1, dtype=np.int32)))
            total = op.Constant(value=ir.tensor(np.array(qd[1], dtype=np.int32)))
        else:
            opset = self.state["opset"]
            b = shape_range(op, q3, 0, 1, opset)
            s = op.Cast(shape_range(op, q3, 1, 2, opset), to=ir.DataType.INT32)
            seqlens = op.Expand(op.Sub(s, op.Constant(value=ir.tensor(np.array([1], np.int32)))), b)
            total = squeeze0(op, s, opset)
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
        axis = softmax_on_last_axis(probs.producer(), 4, self.state["opset"])
        if axis is not None:
            return _fail(f"softmax over axis {axis}, not the key axis", probs.producer())
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
                opset = self.state["opset"]
                tgt = op.Concat(shape_range(op, mask, 0, 2, opset), shape_range(op, q3, 1, 2, opset),
                                shape_range(op, mask, 3, 4, opset), axis=0)
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
        axis = softmax_on_last_axis(probs.producer(), 4, self.state["opset"])
        if axis is not None:
            return _fail(f"softmax over axis {axis}, not the key axis", probs.producer())
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
            opset = self.state["opset"]
            tgt = op.Concat(shape_range(op, mask, 0, 2, opset), shape_range(op, q4, 2, 3, opset),
                            shape_range(op, mask, 3, 4, opset), axis=0)
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
