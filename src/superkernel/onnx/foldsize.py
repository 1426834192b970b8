"""How many elements a node would produce from known constant inputs, computed before evaluating it.

Constant folding (:mod:`superkernel.onnx.shapes`) evaluates only nodes whose result is
small. A 100-byte model can ask for a 6 GB constant (``ConstantOfShape`` of ``[40000, 40000]``,
an ``Expand``, a ``Tile``, a ``Range``, a broadcast); its size must be known before the
reference implementation allocates it. :func:`fold_size_bound` gives an upper bound from the
input shapes and values for the operators folding needs, and None for every other operator
(not folded).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Where", "Equal", "Less", "LessOrEqual", "Greater",
              "GreaterOrEqual", "And", "Or", "Xor", "Max", "Min", "Sum", "Mean", "BitShift", "BitwiseAnd",
              "BitwiseOr", "BitwiseXor", "PRelu"}
# The result has at most as many elements as the inputs together (times the rank, for NonZero).
_NOT_GROWING = {"Identity", "Cast", "CastLike", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Concat",
                "Transpose", "Neg", "Abs", "Not", "Sqrt", "Exp", "Log", "Floor", "Ceil", "Round", "Sign", "Relu",
                "Sigmoid", "Tanh", "Reciprocal", "Softmax", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                "ReduceProd", "ArgMax", "ArgMin", "Split", "NonZero", "Trilu", "Clip", "IsNaN", "IsInf", "Erf",
                "ScatterND", "ScatterElements", "CumSum", "GatherElements", "Shape", "Size", "Unique", "TopK",
                "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Softplus", "Softsign", "Elu", "Selu",
                "LeakyRelu", "HardSigmoid", "HardSwish", "Gelu", "Mish", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                "ReduceLogSumExp", "LogSoftmax", "Dropout", "Compress", "GatherND", "LayerNormalization"}


def _ints(a: object) -> list[int] | None:
    try:
        arr = np.asarray(a)
        if arr.dtype.kind not in "iu" or arr.ndim > 1 or arr.size > _MAX_RANK:
            return None
        return [int(x) for x in arr.reshape(-1)]
    except (TypeError, ValueError):
        return None


_MAX_RANK = 64  # a shape / repeats vector longer than this is not a shape folding needs


def _axis(node, default: int = 0) -> int:
    """The ``axis`` attribute of an ``onnx.NodeProto`` or an ``onnx_ir.Node``."""
    attrs = getattr(node, "attributes", None)
    if attrs is not None and hasattr(attrs, "get"):
        a = attrs.get("axis")
        return int(a.value) if a is not None else default
    return next((a.i for a in node.attribute if a.name == "axis"), default)


def _shape(a: object) -> tuple[int, ...]:
    return tuple(np.shape(a))


def fold_size_bound(node, inputs: Sequence[object | None]) -> int | None:
    """An upper bound on the elements of ``node``'s largest output (None: unknown, do not fold)."""
    op = node.op_type
    present = [x for x in inputs if x is not None]
    try:
        if op in _NOT_GROWING:
            rank = max((len(_shape(x)) for x in present), default=1)
            return sum(int(np.size(x)) for x in present) * max(1, rank)
        if op in _BROADCAST:
            return math.prod(np.broadcast_shapes(*(_shape(x) for x in present)))
        if op == "ConstantOfShape":
            dims = _ints(inputs[0])
            return None if dims is None or any(d < 0 for d in dims) else math.prod(dims)
        if op == "Expand":
            dims = _ints(inputs[1])
            return None if dims is None or any(d < 0 for d in dims) else \
                math.prod(np.broadcast_shapes(_shape(inputs[0]), tuple(dims)))
        if op == "Tile":
            reps = _ints(inputs[1])
            shape = _shape(inputs[0])
            if reps is None or len(reps) != len(shape) or any(r < 0 for r in reps):
                return None
            return math.prod(s * r for s, r in zip(shape, reps))
        if op == "Range":
            start, limit, delta = (float(np.asarray(x).reshape(-1)[0]) for x in inputs[:3])
            if delta == 0 or not all(math.isfinite(v) for v in (start, limit, delta)):
                return None
            return max(0, math.ceil((limit - start) / delta))
        if op == "Gather":
            data, indices = inputs[0], inputs[1]
            axis = _axis(node)
            shape = _shape(data)
            if not shape:
                return None
            along = shape[axis] if -len(shape) <= axis < len(shape) else 1
            return int(np.size(data)) // max(1, along) * int(np.size(indices))
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return None


def should_fold_ir(node, limit: int) -> bool | None:
    """For ``onnxscript.optimizer.fold_constants(should_fold=...)``: False (never evaluate) unless the
    node's largest output is bounded by ``limit`` elements from its constant inputs; None (the
    folder's own rules) when it is. onnxscript compares its output size only after evaluating."""
    inputs: list[object | None] = []
    for v in node.inputs:
        tensor = getattr(v, "const_value", None) if v is not None else None
        if v is not None and tensor is None:
            return None  # not all constant: the folder does not evaluate it
        if tensor is None:
            inputs.append(None)
        elif tensor.size <= _MAX_RANK:  # small: its values (shapes, repeats, Range bounds) matter
            inputs.append(np.asarray(tensor.numpy()))
        else:  # only its shape matters: a zero-stride stand-in, nothing loaded
            inputs.append(np.broadcast_to(np.zeros((), dtype=np.float32), tuple(int(d) for d in tensor.shape)))
    bound = fold_size_bound(node, inputs)
    return None if bound is not None and bound <= limit else False


PROP_MAX_ELEMENTS = 1 << 20


def data_prop_is_bounded(proto) -> bool:
    """Whether ONNX shape inference may run with data propagation on ``proto``: it evaluates ``Range``
    (and shape arithmetic) on the values it knows, unbounded. Refused when a Range's constant inputs
    ask for more than :data:`PROP_MAX_ELEMENTS` values, or a Range's inputs are computed in a graph
    that declares a dimension that large (the computed bound could then be as large)."""
    from onnx import AttributeProto, numpy_helper

    g = proto.graph
    consts = {t.name: t for t in g.initializer}
    for node in g.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == AttributeProto.TENSOR:
            consts[node.output[0]] = node.attribute[0].t
    declared = [d.dim_value for vi in (*g.input, *g.value_info, *g.output)
                for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")]
    huge_dim = any(d > PROP_MAX_ELEMENTS for d in declared)
    for node in g.node:
        if node.op_type != "Range" or node.domain not in ("", "ai.onnx"):
            continue
        if not all(i in consts and math.prod(consts[i].dims) == 1 for i in node.input[:3]):
            if huge_dim:
                return False
            continue
        bound = fold_size_bound(node, [numpy_helper.to_array(consts[i]) for i in node.input[:3]])
        if bound is None or bound > PROP_MAX_ELEMENTS:
            return False
    return True


__all__ = ["PROP_MAX_ELEMENTS", "data_prop_is_bounded", "fold_size_bound", "should_fold_ir"]
