"""Small helpers over onnx-ir values shared by the rules, the engine and the report."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx_ir as ir

# ir.DataType -> numpy-style name used by superkernel.onnx.benefit
_DTYPE_NAMES = {
    ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16",
    ir.DataType.DOUBLE: "float64", ir.DataType.INT64: "int64", ir.DataType.INT32: "int32",
    ir.DataType.INT16: "int16", ir.DataType.INT8: "int8", ir.DataType.UINT8: "uint8",
    ir.DataType.UINT16: "uint16", ir.DataType.UINT32: "uint32", ir.DataType.UINT64: "uint64",
    ir.DataType.BOOL: "bool",
}

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


def dtype_name(dtype: ir.DataType | None) -> str | None:
    return _DTYPE_NAMES.get(dtype) if dtype is not None else None


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The numpy value of a constant (initializer or folded Constant), else None."""
    if value is None:
        return None
    tensor = value.const_value
    for _ in range(4):  # the TorchScript exporter shares tied weights through Identity nodes
        producer = value.producer()
        if tensor is not None or producer is None or producer.op_type != "Identity" or producer.domain not in (
                "", "ai.onnx"):
            break
        value = producer.inputs[0]
        tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
            attr = producer.attributes.get("value")
            if attr is not None and attr.type == ir.AttributeType.TENSOR:
                tensor = attr.value
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:  # noqa: BLE001 - external data that cannot be read, odd dtypes
        return None


def scalar(value: ir.Value | None) -> float | None:
    """The single element of a constant with one element, else None."""
    arr = const_array(value)
    if arr is None or arr.size != 1:
        return None
    return arr.reshape(()).item()


def ints(value: ir.Value | None) -> list[int] | None:
    arr = const_array(value)
    if arr is None or arr.dtype.kind not in "iu":
        return None
    return [int(v) for v in arr.reshape(-1)]


def rank(value: ir.Value | None) -> int | None:
    if value is None or value.shape is None:
        return None
    return len(value.shape)


def dims(value: ir.Value | None) -> list[int | str | None] | None:
    """Dimensions as ints (known), str (symbolic name) or None (unknown)."""
    if value is None or value.shape is None:
        return None
    out: list[int | str | None] = []
    for d in value.shape:
        if isinstance(d, int):
            out.append(d)
        else:
            out.append(d.value if getattr(d, "value", None) is not None else None)
    return out


def last_dim(value: ir.Value | None) -> int | None:
    d = dims(value)
    if not d or not isinstance(d[-1], int):
        return None
    return d[-1]


def is_last_axis(axes: list[int] | None, r: int | None) -> bool:
    if axes is None or len(axes) != 1:
        return False
    a = axes[0]
    return a == -1 or (r is not None and a == r - 1)


def concrete_shape(value: ir.Value, fixed: Mapping[str, int], default: int) -> tuple[tuple[int, ...] | None, bool]:
    """Shape with symbolic dims replaced by ``fixed`` (or ``default``).

    Returns (shape or None when the rank is unknown, whether any dim was symbolic)."""
    d = dims(value)
    if d is None:
        return None, False
    out, symbolic = [], False
    for x in d:
        if isinstance(x, int):
            out.append(x)
        else:
            symbolic = True
            out.append(int(fixed.get(x, default)) if x is not None else default)
    return tuple(out), symbolic


def attr_int(node: ir.Node, name: str, default: int) -> int:
    a = node.attributes.get(name)
    return default if a is None else int(a.value)


def attr_ints(node: ir.Node, name: str) -> list[int] | None:
    a = node.attributes.get(name)
    return None if a is None else [int(v) for v in a.value]


def axes_of(node: ir.Node, index: int = 1) -> list[int] | None:
    """The ``axes`` of a Squeeze / Unsqueeze / Reduce* node: the attribute (opset < 13, or
    < 18 for the Reduce ops) or the constant input ``index`` (later opsets), else None."""
    a = attr_ints(node, "axes")
    if a is not None:
        return a
    if len(node.inputs) > index and node.inputs[index] is not None:
        return ints(node.inputs[index])
    return None


def np_dtype(dtype: ir.DataType | None):
    """numpy dtype of an ONNX element type (float32 when unknown)."""
    try:
        return dtype.numpy() if dtype is not None else np.float32
    except Exception:  # noqa: BLE001
        return np.float32


