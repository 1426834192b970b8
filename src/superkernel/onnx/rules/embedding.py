"""EmbedLayerNormalization: word + position (+ token type) embeddings followed by LayerNorm.

Positions are either constant rows (BERT: position ids from a buffer) or gathered from a
constant table by computed ids (RoBERTa: a cumsum over the non-padding input ids; or position
ids given as an input): those ids become the op's ``position_ids`` input. A token-type term
whose ids are provably one value (a zeros buffer, even gathered by the position ids as
transformers 5 does) is one constant row."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult

from superkernel.onnx import _util as U
from superkernel.onnx.rules.base import FusionPattern, MS, _fail


_SAME_VALUE_OPS = {"Expand", "Gather", "GatherElements", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Slice",
                   "Tile", "Transpose", "Cast"}


def uniform_scalar(v: ir.Value | None, depth: int = 8):
    """The one value every element of ``v`` has, when provable (a constant with all elements
    equal, or a gather/reshape/expand of one), else None."""
    if v is None or depth < 0:
        return None
    a = U.eval_const(v)
    if a is not None:
        a = np.asarray(a)
        return a.reshape(-1)[0].item() if a.size and np.all(a == a.reshape(-1)[0]) else None
    p = v.producer()
    if p is None or p.domain not in ("", "ai.onnx") or p.op_type not in _SAME_VALUE_OPS or not p.inputs:
        return None
    return uniform_scalar(p.inputs[0], depth - 1)


def _gathered(e: ir.Value) -> tuple[ir.Node, np.ndarray] | None:
    """(Gather node, constant table) when ``e`` is Gather(constant [R, D] table, ids) on axis 0."""
    g = e.producer()
    if g is None or g.op_type != "Gather" or g.domain not in ("", "ai.onnx") or U.attr_int(g, "axis", 0) != 0:
        return None
    t = U.const_array(g.inputs[0])
    if t is None or t.ndim != 2 or t.dtype != np.float32 or len(e.uses()) != 1 or e.is_graph_output():
        return None
    return g, t


class EmbedLayerNorm(FusionPattern):
    """LayerNorm(Gather(word_table, input_ids) + position [+ token type] rows)
    -> com.microsoft EmbedLayerNormalization. Constant rows are summed into its position
    table, indexed by the default positions 0..S-1; gathered positions keep their table and
    pass their ids as ``position_ids`` (the constant rows, then position-independent, are
    added to every row of that table)."""

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
        gathered = None  # (Gather node, table, ids) of positions computed at run time
        extra = []
        for e in (e2, e3):
            if e is None:
                continue
            a = U.eval_const(e)
            g = _gathered(e) if a is None else None
            if a is None and g is not None and uniform_scalar(g[0].inputs[1]) is not None:
                k = int(uniform_scalar(g[0].inputs[1]))  # every id is k: one constant row
                if not 0 <= k < g[1].shape[0]:
                    return _fail(f"token-type id {k} outside its table", e)
                a, extra = g[1][k][None, :].repeat(seq, 0), extra + [g[0]]
            elif a is None and g is not None and gathered is None:
                pid = g[0].inputs[1]
                pd = U.dims(pid)
                if pid.dtype not in (ir.DataType.INT64, ir.DataType.INT32) or pd is None or len(pd) != 2 \
                        or pd[1] != seq or pd[0] not in (1, idd[0]) or g[1].shape[1] != d:
                    return _fail(f"gathered position ids {pd} are not [B|1, S] integers over a [P, {d}] table", e)
                gathered, extra = (g[0], g[1], pid), extra + [g[0]]
                continue
            if a is None:
                return _fail("position/token-type embedding is neither computed from constants nor gathered "
                             "from a constant table", e)
            a = np.asarray(a, dtype=np.float32)
            if a.ndim == 3 and (a.shape[0] == 1 or all(np.array_equal(a[0], a[i]) for i in range(1, a.shape[0]))):
                a = a[0]  # the same rows for every batch entry
            if a.ndim == 2 and a.shape == (1, d):
                a = a.repeat(seq, 0)
            if a.shape != (seq, d):
                return _fail(f"position/token-type rows of shape {a.shape} are not [S, D] = [{seq}, {d}] "
                             "(batch-independent)", e)
            rows = rows + a
        if gathered is not None:
            if not np.all(rows == rows[0]):
                return _fail("constant rows vary by position while positions are gathered by computed ids", e2)
            table_rows = gathered[1] + rows[0]
        else:
            table_rows = rows
        eps = node.attributes.get("epsilon")
        self.state.update(rows=table_rows, pids=gathered[2] if gathered else None, extra_nodes=extra,
                          epsilon=float(eps.value) if eps is not None else 1e-5)
        return MatchResult()

    def rewrite(self, op, table, ids, scale, bias, **_):
        ids32 = op.Cast(ids, to=ir.DataType.INT32) if ids.dtype != ir.DataType.INT32 else ids
        pos = op.Constant(value=ir.tensor(self.state["rows"]))
        pids = self.state["pids"]
        if pids is None:
            outs = op.EmbedLayerNormalization(ids32, None, table, pos, None, scale, bias,
                                              epsilon=self.state["epsilon"], _domain=MS, _outputs=2)
        else:
            p32 = op.Cast(pids, to=ir.DataType.INT32) if pids.dtype != ir.DataType.INT32 else pids
            outs = op.EmbedLayerNormalization(ids32, None, table, pos, None, scale, bias, None, p32,
                                              epsilon=self.state["epsilon"], _domain=MS, _outputs=2)
        return outs[0]
