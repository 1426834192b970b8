"""Signatures and content hashes of graphs, partitions and operator calls.

* :func:`tensor_signature` — shape, stride, dtype, layout, device of a (fake) tensor.
* :func:`partition_key` — the stable content hash that names a compiled partition in a
  package: the partition's generated code plus its input signature plus the compiler
  fingerprint. Same key = same code for the same shapes, so a loaded kernel is always
  the kernel that would have been compiled.
* :func:`graph_structure_hash` — the operators and edges of a captured graph, without
  shapes: it tells "another model" (package does not match) from "another shape"
  (a variant that was not built).
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from typing import Any

import torch
import torch.fx as fx

KEY_VERSION = "superkernel-static-kernel-key/1"

_DTYPE_SHORT = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool", torch.complex64: "complex64",
}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_SHORT.get(dtype, str(dtype).replace("torch.", ""))


def _static_ints(values: Any) -> list[int] | None:
    out = []
    for v in values:
        if isinstance(v, int):
            out.append(int(v))
        elif isinstance(v, torch.SymInt):
            hint = v.node.maybe_as_int() if hasattr(v.node, "maybe_as_int") else None
            if hint is None:
                return None
            out.append(int(hint))
        else:
            return None
    return out


def layout_name(t: torch.Tensor) -> str:
    """``ND`` (row-major contiguous), ``NHWC`` (channels-last), ``STRIDED`` (other strides), or the torch layout."""
    if t.layout != torch.strided:
        return str(t.layout).replace("torch.", "").upper()
    try:
        if t.is_contiguous():
            return "ND"
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            return "NHWC"
    except Exception:  # noqa: BLE001 - symbolic strides
        pass
    return "STRIDED"


def tensor_signature(t: torch.Tensor) -> dict[str, Any] | None:
    """Static signature of a tensor, or None when a size or stride is symbolic."""
    shape = _static_ints(t.shape)
    stride = _static_ints(t.stride()) if t.layout == torch.strided else []
    if shape is None or stride is None:
        return None
    try:
        offset = int(t.storage_offset()) if t.layout == torch.strided else 0
    except Exception:  # noqa: BLE001 - symbolic offset
        return None
    return {
        "shape": shape, "stride": stride, "dtype": dtype_name(t.dtype), "layout": layout_name(t),
        "device": str(t.device), "offset": offset,
    }


def value_signature(v: Any) -> Any:
    """JSON-able signature of an argument value (tensors by signature, scalars by value)."""
    if isinstance(v, fx.Node):
        return value_signature(v.meta.get("val", v.meta.get("example_value")))
    if isinstance(v, torch.Tensor):
        sig = tensor_signature(v)
        return {"tensor": sig} if sig is not None else {"tensor": "dynamic"}
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"sym": str(v)}
    if isinstance(v, (list, tuple)):
        return [value_signature(x) for x in v]
    if isinstance(v, dict):
        return {str(k): value_signature(x) for k, x in v.items()}
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return repr(v)  # inf / nan stay JSON-safe
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(v)
    return f"<{type(v).__name__}>"


def input_signature(example_inputs: list[Any]) -> list[Any] | None:
    """Signature of a partition's inputs; None when any shape is symbolic (no static kernel then)."""
    out = []
    for v in example_inputs:
        if isinstance(v, torch.Tensor):
            sig = tensor_signature(v)
            if sig is None:
                return None
            out.append(sig)
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        else:
            out.append(value_signature(v))
    return out


_DEVICE_REPR = re.compile(r"0x[0-9a-f]{6,}")


def graph_code(gm: fx.GraphModule) -> str:
    """Generated Python code of ``gm`` and of every nested GraphModule (sorted by name)."""
    parts = [gm.code]
    for name, sub in sorted(gm.named_modules()):
        if name and isinstance(sub, fx.GraphModule):
            parts.append(f"# {name}\n{sub.code}")
    code = "\n".join(parts)
    return _DEVICE_REPR.sub("0x?", code)  # object addresses never name code


def constant_signature(gm: fx.GraphModule) -> list[Any]:
    """Signatures of the tensors ``gm`` reads with get_attr (values are not part of the key: they are lifted)."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = fetch_attr(gm, node.target)
            out.append([node.target, value_signature(value) if isinstance(value, torch.Tensor) else type(value).__name__])
    return out


def fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    """The attribute a get_attr node reads (``target`` may be dotted)."""
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def partition_key(gm: fx.GraphModule, example_inputs: list[Any], fingerprint: str = "") -> str | None:
    """Content hash naming a compiled partition; None when its inputs are not static."""
    sig = input_signature(list(example_inputs))
    if sig is None:
        return None
    h = hashlib.sha256()
    h.update(KEY_VERSION.encode())
    h.update(b"\0code\0" + graph_code(gm).encode())
    h.update(b"\0consts\0" + json.dumps(constant_signature(gm), sort_keys=True).encode())
    h.update(b"\0inputs\0" + json.dumps(sig, sort_keys=True).encode())
    h.update(b"\0fingerprint\0" + fingerprint.encode())
    return h.hexdigest()[:40]


def target_name(target: Any) -> str:
    """Readable operator name: ``mm``, ``add.Tensor``, ``prims.convert_element_type``."""
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        packet = target._schema.name.split("::", 1)[-1]
        overload = target._overloadname
        name = packet if overload == "default" else f"{packet}.{overload}"
        return name if ns == "aten" else f"{ns}.{name}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"hop.{target.name()}"
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", type(target).__name__)


def is_operator_node(node: fx.Node) -> bool:
    """Operators that execute work (getitem of a tuple result does not)."""
    return node.op == "call_function" and node.target is not operator.getitem


def graph_structure_hash(gm: fx.GraphModule) -> str:
    """Operators and edges of ``gm``, without sizes or constants: stable across batch sizes."""
    index: dict[fx.Node, int] = {}
    items = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        edges = [index.get(a, -1) for a in node.all_input_nodes]
        target = target_name(node.target) if node.op in ("call_function", "call_method", "call_module") else node.op
        items.append([node.op, target, edges])
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:24]


def graph_input_shapes(gm: fx.GraphModule) -> list[Any]:
    return [value_signature(n) for n in gm.graph.nodes if n.op == "placeholder"]
