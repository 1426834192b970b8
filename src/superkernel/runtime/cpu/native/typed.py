"""Typed operator calls (``at::_ops::<op>::call``) where the schema's argument types allow them."""

from __future__ import annotations

import operator
import os
from typing import Any

import torch
import torch.fx as fx

from superkernel.runtime.cpu.native.build import _torch_include
from superkernel.runtime.cpu.native.literals import NativeUnsupported, _DTYPES, _LAYOUTS, _MEMORY_FORMATS, _double_literal, _int_literal


def _type_kind(t: Any) -> str:
    return t.kind()


def _is_int_value(val: Any) -> bool:
    return isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool)


#: Python operators on integers that appear in graphs with symbolic sizes, as C++ (Python semantics).
_INT_OPS: dict[Any, tuple[str, int]] = {
    operator.add: ("(int64_t)({0} + {1})", 2), operator.sub: ("(int64_t)({0} - {1})", 2),
    operator.mul: ("(int64_t)({0} * {1})", 2), operator.floordiv: ("sk_floordiv({0}, {1})", 2),
    operator.mod: ("sk_mod({0}, {1})", 2), operator.neg: ("(int64_t)(-{0})", 1), operator.pos: ("(int64_t)({0})", 1),
    operator.eq: ("(bool)({0} == {1})", 2), operator.ne: ("(bool)({0} != {1})", 2),
    operator.lt: ("(bool)({0} < {1})", 2), operator.le: ("(bool)({0} <= {1})", 2),
    operator.gt: ("(bool)({0} > {1})", 2), operator.ge: ("(bool)({0} >= {1})", 2),
    torch.sym_max: ("std::max<int64_t>({0}, {1})", 2), torch.sym_min: ("std::min<int64_t>({0}, {1})", 2),
}


class _NotTyped(Exception):
    """An argument or return the typed call cannot express: the boxed call is used."""


def _ops_header(schema_name: str) -> str | None:
    """``ATen/ops/<name>_ops.h`` declaring ``at::_ops::<op>`` when this torch has it."""
    ns, _, name = schema_name.partition("::")
    if ns != "aten" or not name:
        return None
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    rel = f"ATen/ops/{base}_ops.h"
    return rel if os.path.exists(os.path.join(_torch_include(), rel)) else None


_DEVICE_TYPES = {"cpu": "CPU", "cuda": "CUDA", "meta": "Meta"}


class _TypedMixin:
    """Typed calls ``at::_ops::<op>::call(...)``: the unboxed entry point of the same operator
    (the dispatcher picks the same kernels; no IValue boxing of arguments and results)."""

    def typed_call(self, node: fx.Node, schema: Any, bound: list[tuple[Any, Any]]) -> bool:
        header = _ops_header(schema.name)
        if header is None:
            return False
        rets = schema.returns
        if not all(_type_kind(r.real_type) == "TensorType" for r in rets) and not (
                len(rets) == 1 and _type_kind(rets[0].real_type) == "ListType"
                and _type_kind(rets[0].real_type.getElementType()) == "TensorType"):
            return False
        try:
            exprs = [self.typed_arg(value, a, f"{node.name}.{a.name}") for a, value in bound]
        except _NotTyped:
            return False
        name = schema.name.split("::", 1)[1] + (f"_{schema.overload_name}" if schema.overload_name else "")
        self.m.headers.add(header)
        call = f"at::_ops::{name}::call({', '.join(exprs)})"
        lines = self.lines
        lines.append(f"  // {node.name} = {schema.name}.{schema.overload_name or 'default'} (typed)")
        if not rets:
            lines.append(f"  {call};")
        elif len(rets) == 1 and _type_kind(rets[0].real_type) == "TensorType":
            t = f"t_{node.name}"
            self.owned.add(t)
            lines.append(f"  at::Tensor {t} = {call};")
            self.tensors[node] = t
        else:
            r = f"r_{node.name}"
            kind = "vector" if len(rets) == 1 else "tuple"
            lines.append(f"  auto {r} = {call};")
            self.typed_multi[node] = (r, kind)
        return True

    def typed_tensor(self, node: fx.Node) -> str:
        if node in self.tensors:
            return self.tensors[node]
        if node in self.values:
            return f"{self.values[node]}.toTensor()"
        raise _NotTyped

    def typed_arg(self, value: Any, a: Any, what: str) -> str:
        return self._typed(value, a.real_type, what, a.alias_info is not None and a.alias_info.is_write)

    def _typed(self, value: Any, typ: Any, what: str, mutable: bool = False) -> str:
        kind = _type_kind(typ)
        if kind == "OptionalType":
            if value is None:
                return "::std::nullopt"
            inner = self._typed(value, typ.getElementType(), what)
            if _type_kind(typ.getElementType()) == "TensorType":
                return f"::std::optional<at::Tensor>({inner})"
            return inner
        if isinstance(value, fx.Node):
            val = value.meta.get("val")
            if kind == "TensorType" and isinstance(val, torch.Tensor):
                return self.typed_tensor(value)
            raise _NotTyped
        if kind == "TensorType":
            if mutable or not isinstance(value, (bool, int, float)):
                raise _NotTyped
            return f"{self.m.const(f'sk_wrapped({self.scalar(value, what)})')}.toTensor()"
        if kind in ("IntType", "SymIntType"):
            if isinstance(value, int) and not isinstance(value, bool):
                return _int_literal(value)
            raise _NotTyped
        if kind == "FloatType":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return _double_literal(value)
            raise _NotTyped
        if kind == "BoolType":
            if isinstance(value, bool):
                return "true" if value else "false"
            raise _NotTyped
        if kind == "NumberType":
            try:
                return f"at::Scalar({self.scalar(value, what)})"
            except NativeUnsupported:
                raise _NotTyped from None
        if kind == "ScalarTypeType":
            if value in _DTYPES:
                return f"at::ScalarType::{_DTYPES[value]}"
            raise _NotTyped
        if kind == "LayoutType":
            if value in _LAYOUTS:
                return f"c10::Layout::{_LAYOUTS[value]}"
            raise _NotTyped
        if kind == "MemoryFormatType":
            if value in _MEMORY_FORMATS:
                return f"c10::MemoryFormat::{_MEMORY_FORMATS[value]}"
            raise _NotTyped
        if kind == "DeviceObjType":
            if isinstance(value, torch.device) and value.type in _DEVICE_TYPES:
                index = -1 if value.index is None else int(value.index)
                return f"c10::Device(c10::DeviceType::{_DEVICE_TYPES[value.type]}, {index})"
            raise _NotTyped
        if kind == "ListType":
            elem = typ.getElementType()
            ek = _type_kind(elem)
            if not isinstance(value, (list, tuple)):
                raise _NotTyped
            if ek in ("IntType", "SymIntType"):
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                    raise _NotTyped
                ref = "at::IntArrayRef()" if not value else \
                    f"at::IntArrayRef({self.m.int_array(tuple(int(v) for v in value))}, {len(value)})"
                for v in value:
                    _int_literal(v)  # range check
                return f"c10::fromIntArrayRefSlow({ref})" if ek == "SymIntType" else ref
            if ek == "TensorType":
                if not all(isinstance(v, fx.Node) and isinstance(v.meta.get("val"), torch.Tensor) for v in value):
                    raise _NotTyped
                items = ", ".join(self.typed_tensor(v) for v in value)
                return f"at::ArrayRef<at::Tensor>(std::array<at::Tensor, {len(value)}>{{{items}}})"
            raise _NotTyped
        raise _NotTyped
