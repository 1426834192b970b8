"""EmbedLayerNormalization: word + position (+ token type) embeddings followed by LayerNorm."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult

from superkernel.onnx import _util as U
from superkernel.onnx.rules.base import FusionPattern, MS, _fail


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
