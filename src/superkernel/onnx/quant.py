"""Quantized subgraphs: what graph-autofusion leaves alone, and what ONNX Runtime makes of them.

A quantized ONNX model comes in three forms, all run by ONNX Runtime's CPU provider:

- **operator form** (``onnxruntime.quantization.quantize_dynamic``): ``DynamicQuantizeLinear`` of the
  activation, ``MatMulInteger`` with int8 weights, then the dequantization tail ``Cast`` (int32 to
  float) and ``Mul`` by the two scales. ONNX Runtime fuses that chain into ``DynamicQuantizeMatMul`` /
  ``MatMulIntegerToFloat`` (integer GEMM, dequantization in its epilogue);
- **contrib operators**: ``MatMulNBits`` (``MatMulNBitsQuantizer``: int4 / int8 block-quantized weights,
  dequantized inside the kernel), ``QLinear*``, ``QGemm``, ``QAttention``, ...;
- **QDQ form** (``quantize_static(quant_format=QDQ)``, ``MatMulNBitsQuantizer(quant_format=QDQ)``):
  float operators between ``DequantizeLinear`` and ``QuantizeLinear``. ONNX Runtime's QDQ transformers
  turn each *node unit* (DQ inputs -> op -> Q outputs) into an integer kernel (``QLinearMatMul``,
  ``QLinearAdd``, ...), and ``DequantizeLinear`` of a constant int4 / int8 block-quantized weight
  feeding ``MatMul`` / ``Gemm`` into ``MatMulNBits`` -- matched on the op types it knows.

A fusion rule that removed any of these nodes would hand ONNX Runtime something it runs in float:
``MatMul(x, DequantizeLinear(w_int4)) * 0.5`` rewritten to ``FusedMatMul`` is no longer the
``DequantizeLinear -> MatMul`` ONNX Runtime turns into ``MatMulNBits``, so the whole int4 weight is
dequantized to float on every run and multiplied in float. :func:`protected` says, for one node a
fusion would remove, why it belongs to a quantized subgraph; the engine refuses every candidate that
would remove such a node (a near miss naming the node and the reason), whatever the rule. Fusions
*next to* quantized nodes stay allowed: a LayerNorm whose output feeds ``DynamicQuantizeLinear``, a
bias + GELU after a dequantized product, an RMSNorm reading a dequantized embedding row.
"""

from __future__ import annotations

import collections
from typing import Iterable

import onnx_ir as ir

_DEFAULT = ("", "ai.onnx")
MS = "com.microsoft"

#: Default-domain quantized operators.
DEFAULT_QUANT_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                               "ConvInteger", "QLinearMatMul", "QLinearConv"})
#: com.microsoft quantized operators (besides every ``QLinear*`` / ``QOrdered*``).
MS_QUANT_OPS = frozenset({"MatMulNBits", "MatMulBnb4", "MatMulFpQ4", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                          "MatMulInteger16", "QGemm", "QAttention", "QEmbedLayerNormalization", "GatherBlockQuantized",
                          "DynamicQuantizeLSTM", "QMoE", "QuantizeLinear", "DequantizeLinear", "QuantizeWithOrder",
                          "DequantizeWithOrder", "QuantizeBFP", "DequantizeBFP"})
#: Quantized operators whose outputs are ordinary float results (dequantized inside the op): reading one is
#: an ordinary neighbour of the quantized subgraph. Every other quantized op writes integers, scales or zero
#: points that only its dequantization reads.
FLOAT_RESULT_OPS = frozenset({"DequantizeLinear", "MatMulNBits", "MatMulBnb4", "MatMulFpQ4", "MatMulIntegerToFloat",
                              "DynamicQuantizeMatMul", "QAttention", "QEmbedLayerNormalization",
                              "GatherBlockQuantized", "DequantizeWithOrder", "DequantizeBFP", "QMoE",
                              "DynamicQuantizeLSTM"})
#: Operators ONNX Runtime turns into an integer kernel when one operand is a DequantizeLinear output
#: (DQ(weight) -> MatMul / Gemm becomes MatMulNBits or, with a dequantized activation too,
#: MatMulIntegerToFloat / QLinearMatMul / QGemm; DQ -> Gather becomes GatherBlockQuantized).
DQ_OPERAND_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Gather"})


def is_quantized_op(domain: str, op: str) -> bool:
    """Whether ``domain::op`` is a quantized operator (integer compute, or a (de)quantization)."""
    if domain in _DEFAULT:
        return op in DEFAULT_QUANT_OPS
    if domain == MS:
        return op in MS_QUANT_OPS or op.startswith("QLinear") or op.startswith("QOrdered")
    return False


def is_quantized(node: ir.Node) -> bool:
    return is_quantized_op(node.domain, node.op_type)


def label(node: ir.Node) -> str:
    return (f"{node.domain}:" if node.domain not in _DEFAULT else "") + node.op_type + \
        (f" {node.name!r}" if node.name else "")


