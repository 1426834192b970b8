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


def np_dtype(dtype: ir.DataType | None):
    """numpy dtype of an ONNX element type (float32 when unknown)."""
    try:
        return dtype.numpy() if dtype is not None else np.float32
    except Exception:  # noqa: BLE001
        return np.float32