EVAL_MAX_ELEMENTS = 1 << 22


def eval_const(value: ir.Value | None, depth: int = 16, _memo: dict | None = None) -> np.ndarray | None:
    """The value of ``value`` when it is a constant or computed only from constants by
    default-domain nodes (evaluated with ONNX's reference implementation, outputs up to
    ``EVAL_MAX_ELEMENTS``), else None. Never modifies the graph."""
    arr = const_array(value)
    if arr is not None or value is None or depth <= 0:
        return arr
    memo = {} if _memo is None else _memo
    if id(value) in memo:
        return memo[id(value)]
    memo[id(value)] = out = _eval_node(value, depth, memo)
    return out


def _eval_node(value: ir.Value, depth: int, memo: dict) -> np.ndarray | None:
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx") or node.op_type in ("RandomNormal", "RandomUniform"):
        return None
    if node.op_type == "Shape":  # of a value whose shape is static
        d = dims(node.inputs[0])
        if d is None or not all(isinstance(x, int) for x in d):
            return None
        start, end = attr_int(node, "start", 0), node.attributes.get("end")
        return np.array(d[start:(int(end.value) if end is not None else None)], dtype=np.int64)
    feeds = []
    for v in node.inputs:
        if v is None:
            feeds.append(None)
            continue
        a = eval_const(v, depth - 1, memo)
        if a is None:
            return None
        feeds.append(a)
    if node.op_type == "GatherElements" and feeds[0] is not None and feeds[1] is not None:
        idx = np.where(feeds[1] < 0, feeds[1] + feeds[0].shape[attr_int(node, "axis", 0)], feeds[1])
        out = np.take_along_axis(np.asarray(feeds[0]), idx.astype(np.int64), axis=attr_int(node, "axis", 0))
        return out if out.size <= EVAL_MAX_ELEMENTS else None
    if node.op_type == "Expand" and feeds[0] is not None and feeds[1] is not None:
        try:
            shape = np.broadcast_shapes(feeds[0].shape, tuple(int(x) for x in feeds[1].reshape(-1)))
        except ValueError:
            return None
        if int(np.prod(shape)) > EVAL_MAX_ELEMENTS:
            return None
        return np.ascontiguousarray(np.broadcast_to(feeds[0], shape))
    try:
        import onnx

        names = [f"i{i}" if v is not None else "" for i, v in enumerate(node.inputs)]
        outs = [f"o{i}" for i in range(len(node.outputs))]
        attrs = {k: a.value if not isinstance(a.value, ir.TensorProtocol) else onnx.numpy_helper.from_array(
            a.value.numpy()) for k, a in node.attributes.items()}
        proto = onnx.helper.make_node(node.op_type, names, outs, **attrs)
        from .foldsize import fold_size_bound

        bound = fold_size_bound(proto, feeds)
        if bound is None or bound > EVAL_MAX_ELEMENTS:  # sized before it is evaluated, never after
            return None
        opset = None
        if node.graph is not None:
            opset = node.graph.opset_imports.get("", node.graph.opset_imports.get("ai.onnx"))
        res = reference_run(proto, {n: f for n, f in zip(names, feeds) if n}, opset)
    except Exception:  # noqa: BLE001 - not evaluable: not a constant for the rules
        return None
    out = np.asarray(res[list(node.outputs).index(value)])
    return out if out.size <= EVAL_MAX_ELEMENTS else None


def reference_run(proto, feeds: dict, opset: int | None) -> list:
    """The outputs of one default-domain ``onnx.NodeProto`` on ``feeds`` by ONNX's reference
    implementation. With ``opset`` (the model's; axes / split are attributes below 13) the node
    is evaluated in a one-node model of that opset and the result is aligned with
    ``proto.output`` (None for an unnamed output)."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    if not opset:
        return ReferenceEvaluator(proto).run(None, feeds)
    g = onnx.helper.make_graph([proto], "eval", [onnx.helper.make_empty_tensor_value_info(i) for i in feeds],
                               [onnx.helper.make_empty_tensor_value_info(o) for o in proto.output if o])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", int(opset))])
    got = iter(ReferenceEvaluator(m).run(None, feeds))
    return [next(got) if o else None for o in proto.output]