def _integer_side(v: ir.Value | None) -> ir.Node | None:
    """The quantized op whose integer-side output ``v`` is (its integers, scales or zero points, or the
    ``Cast`` of its integers to float that starts the dequantization tail), else None."""
    if v is None:
        return None
    p = v.producer()
    if p is None:
        return None
    if is_quantized(p):
        return None if p.op_type in FLOAT_RESULT_OPS else p
    if p.op_type == "Cast" and p.domain in _DEFAULT and p.inputs and p.inputs[0] is not None:
        q = p.inputs[0].producer()
        if q is not None and is_quantized(q) and q.op_type not in FLOAT_RESULT_OPS:
            return q
    return None


def _dq(v: ir.Value | None) -> ir.Node | None:
    p = v.producer() if v is not None else None
    return p if p is not None and p.op_type == "DequantizeLinear" and p.domain in (*_DEFAULT, MS) else None


def _is_float_operand(v: ir.Value) -> bool:
    """An input that carries data (not an integer shape / axes / indices operand)."""
    if v.dtype is None:
        arr = v.const_value
        return arr is None or arr.dtype.is_floating_point()
    return v.dtype.is_floating_point()


def protected(node: ir.Node) -> str | None:
    """Why a fusion may not remove ``node`` (it belongs to a quantized subgraph), or None."""
    if is_quantized(node):
        return f"{label(node)} is a quantized operator"
    for v in node.inputs:
        q = _integer_side(v)
        if q is not None:
            return (f"{label(node)} reads {v.name!r}, the integer side of {label(q)}: it belongs to that operator's "
                    "dequantization, which ONNX Runtime fuses into its integer kernel")
    dq_inputs = [v for v in node.inputs if v is not None and _dq(v) is not None]
    if not dq_inputs or node.domain not in _DEFAULT:
        return None
    if node.op_type in DQ_OPERAND_OPS:
        return (f"{label(node)} reads {dq_inputs[0].name!r} from {label(_dq(dq_inputs[0]))}: ONNX Runtime turns "
                f"DequantizeLinear -> {node.op_type} into an integer kernel, which a rewrite of it would hide")
    data = [v for v in node.inputs if v is not None and _is_float_operand(v)]
    if all(_dq(v) is not None for v in data) and any(
            u.op_type == "QuantizeLinear" for out in node.outputs for u, _ in out.uses()):
        return (f"{label(node)} sits between DequantizeLinear and QuantizeLinear (a QDQ node unit that ONNX "
                "Runtime runs as an integer kernel)")
    return None


def guard(nodes: Iterable[ir.Node]) -> tuple[ir.Node, str] | None:
    """The first node of ``nodes`` (what a fusion would remove) that belongs to a quantized subgraph, with why."""
    for n in nodes:
        why = protected(n)
        if why:
            return n, why
    return None


def op_key(domain: str, op_type: str) -> str:
    return (f"{domain}::" if domain not in _DEFAULT else "") + op_type


def quantized_op_counts(graph: ir.Graph) -> dict[str, int]:
    """How many nodes of each quantized operator type ``graph`` has (subgraphs included)."""
    c = collections.Counter(op_key(n.domain, n.op_type) for n in ir.traversal.RecursiveGraphIterator(graph)
                            if is_quantized(n))
    return dict(sorted(c.items()))


def has_quantization(graph: ir.Graph) -> bool:
    return any(is_quantized(n) for n in ir.traversal.RecursiveGraphIterator(graph))


def ort_kernel_counts(path: str) -> dict[str, int]:
    """The quantized kernels ONNX Runtime's CPU provider runs for the model at ``path`` with ORT_ENABLE_ALL:
    op types of the graph it optimized (written with ``optimized_model_filepath``), quantized ones only."""
    import os
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        so.optimized_model_filepath = os.path.join(tmp, "ort_optimized.onnx")
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        proto = onnx.load(so.optimized_model_filepath, load_external_data=False)
    c = collections.Counter(op_key(n.domain, n.op_type) for n in proto.graph.node
                            if is_quantized_op(n.domain, n.op_type))
    return dict(sorted(c.items()))


QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "com.microsoft::QuantizeLinear",
                     "com.microsoft::DequantizeLinear"})


def kernels_kept(original: dict[str, int], fused: dict[str, int]) -> str | None:
    """Compare :func:`ort_kernel_counts` of the input and of the fused model: None when ONNX Runtime runs the
    fused model with the same integer kernels and no more (de)quantizations, else what changed. ONNX Runtime
    gives each consumer of a shared DequantizeLinear its own copy (one QDQ node unit each), so a fusion that
    leaves one consumer where there were two leaves fewer; more would mean a quantized op now runs as a
    dequantization and a float op."""
    compute = {k for k in {*original, *fused} if k not in QDQ_OPS}
    changed = [f"{k}: {original.get(k, 0)} -> {fused.get(k, 0)}" for k in sorted(compute)
               if original.get(k, 0) != fused.get(k, 0)]
    changed += [f"{k}: {original.get(k, 0)} -> {fused.get(k, 0)}" for k in sorted(QDQ_OPS)
                if fused.get(k, 0) > original.get(k, 0)]
    return "; ".join(changed) or None
