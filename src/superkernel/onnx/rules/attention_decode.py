"""Decode-step attention: one new token attending to past K/V concatenated with the new K/V,
fused into com.microsoft GroupQueryAttention (past in, present out)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter._basics import MatchResult

from superkernel.onnx import _util as U
from superkernel.onnx.rules.attention import AttentionCore, _heads_view, _rotary_3d, _rotary_3d_ok
from superkernel.onnx.rules.base import MS, QUIET, _fail

def _only_use(v: ir.Value) -> ir.Node | None:
    """The single consumer of ``v`` (None when it has several, none, or is a graph output)."""
    uses = v.uses()
    if len(uses) != 1 or v.is_graph_output():
        return None
    return uses[0][0]


def _unrepeat(v: ir.Value):
    """repeat_kv seen through: when ``v`` is Reshape(Expand(Unsqueeze(x, axis 2), [B, kvh, rep,
    T, hd])) to [B, kvh*rep, T, hd] (or [B*kvh*rep, T, hd], the SDPA key form), return (x,
    rep, those three nodes); otherwise (v, 1, [])."""
    r = v.producer()
    e = r.inputs[0].producer() if r is not None and r.op_type == "Reshape" else None
    u = e.inputs[0].producer() if e is not None and e.op_type == "Expand" else None
    if u is None or u.op_type != "Unsqueeze" or U.axes_of(u) != [2]:
        return v, 1, []
    x = u.inputs[0]
    xd, ed, vd = U.dims(x), U.dims(e.outputs[0]), U.dims(v)
    if not (xd and ed and vd and len(xd) == 4 and len(ed) == 5 and all(isinstance(d, int) for d in xd + ed)):
        return v, 1, []
    rep = ed[2]
    if ed[:2] != xd[:2] or ed[3:] != xd[2:] or vd not in ([xd[0], xd[1] * rep, xd[2], xd[3]],
                                                          [xd[0] * xd[1] * rep, xd[2], xd[3]]):
        return v, 1, []
    if _only_use(u.outputs[0]) is not e or _only_use(e.outputs[0]) is not r:
        return v, 1, []
    return x, rep, [u, e, r]


def _head_chain(v: ir.Value, what: str):
    """``v`` = [RotaryEmbedding(]Transpose(Reshape(x3, [B, S, N, hd]), [0, 2, 1, 3])[, pos, cos,
    sin)]: return (x3, reshape target, rotary node or None, nodes) or (None, why)."""
    nodes, rot = [], None
    p = v.producer()
    if p is not None and p.op_type == "RotaryEmbedding" and p.domain == MS:
        if not _rotary_3d_ok(p):
            return None, f"{what}: rotary embedding attributes not supported in the 3-D form"
        rot = p
        nodes.append(p)
        v = p.inputs[0]
        p = v.producer()
    if p is None or p.op_type != "Transpose" or U.attr_ints(p, "perm") != [0, 2, 1, 3]:
        return None, f"{what} is not Transpose(..., [0, 2, 1, 3]) of a head view"
    nodes.append(p)
    r = p.inputs[0].producer()
    if r is None or r.op_type != "Reshape":
        return None, f"{what} is not a head view (Reshape) of a [B, S, N*hd] projection"
    nodes.append(r)
    for n in nodes:
        if _only_use(n.outputs[0]) is None:
            return None, f"{what}: intermediate {n.outputs[0].name} has other uses"
    return (r.inputs[0], r.inputs[1], rot, nodes), ""


class DecodeGQA(AttentionCore):
    """A decode step (one new token, static shapes) whose K/V are the concatenation of past
    K/V inputs and the new K/V -> com.microsoft GroupQueryAttention with past_key/past_value
    and present outputs, rotary as 3-D RotaryEmbedding before it, and the mask as
    ``attention_bias``.

    Exact for any mask: with one query row, ``seqlens_k = total - 1`` lets that row see every
    key (GQA's own causal / right-padding logic masks nothing) and the original additive
    mask is applied unchanged as the bias. Covers the TorchScript exporter's grouped form
    (q reshaped to [B, kv_heads, rep, hd]) and repeat_kv (Unsqueeze, Expand, Reshape)."""

    rule_name = "gqa"

    def validate_inputs(self, q4, k4, v4, kd) -> MatchResult:
        st = self.state
        if st["k_mode"] == "bsnh":
            return _fail(QUIET + "key is not a [B, N, T, hd] concatenation with the past", k4)
        kx, krep, knodes = _unrepeat(k4)
        vx, vrep, vnodes = _unrepeat(v4)
        r = kx.producer()
        if krep == 1 and st["k_mode"] is not None and r is not None and r.op_type == "Reshape":
            # the SDPA key form without repeat_kv: Reshape(k4 [B, N, T, hd], [B*N, T, hd])
            k4d, k3d = U.dims(r.inputs[0]), U.dims(kx)
            if k4d and k3d and len(k4d) == 4 and all(isinstance(d, int) for d in k4d) and \
                    k3d == [k4d[0] * k4d[1], k4d[2], k4d[3]] and _only_use(kx) is not None:
                kx, knodes = r.inputs[0], [r]
        if krep != vrep:
            return _fail(f"key and value are repeated {krep} and {vrep} times", v4)
        cats = []
        for x, what in ((kx, "key"), (vx, "value")):
            c = x.producer()
            if c is None or c.op_type != "Concat" or len(c.inputs) != 2 or U.attr_int(c, "axis", 0) not in (2, -2):
                return _fail(QUIET + f"{what} is not Concat(past, new) on the sequence axis (no KV cache)", x)
            cats.append(c)
        (past_k, kn), (past_v, vn) = cats[0].inputs, cats[1].inputs
        pkd, pvd, knd = U.dims(past_k), U.dims(past_v), U.dims(kn)
        if not (pkd and pvd and knd and len(pkd) == 4 and all(isinstance(d, int) for d in pkd + knd)):
            return _fail(f"past key {pkd} / new key {knd} shapes are not static [B, kv_heads, T, hd]", past_k)
        if pvd != pkd:
            return _fail(f"past value {pvd} differs from past key {pkd}", past_v)
        if knd[2] != 1:
            return _fail(f"{knd[2]} new keys: not one static token per sequence (a decode step has 1)", kn)
        kc, why = _head_chain(kn, "new key")
        if kc is None:
            return _fail(why, kn)
        vc, why = _head_chain(vn, "new value")
        if vc is None:
            return _fail(why, vn)
        if vc[2] is not None:
            return _fail("rotary on the value", vn)
        qd = U.dims(q4)
        grouped = None
        qr = q4
        g = q4.producer()
        if krep == 1 and g is not None and g.op_type == "Reshape":  # TorchScript: q as [B, kv_heads, rep, hd]
            qrd = U.dims(g.inputs[0])
            if qrd and len(qrd) == 4 and qrd[2] == 1 and qd[1] * qd[2] == qrd[1] and qd[1] == pkd[1]:
                grouped, qr = g, g.inputs[0]
                if _only_use(qr) is not g:
                    return _fail("query intermediate has other uses", qr)
        qc, why = _head_chain(qr, "query")
        if qc is None:
            return _fail(why, qr)
        hq, hk, hv = _heads_view(qc[1], qc[0]), _heads_view(kc[1], kc[0]), _heads_view(vc[1], vc[0])
        if hq is None or hk is None or hv is None or hk != hv or hq[1] != hk[1] or hq[0] % hk[0]:
            return _fail(f"head layouts q{hq} k{hk} v{hv} are not grouped-query compatible", qc[1])
        if hk[0] != pkd[1] or hq[0] != hk[0] * max(krep, qd[2] if grouped is not None else 1):
            return _fail(f"{hq[0]} query heads do not group onto {pkd[1]} kv heads", q4)
        q3d = U.dims(qc[0])
        if not (q3d and len(q3d) == 3 and q3d[0] == pkd[0] and q3d[1] == 1):
            return _fail(f"query {q3d} is not one static token per sequence (decode step)", qc[0])
        mask = st.get("mask")
        if mask is not None:
            md = U.dims(mask)
            if md[1] != 1 or md[2] != 1:
                return _fail(f"mask {md} is not [B|1, 1, 1, T] (GroupQueryAttention's bias broadcast)", mask)
        # the output: GroupQueryAttention writes [B, 1, heads*hd]
        root = st["root"]
        ctx = root.outputs[0]
        tail, tail_out = [], None
        if self.params.get("tail"):
            if grouped is not None:
                return _fail("grouped query with a [B, S, N*hd] tail")
        else:
            r4 = _only_use(ctx)
            t4 = _only_use(r4.outputs[0]) if r4 is not None and r4.op_type == "Reshape" else None
            r5 = _only_use(t4.outputs[0]) if t4 is not None and t4.op_type == "Transpose" else None
            if (r5 is not None and r5.op_type == "Reshape" and U.attr_ints(t4, "perm") == [0, 2, 1, 3]
                    and U.dims(r4.outputs[0]) == [pkd[0], hq[0], 1, hq[1]]
                    and U.dims(r5.outputs[0]) == [pkd[0], 1, hq[0] * hq[1]]):
                tail, tail_out = [r4, t4, r5], r5.outputs[0]
        extra = [n for n in (*reversed(qc[3]), *([grouped] if grouped else []), *reversed(kc[3]), *reversed(vc[3]),
                             cats[0], cats[1], *knodes, *vnodes) if n is not None]
        st.update(q3=qc[0], k3=kc[0], v3=vc[0], qrot=qc[2], krot=kc[2], past_k=past_k, past_v=past_v,
                  present_k=kx, present_v=vx, heads=hq[0], kv_heads=hk[0], batch=pkd[0], total=pkd[2] + 1,
                  ctx_dims=U.dims(ctx), tail_out=tail_out,
                  extra_nodes=extra + [n for n in st.get("extra_nodes", []) if n not in extra] + tail)
        return MatchResult()

    def validate(self, context, q4, kt, v4, probs, mask=None, **kw):
        self.state["mask"] = mask
        return super().validate(context, q4, kt, v4, probs, mask=mask, **kw)

    def rewrite(self, op, q4, kt, v4, mask=None, **_):
        st = self.state
        q3, k3 = st["q3"], st["k3"]
        if st["qrot"] is not None:
            q3 = op.RotaryEmbedding(q3, *st["qrot"].inputs[1:4], **_rotary_3d(st["qrot"], st["heads"]), _domain=MS)
        if st["krot"] is not None:
            k3 = op.RotaryEmbedding(k3, *st["krot"].inputs[1:4], **_rotary_3d(st["krot"], st["kv_heads"]), _domain=MS)
        seqlens = op.Constant(value=ir.tensor(np.full((st["batch"],), st["total"] - 1, dtype=np.int32)))
        total = op.Constant(value=ir.tensor(np.array(st["total"], dtype=np.int32)))
        outs = op.GroupQueryAttention(q3, k3, st["v3"], st["past_k"], st["past_v"], seqlens, total, None, None, None,
                                      mask, num_heads=st["heads"], kv_num_heads=st["kv_heads"], scale=st["scale"],
                                      _domain=MS, _outputs=3)
        also = [(st["present_k"], outs[1]), (st["present_v"], outs[2])]
        if st["tail_out"] is not None:
            also.append((st["tail_out"], outs[0]))
        st["also_replaces"] = also
        if self.params.get("tail"):
            return outs[0]
        return op.Reshape(outs[0], op.Constant(value=ir.tensor(np.array(st["ctx_dims"], dtype=np.int64))))
