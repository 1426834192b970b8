"""CPU reduce-overhead segments as one native call each.

The segment's straight-line ATen program (the same program :mod:`superkernel.runtime.cpu`
runs from Python) is emitted as C++ that calls the very same ATen operators through the
dispatcher. An operator whose arguments the typed signature can take is called through
its typed entry point ``at::_ops::<op>::call`` (what ``at::<op>(...)`` calls); any other
is looked up once, when the module loads, into a table of ``c10::OperatorHandle`` and
called with ``callBoxed`` on one reused IValue stack, the path
``torch.ops.aten.X.overload(...)`` takes from Python. Same kernels, same arguments, same
order, so results are bit-identical to the flat program and to the exactness reference;
only the Python interpreter between the operators is gone. If a typed call does not
compile against this torch's headers, the module is generated again with every operator
boxed. Python integer arithmetic on symbolic sizes (``n - 3``, ``max(n, 0)``, ``//``, ``%``
with Python's semantics) is emitted as C++ integer arithmetic.

Arguments are converted exactly as the Python operator call converts them: a Python
number given for a ``Tensor`` argument (``aten.add.Tensor(x, 1e-06)``) becomes a
*wrapped-number* 0-dim CPU tensor (``scalar_to_tensor`` + ``set_wrapped_number``) so type
promotion treats it as a scalar; numbers for ``float`` arguments become doubles; schema
defaults fill omitted arguments. Constant lists and wrapped numbers are built once at
load time and shared by every call (no operator mutates them: they only ever bind to
non-mutable arguments).

All segments of one graph go into one C++ translation unit (one compiler run per graph,
each segment one entry point). Built modules are cached by content: the key is a hash of
the generated source, torch's version and the compiler command (:func:`native_key`), the
shared library lives in a private per-user cache directory (``$SUPERKERNEL_CACHE_DIR``,
else ``$XDG_CACHE_HOME/superkernel`` or ``~/.cache/superkernel``; created 0700 and refused
when another user could write it), so a later process with the same graph loads it
without compiling. The torch headers are precompiled once per torch version and compiler
(a GCC precompiled header in the same cache) to keep a graph's build to seconds.

:func:`native_source` (source text + key) and :func:`build_library` / :func:`load_library`
are the seams a static-kernel package uses to carry these objects.

Partitions of an inference graph (no output requires grad), called with grad mode off,
dispatch below the autograd layers (``ExcludeDispatchKeyGuard`` of the autograd keys and
ADInplaceOrView, what autograd's own kernels do before redispatching): with grad off
those layers compute nothing; they only keep bookkeeping (view bases, version counters)
of tensors that live inside the partition, and AOTAutograd restores the observable part
itself (it regenerates outputs that alias inputs and bumps the version of inputs the graph
mutates). The kernels, their arguments and their order are the same, so values stay
bit-identical. With grad mode on, or for a training graph, every layer runs.

Inputs that are tensor subclasses (anything but ``torch.Tensor``/``Parameter``) are not
unpacked natively: the entry point returns ``NotImplemented`` and the caller runs the
flat Python program instead (same kernels).
"""

from __future__ import annotations

import functools
import hashlib
import math
import operator
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

#: Bumped whenever the code generator changes what it emits for the same graph.
GENERATOR_VERSION = "5"

_STD = "-std=c++20"
_OPT = "-O1"


class NativeUnsupported(Exception):
    """The segment contains something the native emitter does not express (it runs flat instead)."""


class NativeBuildError(RuntimeError):
    """The C++ compiler failed (the message carries the end of its output)."""


# --- C++ literals --------------------------------------------------------------------------

_DTYPES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}
_LAYOUTS = {torch.strided: "Strided"}
_MEMORY_FORMATS = {
    torch.contiguous_format: "Contiguous", torch.preserve_format: "Preserve",
    torch.channels_last: "ChannelsLast", torch.channels_last_3d: "ChannelsLast3d",
}


def _int_literal(v: int) -> str:
    v = int(v)
    if not -(2**63) <= v < 2**63:
        raise NativeUnsupported(f"integer {v} does not fit int64")
    if v == -(2**63):
        return "(int64_t)(-9223372036854775807LL - 1)"
    return f"(int64_t){v}LL"


def _double_literal(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        return "std::numeric_limits<double>::quiet_NaN()"
    if math.isinf(v):
        return ("" if v > 0 else "-") + "std::numeric_limits<double>::infinity()"
    return f"(double){v.hex()}"  # a hexadecimal literal: exact


def _string_literal(s: str) -> str:
    out = []
    for byte in s.encode("utf-8"):
        ch = chr(byte)
        out.append(ch if 32 <= byte < 127 and ch not in '"\\?' else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


# --- code generation -----------------------------------------------------------------------

@dataclass(frozen=True)
class NativeSource:
    """Generated C++ for the native segments of one graph, and its cache key."""

    source: str
    key: str
    entries: tuple[str, ...]  # entry point names, one per segment, in the order given

    @property
    def module_name(self) -> str:
        return f"sk_native_{self.key}"


class _Module:
    """Tables shared by all functions of one translation unit."""

    def __init__(self, typed: bool = True) -> None:
        self.typed = typed
        self.headers: set[str] = set()         # ATen/ops/<op>_ops.h of the typed calls
        self.int_arrays: dict[tuple[int, ...], str] = {}
        self.ops: dict[str, int] = {}          # "aten::mm|" -> index in sk_ops
        self.op_specs: list[tuple[str, str]] = []
        self.consts: dict[str, int] = {}       # C++ initializer -> index in sk_k
        self.const_inits: list[str] = []

    def op(self, overload: torch._ops.OpOverload) -> int:
        schema = overload._schema
        key = f"{schema.name}|{schema.overload_name}"
        if key not in self.ops:
            self.ops[key] = len(self.op_specs)
            self.op_specs.append((schema.name, schema.overload_name))
        return self.ops[key]

    def int_array(self, values: tuple[int, ...]) -> str:
        """A namespace-level ``int64_t`` array (for IntArrayRef arguments); its name."""
        if values not in self.int_arrays:
            self.int_arrays[values] = f"sk_ia{len(self.int_arrays)}"
        return self.int_arrays[values]

    def const(self, init: str) -> str:
        if init not in self.consts:
            self.consts[init] = len(self.const_inits)
            self.const_inits.append(init)
        return f"sk_k[{self.consts[init]}]"


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


class _Function(_TypedMixin):
    def __init__(self, module: _Module, name: str, gm: fx.GraphModule, inference: bool = False) -> None:
        self.inference = inference
        self.m = module
        self.name = name
        self.gm = gm
        self.lines: list[str] = []
        self.values: dict[fx.Node, str] = {}       # node -> C++ expression of its IValue
        self.multi: dict[fx.Node, list[str]] = {}  # node with several returns -> their variables
        self.listy: set[fx.Node] = set()           # node whose one return is a list
        self.owned: set[str] = set()               # variables that may be released after the last use
        self.tensors: dict[fx.Node, str] = {}      # node held as an at::Tensor variable (typed calls, inputs)
        self.typed_multi: dict[fx.Node, tuple[str, str]] = {}  # node -> (variable, "tuple" | "vector")

    # values ------------------------------------------------------------------------------
    def node_value(self, node: fx.Node) -> str:
        if node in self.tensors:
            return f"c10::IValue({self.tensors[node]})"
        if node not in self.values:
            raise NativeUnsupported(f"{node.name} is used without a value (multi-output op used whole)")
        return self.values[node]

    def arg(self, value: Any, typ: Any, what: str) -> str:
        """C++ expression (an IValue or convertible to one) for ``value`` bound to an argument of type ``typ``."""
        kind = _type_kind(typ)
        if isinstance(value, fx.Node):
            val = value.meta.get("val")
            if isinstance(val, torch.Tensor) and kind in ("TensorType", "OptionalType"):
                if kind == "OptionalType" and _type_kind(typ.getElementType()) != "TensorType":
                    raise NativeUnsupported(f"{what}: tensor for {typ}")
                return self.node_value(value)
            if isinstance(val, (list, tuple)) and kind == "ListType":
                return self.node_value(value)
            if isinstance(val, (bool, torch.SymBool)) and kind in ("BoolType", "NumberType"):
                return self.node_value(value)
            if _is_int_value(val) and kind in ("IntType", "SymIntType", "NumberType", "OptionalType"):
                if kind == "OptionalType" and _type_kind(typ.getElementType()) not in ("IntType", "SymIntType", "NumberType"):
                    raise NativeUnsupported(f"{what}: node {value.name} (int) for {typ}")
                return self.node_value(value)
            if (_is_int_value(val) or isinstance(val, (float, torch.SymFloat))) and kind == "TensorType":
                return f"sk_wrapped({self.node_value(value)}.toScalar())"  # as the Python call wraps a number
            if _is_int_value(val) and kind == "FloatType":
                return f"c10::IValue(static_cast<double>({self.node_value(value)}.toInt()))"
            if isinstance(val, (float, torch.SymFloat)) and kind in ("FloatType", "NumberType"):
                return self.node_value(value)
            raise NativeUnsupported(f"{what}: node {value.name} ({type(val).__name__}) for {typ}")
        if value is None:
            if kind in ("OptionalType", "NoneType"):
                return "c10::IValue()"
            raise NativeUnsupported(f"{what}: None for {typ}")
        if kind == "OptionalType":
            return self.arg(value, typ.getElementType(), what)
        if kind == "TensorType":
            if isinstance(value, (bool, int, float)):  # the Python call wraps it the same way
                return self.m.const(f"sk_wrapped({self.scalar(value, what)})")
            raise NativeUnsupported(f"{what}: constant {type(value).__name__} for a Tensor")
        if kind in ("IntType", "SymIntType"):
            if isinstance(value, torch.dtype):
                return self.dtype(value, what)
            if isinstance(value, int):
                return f"c10::IValue({_int_literal(value)})"
            raise NativeUnsupported(f"{what}: {value!r} for int")
        if kind == "FloatType":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return f"c10::IValue({_double_literal(value)})"
            raise NativeUnsupported(f"{what}: {value!r} for float")
        if kind == "BoolType":
            if isinstance(value, bool):
                return f"c10::IValue({'true' if value else 'false'})"
            raise NativeUnsupported(f"{what}: {value!r} for bool")
        if kind == "NumberType":
            return f"c10::IValue({self.scalar(value, what)})"
        if kind == "StringType":
            if isinstance(value, str):
                return self.m.const(f"c10::IValue(std::string({_string_literal(value)}))")
            raise NativeUnsupported(f"{what}: {value!r} for str")
        if kind == "DeviceObjType":
            if isinstance(value, torch.device):
                return self.m.const(f"c10::IValue(c10::Device({_string_literal(str(value))}))")
            raise NativeUnsupported(f"{what}: {value!r} for Device")
        if kind == "ScalarTypeType":
            return self.dtype(value, what)
        if kind == "LayoutType":
            if value in _LAYOUTS:
                return f"c10::IValue(c10::Layout::{_LAYOUTS[value]})"
            raise NativeUnsupported(f"{what}: layout {value!r}")
        if kind == "MemoryFormatType":
            if value in _MEMORY_FORMATS:
                return f"c10::IValue(c10::MemoryFormat::{_MEMORY_FORMATS[value]})"
            raise NativeUnsupported(f"{what}: memory format {value!r}")
        if kind == "ListType":
            return self.list_arg(value, typ.getElementType(), what)
        raise NativeUnsupported(f"{what}: argument type {typ} ({value!r})")

    def dtype(self, value: Any, what: str) -> str:
        if value in _DTYPES:
            return f"c10::IValue(c10::ScalarType::{_DTYPES[value]})"
        raise NativeUnsupported(f"{what}: dtype {value!r}")

    def scalar(self, value: Any, what: str) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return _int_literal(value)
        if isinstance(value, float):
            return _double_literal(value)
        raise NativeUnsupported(f"{what}: {value!r} as a Scalar")

    def list_arg(self, value: Any, elem: Any, what: str) -> str:
        if not isinstance(value, (list, tuple)):
            raise NativeUnsupported(f"{what}: {type(value).__name__} for a list")
        ek = _type_kind(elem)
        if ek == "TensorType":
            items = [f"{self.arg(v, elem, what)}.toTensor()" for v in value]
            return f"sk_tensor_list({{{', '.join(items)}}})"
        if ek == "OptionalType" and _type_kind(elem.getElementType()) == "TensorType":
            items = ["std::optional<at::Tensor>()" if v is None else
                     f"std::optional<at::Tensor>({self.arg(v, elem.getElementType(), what)}.toTensor())" for v in value]
            return f"sk_optional_tensor_list({{{', '.join(items)}}})"
        if any(isinstance(v, fx.Node) for v in value):
            if ek not in ("IntType", "SymIntType"):
                raise NativeUnsupported(f"{what}: list of {elem} with run-time values")
            items = []
            for v in value:
                if isinstance(v, fx.Node):
                    if not _is_int_value(v.meta.get("val")):
                        raise NativeUnsupported(f"{what}: {v.name} in an int list is not an int")
                    items.append(f"{self.node_value(v)}.toInt()")
                elif isinstance(v, int):
                    items.append(_int_literal(v))
                else:
                    raise NativeUnsupported(f"{what}: {v!r} in an int list")
            return f"c10::IValue(std::vector<int64_t>{{{', '.join(items)}}})"
        if ek in ("IntType", "SymIntType"):
            if not all(isinstance(v, int) for v in value):
                raise NativeUnsupported(f"{what}: {value!r} for int[]")
            return self.m.const(f"c10::IValue(std::vector<int64_t>{{{', '.join(_int_literal(v) for v in value)}}})")
        if ek == "FloatType":
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                raise NativeUnsupported(f"{what}: {value!r} for float[]")
            return self.m.const(f"c10::IValue(std::vector<double>{{{', '.join(_double_literal(v) for v in value)}}})")
        if ek == "BoolType":
            if not all(isinstance(v, bool) for v in value):
                raise NativeUnsupported(f"{what}: {value!r} for bool[]")
            return self.m.const(f"c10::IValue(c10::List<bool>({{{', '.join('true' if v else 'false' for v in value)}}}))")
        raise NativeUnsupported(f"{what}: list of {elem}")

    # nodes -------------------------------------------------------------------------------
    def emit(self) -> str:
        nodes = list(self.gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        last_use: dict[fx.Node, fx.Node] = {}
        for node in nodes:
            for dep in node.all_input_nodes:
                last_use[dep] = node
        release_after: dict[fx.Node, list[fx.Node]] = {}
        for dep, user in last_use.items():
            release_after.setdefault(user, []).append(dep)

        body = self.lines
        checks = []
        for i, ph in enumerate(placeholders):
            val = ph.meta.get("val")
            if isinstance(val, torch.Tensor):
                checks.append(f"  if (!sk_is_plain_tensor(args[{i}])) Py_RETURN_NOTIMPLEMENTED;\n"
                              f"  at::Tensor a{i} = reinterpret_cast<THPVariable*>(args[{i}])->cdata;")
                self.tensors[ph] = f"a{i}"
                continue
            elif _is_int_value(val):
                checks.append(f"  if (!PyLong_CheckExact(args[{i}])) Py_RETURN_NOTIMPLEMENTED;\n"
                              f"  sk_in[{i}] = c10::IValue((int64_t)PyLong_AsLongLong(args[{i}]));\n"
                              "  if (PyErr_Occurred()) return nullptr;")
            elif isinstance(val, (float, torch.SymFloat)):
                checks.append(f"  if (!PyFloat_CheckExact(args[{i}])) Py_RETURN_NOTIMPLEMENTED;\n"
                              f"  sk_in[{i}] = c10::IValue(PyFloat_AS_DOUBLE(args[{i}]));")
            else:
                raise NativeUnsupported(f"input {ph.name} is a {type(val).__name__}")
            self.values[ph] = f"sk_in[{i}]"
        outputs: list[str] = []
        for node in nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                results = node.args[0]
                if not isinstance(results, (list, tuple)):
                    raise NativeUnsupported("the partition's output is not a tuple")
                for r in results:
                    val = r.meta.get("val") if isinstance(r, fx.Node) else None
                    if not (isinstance(val, (torch.Tensor, float, torch.SymFloat, bool, torch.SymBool)) or _is_int_value(val)):
                        raise NativeUnsupported(f"output {r!r} is not a tensor or a number")
                    outputs.append(self.node_value(r))
                continue
            if node.op != "call_function":
                raise NativeUnsupported(f"{node.op} node {node.name}")
            if node.target is operator.getitem:
                self.getitem(node)
            elif node.target in _INT_OPS:
                self.int_op(node)
            elif isinstance(node.target, torch._ops.OpOverload):
                self.call(node)
            else:
                raise NativeUnsupported(f"call of {getattr(node.target, '__name__', node.target)!r} (not an ATen operator)")
            for dep in release_after.get(node, ()):
                var = self.values.get(dep)
                if var in self.owned:
                    body.append(f"  {var} = c10::IValue();")
                tvar = self.tensors.get(dep)
                if tvar in self.owned:
                    body.append(f"  {tvar}.reset();")
                if dep in self.typed_multi:
                    body.append(f"  {self.typed_multi[dep][0]} = {{}};")
                for v in self.multi.get(dep, ()):
                    body.append(f"  {v} = c10::IValue();")
        n_in, n_out = len(placeholders), len(outputs)
        head = [
            f"// {self.name}: {sum(1 for n in nodes if n.op == 'call_function')} operators",
            f"static PyObject* {self.name}(PyObject*, PyObject* const* args, Py_ssize_t nargs) {{",
            f"  if (nargs != {n_in}) return sk_bad_nargs({n_in}, nargs);",
            f"  c10::IValue sk_in[{max(n_in, 1)}];",
            *checks,
            f"  c10::IValue sk_out[{max(n_out, 1)}];",
            "  try {",
            "    SkNoGil sk_nogil;",
            *([
                "    // An inference graph run with grad disabled: the autograd and view/version-tracking",
                "    // layers have nothing to record, so the calls go straight to the kernels below them.",
                "    std::optional<c10::impl::ExcludeDispatchKeyGuard> sk_below_autograd;",
                "    if (!c10::GradMode::is_enabled())",
                "      sk_below_autograd.emplace(c10::autograd_dispatch_keyset_with_ADInplaceOrView);",
            ] if self.inference else []),
            "    torch::jit::Stack s;",
            "    s.reserve(32);",
        ]
        tail = [f"    sk_out[{k}] = {expr};" for k, expr in enumerate(outputs)]
        tail += [
            "  } catch (const c10::Error& e) {",
            "    PyErr_SetString(sk_error_type(e), e.what_without_backtrace());",
            "    return nullptr;",
            "  } catch (const std::exception& e) {",
            "    PyErr_SetString(PyExc_RuntimeError, e.what());",
            "    return nullptr;",
            "  }",
            f"  return sk_wrap_outputs(sk_out, {n_out});",
            "}",
        ]
        return "\n".join(head + ["  " + line for line in body] + tail) + "\n"

    def int_op(self, node: fx.Node) -> None:
        """Python arithmetic/comparison on integer sizes (SymInts of a growing cache position)."""
        if node.kwargs:
            raise NativeUnsupported(f"{node.name}: keyword arguments to {node.target}")
        operands = []
        for a in node.args:
            if isinstance(a, fx.Node) and _is_int_value(a.meta.get("val")):
                operands.append(f"{self.node_value(a)}.toInt()")
            elif isinstance(a, int) and not isinstance(a, bool):
                operands.append(_int_literal(a))
            else:
                raise NativeUnsupported(f"{node.name}: {node.target} of {a!r} (integers only)")
        template, arity = _INT_OPS[node.target]
        if len(operands) != arity:
            raise NativeUnsupported(f"{node.name}: {node.target} with {len(operands)} operands")
        v = self.var(node)
        self.lines.append(f"  c10::IValue {v} = c10::IValue({template.format(*operands)});")
        self.values[node] = v

    def var(self, node: fx.Node) -> str:
        v = f"v_{node.name}"
        self.owned.add(v)
        return v

    def getitem(self, node: fx.Node) -> None:
        src, idx = node.args
        if not isinstance(src, fx.Node) or not isinstance(idx, int):
            raise NativeUnsupported(f"getitem {node.name} with non-constant index")
        if src in self.typed_multi:
            var, kind = self.typed_multi[src]
            t = f"t_{node.name}"
            self.owned.add(t)
            item = f"std::get<{idx}>({var})" if kind == "tuple" else f"{var}.at({idx})"
            self.lines.append(f"  at::Tensor {t} = {item};")
            self.tensors[node] = t
            return
        if src in self.multi:
            outs = self.multi[src]
            if not 0 <= idx < len(outs):
                raise NativeUnsupported(f"getitem {node.name}: index {idx} out of range")
            v = self.var(node)
            self.lines.append(f"  c10::IValue {v} = {outs[idx]};")
        elif src in self.listy:
            v = self.var(node)
            self.lines.append(f"  c10::IValue {v} = {self.values[src]}.toListRef().at({idx});")
        else:
            raise NativeUnsupported(f"getitem {node.name} of {src.name}, which returns no list or tuple")
        self.values[node] = v

    def call(self, node: fx.Node) -> None:
        overload: torch._ops.OpOverload = node.target  # type: ignore[assignment]
        schema = overload._schema
        if getattr(schema, "is_vararg", False) or getattr(schema, "is_varret", False):
            raise NativeUnsupported(f"{schema.name} has variadic arguments or returns")
        args, kwargs = list(node.args), dict(node.kwargs)
        if len(args) > len(schema.arguments):
            raise NativeUnsupported(f"{node.name}: {len(args)} positional arguments for {schema.name}")
        bound = []
        for i, a in enumerate(schema.arguments):
            if i < len(args) and not a.kwarg_only:
                value = args[i]
            elif a.name in kwargs:
                value = kwargs.pop(a.name)
            elif a.has_default_value():
                value = a.default_value
            else:
                raise NativeUnsupported(f"{node.name}: argument {a.name!r} of {schema.name} is missing")
            bound.append((a, value))
        if kwargs:
            raise NativeUnsupported(f"{node.name}: unknown keyword argument(s) {', '.join(kwargs)}")
        if self.m.typed and self.typed_call(node, schema, bound):
            return
        pushes = [self.arg(value, a.real_type, f"{node.name}.{a.name}") for a, value in bound]
        index = self.m.op(overload)
        lines = self.lines
        lines.append(f"  // {node.name} = {schema.name}.{schema.overload_name or 'default'}")
        for p in pushes:
            lines.append(f"  s.emplace_back({p});")
        lines.append(f"  sk_ops[{index}].callBoxed(s);")
        rets = schema.returns
        lines.append(f"  sk_check_returns(s, {len(rets)}, {index});")
        if len(rets) == 1:
            v = self.var(node)
            lines.append(f"  c10::IValue {v} = std::move(s[0]);")
            self.values[node] = v
            if _type_kind(rets[0].real_type) == "ListType":
                self.listy.add(node)
        elif len(rets) > 1:
            outs = []
            for k in range(len(rets)):
                v = f"v_{node.name}_{k}"
                lines.append(f"  c10::IValue {v} = std::move(s[{k}]);")
                outs.append(v)
            self.multi[node] = outs
        lines.append("  s.clear();")


_PRELUDE = r"""
// Generated by superkernel.runtime.native_cpu (generator %(version)s). Do not edit.
#include "sk_native_pch.h"
// %%HEADERS%%
#include <array>

// The Python object behind a torch.Tensor (torch/csrc/autograd/python_variable.h; checked
// against the installed header when this file is generated).
struct THPVariable { PyObject_HEAD at::Tensor cdata; };
PyObject* THPVariable_Wrap(const at::TensorBase& var);
extern PyObject* THPVariableClass;
extern PyObject* ParameterClass;
namespace at::detail {
at::Tensor scalar_tensor_static(const c10::Scalar& s, std::optional<c10::ScalarType> dtype_opt,
                                std::optional<c10::Device> device_opt);
}

#define SK_CAT2(a, b) a##b
#define SK_CAT(a, b) SK_CAT2(a, b)
#define SK_STR2(a) #a
#define SK_STR(a) SK_STR2(a)

namespace {

std::vector<c10::OperatorHandle> sk_ops;
std::vector<c10::IValue> sk_k;

struct SkNoGil {
  PyThreadState* state;
  SkNoGil() : state(PyEval_SaveThread()) {}
  ~SkNoGil() { PyEval_RestoreThread(state); }
};

inline bool sk_is_plain_tensor(PyObject* obj) {
  PyTypeObject* tp = Py_TYPE(obj);
  return tp == (PyTypeObject*)THPVariableClass || (ParameterClass && tp == (PyTypeObject*)ParameterClass);
}

// A Python number given for a Tensor argument, exactly as the Python operator call wraps it.
c10::IValue sk_wrapped(const c10::Scalar& s) {
  at::Tensor t = at::detail::scalar_tensor_static(s, s.type(), c10::Device(c10::kCPU));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c10::IValue(std::move(t));
}

c10::IValue sk_tensor_list(std::initializer_list<at::Tensor> xs) {
  c10::List<at::Tensor> l;
  l.reserve(xs.size());
  for (const auto& x : xs) l.push_back(x);
  return c10::IValue(std::move(l));
}

c10::IValue sk_optional_tensor_list(std::initializer_list<std::optional<at::Tensor>> xs) {
  c10::List<std::optional<at::Tensor>> l;
  l.reserve(xs.size());
  for (const auto& x : xs) l.push_back(x);
  return c10::IValue(std::move(l));
}

inline void sk_check_returns(const torch::jit::Stack& s, size_t n, size_t op) {
  TORCH_CHECK(s.size() == n, "superkernel native: ", sk_ops[op].schema().name(), " left ", s.size(),
              " values on the stack, expected ", n);
}

// The Python exception type torch raises for an ATen error (torch/csrc/Exceptions.h maps them alike).
PyObject* sk_error_type(const c10::Error& e) {
  if (dynamic_cast<const c10::IndexError*>(&e)) return PyExc_IndexError;
  if (dynamic_cast<const c10::ValueError*>(&e)) return PyExc_ValueError;
  if (dynamic_cast<const c10::TypeError*>(&e)) return PyExc_TypeError;
  if (dynamic_cast<const c10::NotImplementedError*>(&e)) return PyExc_NotImplementedError;
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return PyExc_MemoryError;
  return PyExc_RuntimeError;
}

// Python's // and %% on integers (floor division; the remainder takes the divisor's sign).
int64_t sk_floordiv(int64_t a, int64_t b) {
  if (b == 0) throw std::domain_error("integer division or modulo by zero");
  int64_t q = a / b;
  if ((a %% b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t sk_mod(int64_t a, int64_t b) {
  if (b == 0) throw std::domain_error("integer division or modulo by zero");
  int64_t r = a %% b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

PyObject* sk_bad_nargs(Py_ssize_t expected, Py_ssize_t got) {
  PyErr_Format(PyExc_TypeError, "superkernel native segment takes %%zd tensors, got %%zd", expected, got);
  return nullptr;
}

PyObject* sk_wrap_outputs(c10::IValue* outs, Py_ssize_t n) {
  PyObject* tuple = PyTuple_New(n);
  if (!tuple) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* t;
    if (outs[i].isTensor()) t = THPVariable_Wrap(std::move(outs[i]).toTensor());
    else if (outs[i].isBool()) t = PyBool_FromLong(outs[i].toBool());
    else if (outs[i].isInt()) t = PyLong_FromLongLong(outs[i].toInt());
    else if (outs[i].isDouble()) t = PyFloat_FromDouble(outs[i].toDouble());
    else if (outs[i].isNone()) { Py_INCREF(Py_None); t = Py_None; }
    else { PyErr_SetString(PyExc_TypeError, "superkernel native: unexpected output type"); t = nullptr; }
    if (!t) { Py_DECREF(tuple); return nullptr; }
    PyTuple_SET_ITEM(tuple, i, t);
  }
  return tuple;
}

}  // namespace
"""

_INIT = r"""
namespace {

void sk_init() {
  auto& dispatcher = c10::Dispatcher::singleton();
  (void)dispatcher;
%(ops)s
%(consts)s
}

PyMethodDef sk_methods[] = {
%(methods)s
  {nullptr, nullptr, 0, nullptr}};

PyModuleDef sk_module = {PyModuleDef_HEAD_INIT, SK_STR(SK_MODULE), nullptr, -1, sk_methods};

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* SK_CAT(PyInit_, SK_MODULE)(void) {
  try {
    sk_init();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ImportError, e.what());
    return nullptr;
  }
  return PyModule_Create(&sk_module);
}
"""


def native_source(programs: Sequence[tuple[Any, ...]], *, typed: bool = True) -> NativeSource:
    """C++ for ``programs`` (``(entry name, partition GraphModule[, inference])``), one module.

    ``inference``: the partition belongs to an inference graph (no output requires grad);
    when grad mode is off at the call, its operators are dispatched below the autograd and
    ADInplaceOrView layers (see the module doc).

    ``typed``: operators with a typed ATen entry point (``at::_ops::<op>::call``) and arguments
    it can express are called through it (no boxing); the rest, and all of them with
    ``typed=False``, through ``OperatorHandle::callBoxed``. Both reach the same kernels.
    Raises :class:`NativeUnsupported` naming the first construct it cannot express.
    """
    _check_python_variable_layout()
    module = _Module(typed=typed)
    functions = []
    names = []
    for name, gm, *rest in programs:
        if not name.isidentifier():
            raise ValueError(f"entry name {name!r} is not a C identifier")
        functions.append(_Function(module, name, gm, inference=bool(rest and rest[0])).emit())
        names.append(name)
    ops = "\n".join(f"  sk_ops.push_back(dispatcher.findSchemaOrThrow({_string_literal(n)}, {_string_literal(o)}));"
                    for n, o in module.op_specs)
    consts = "\n".join(f"  sk_k.push_back({init});" for init in module.const_inits)
    methods = "\n".join(f"  {{{_string_literal(n)}, (PyCFunction)(void (*)(void)){n}, METH_FASTCALL, nullptr}},"
                        for n in names)
    headers = "".join(f"#include <{h}>\n" for h in sorted(module.headers))
    arrays = "".join(f"const int64_t {name}[] = {{{', '.join(_int_literal(v) for v in values)}}};\n"
                     for values, name in module.int_arrays.items())
    source = (_PRELUDE % {"version": GENERATOR_VERSION}).replace("// %HEADERS%\n", headers) + \
        "\nnamespace {\n" + arrays + "}  // namespace\n\n" + "\n".join(functions) + \
        (_INIT % {"ops": ops, "consts": consts, "methods": methods})
    return NativeSource(source=source, key=native_key(source), entries=tuple(names))


@functools.lru_cache(maxsize=1)
def _check_python_variable_layout() -> None:
    """The source declares THPVariable's layout itself (its header pulls in pybind11, which would
    double the build time); make sure the installed torch still has that layout."""
    header = Path(_torch_include()) / "torch" / "csrc" / "autograd" / "python_variable.h"
    try:
        text = header.read_text()
    except OSError as exc:
        raise NativeUnsupported(f"cannot read {header}: {exc}") from None
    start = text.find("struct THPVariable {")
    body = text[start:text.find("};", start)] if start >= 0 else ""
    fields = [line.strip() for line in body.splitlines()[1:] if line.strip() and not line.strip().startswith("//")]
    if len(fields) < 2 or fields[0] != "PyObject_HEAD" or fields[1] not in ("at::Tensor cdata;",):
        raise NativeUnsupported("this torch's THPVariable layout is not the one the native emitter knows")


# --- build and cache -----------------------------------------------------------------------

def _torch_include() -> str:
    return os.path.join(os.path.dirname(torch.__file__), "include")


def _torch_lib() -> str:
    return os.path.join(os.path.dirname(torch.__file__), "lib")


def compiler() -> str:
    """The C++ compiler: ``$CXX`` or ``g++``/``c++`` found on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return cxx
    for name in ("g++", "c++"):
        path = shutil.which(name)
        if path:
            return path
    raise NativeBuildError("no C++ compiler found (set CXX or install g++)")


def compiler_available() -> bool:
    try:
        _compiler_id(compiler())
    except NativeBuildError:
        return False
    return True


@functools.lru_cache(maxsize=4)
def _compiler_id(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else cxx
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"cannot run the C++ compiler {cxx!r}: {exc}") from None


def _compile_flags() -> list[str]:
    return [_OPT, "-fPIC", _STD, "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-I{_torch_include()}", f"-I{sysconfig.get_paths()['include']}"]


def _link_flags() -> list[str]:
    lib = _torch_lib()
    return [f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}"]


def build_fingerprint() -> str:
    """What besides the source decides the binary: torch, Python ABI, compiler, flags."""
    cxx = compiler()
    parts = [GENERATOR_VERSION, torch.__version__, str(getattr(torch.version, "git_version", "")),
             sysconfig.get_config_var("EXT_SUFFIX") or "", sys.version.split()[0], _compiler_id(cxx),
             " ".join(_compile_flags()), " ".join(_link_flags())]
    return "\n".join(parts)


def native_key(source: str) -> str:
    """Content hash of a native module: its source and :func:`build_fingerprint`."""
    h = hashlib.sha256()
    h.update(source.encode())
    h.update(b"\0")
    try:
        h.update(build_fingerprint().encode())
    except NativeBuildError:
        h.update(b"no-compiler")
    return h.hexdigest()[:32]


def cache_dir() -> Path:
    """The private per-user cache of native modules (created 0700; refused if others can write it)."""
    base = os.environ.get("SUPERKERNEL_CACHE_DIR")
    if base:
        root = Path(base).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "superkernel"
    path = root / "native_cpu"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for p in (root, path):
        st = p.stat()
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise NativeBuildError(f"cache directory {p} belongs to another user; set SUPERKERNEL_CACHE_DIR")
        if st.st_mode & 0o022:
            try:
                os.chmod(p, st.st_mode & ~0o022)
            except OSError:
                raise NativeBuildError(f"cache directory {p} is writable by other users; set SUPERKERNEL_CACHE_DIR") from None
    return path


_PCH_HEADER = """// superkernel native CPU modules: the torch headers they need (precompiled once).
#include <Python.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <limits>
"""

_lock = threading.Lock()


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"{what}: cannot run {cmd[0]}: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip()[-1500:]
        raise NativeBuildError(f"{what} failed (exit {proc.returncode}): {tail}")


def _pch_dir(root: Path) -> Path:
    """Directory with ``sk_native_pch.h`` and, when it could be built, its precompiled form."""
    cxx = compiler()
    key = hashlib.sha256((_PCH_HEADER + build_fingerprint()).encode()).hexdigest()[:24]
    directory = root / f"pch-{key}"
    header = directory / "sk_native_pch.h"
    gch = directory / "sk_native_pch.h.gch"
    failed = directory / "failed"
    if gch.exists() or failed.exists():
        return directory
    directory.mkdir(exist_ok=True, mode=0o700)
    if not header.exists():
        _atomic_bytes(header, _PCH_HEADER.encode())
    if "g++" not in os.path.basename(cxx) and "gcc" not in _compiler_id(cxx).lower():
        return directory  # only GCC's precompiled headers are used; other compilers read the header
    fd, tmp = tempfile.mkstemp(prefix=".gch.", dir=directory)
    os.close(fd)
    try:
        _run([cxx, *_compile_flags(), "-x", "c++-header", str(header), "-o", tmp], "precompiling the torch headers")
        os.replace(tmp, gch)
    except NativeBuildError:
        failed.write_text("the precompiled header failed to build; modules include the header instead\n")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return directory


def _atomic_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def library_path(src: NativeSource, directory: Path | None = None) -> Path:
    return (directory or cache_dir()) / f"{src.module_name}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def build_library(src: NativeSource, directory: Path | None = None) -> Path:
    """The shared library of ``src`` in ``directory`` (default: the cache), compiled if absent."""
    out = library_path(src, directory)
    if out.exists():
        return out
    root = cache_dir()
    pch = _pch_dir(root)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{src.module_name}.", dir=out.parent))
    try:
        cpp = work / f"{src.module_name}.cpp"
        cpp.write_text(src.source)
        tmp_so = work / out.name
        _run([compiler(), *_compile_flags(), f"-I{pch}", f"-DSK_MODULE={src.module_name}", "-shared", str(cpp),
              "-o", str(tmp_so), *_link_flags()], f"building native module {src.module_name}")
        os.replace(tmp_so, out)
        try:
            os.replace(cpp, out.parent / f"{src.module_name}.cpp")  # kept beside it for reading
        except OSError:
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


_loaded: dict[str, Any] = {}


def load_library(path: Path | str, module_name: str) -> Any:
    """Import a built native module (once per process)."""
    import importlib.machinery
    import importlib.util

    if module_name in _loaded:
        return _loaded[module_name]
    loader = importlib.machinery.ExtensionFileLoader(module_name, str(path))
    spec = importlib.util.spec_from_file_location(module_name, str(path), loader=loader)
    if spec is None:
        raise NativeBuildError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    _loaded[module_name] = module
    return module


def load(src: NativeSource) -> Any:
    """The loaded module of ``src``: from this process, from the cache, or built now."""
    with _lock:
        if src.module_name in _loaded:
            return _loaded[src.module_name]
        return load_library(build_library(src), src.module_name)


# --- one graph's native segments -------------------------------------------------------------

class NativeGroup:
    """The native segments of one graph: emitted together and built as one module at the
    first call of any of them (or by :meth:`build`), so a graph costs one compiler run."""

    def __init__(self) -> None:
        self.segments: list[NativeSegment] = []
        self.source: NativeSource | None = None
        self.error: BaseException | None = None
        self._built = False
        self._lock = threading.Lock()

    def add(self, name: str, gm: fx.GraphModule, flat: Callable[..., Any],
            on_failure: Callable[[BaseException], None] | None = None, inference: bool = False) -> "NativeSegment":
        """Add a segment; raises :class:`NativeUnsupported` at once if it cannot be emitted.
        ``on_failure(exc)`` is called if the module later fails to build (the segment then runs ``flat``)."""
        entry = "seg_%d_%s" % (len(self.segments), "".join(c if c.isalnum() else "_" for c in name)[:48])
        _check_python_variable_layout()
        _Function(_Module(), entry, gm).emit()  # unsupported constructs surface now, per segment
        seg = NativeSegment(self, entry, gm, flat, on_failure)
        seg.inference = inference
        self.segments.append(seg)
        return seg

    def build(self) -> None:
        with self._lock:
            if self._built:
                return
            self._built = True
            try:
                programs = [(s.entry, s.gm, s.inference) for s in self.segments]
                self.source = native_source(programs)
                try:
                    module = load(self.source)
                except NativeBuildError:
                    if "(typed)" not in self.source.source:
                        raise
                    # a typed call this torch's headers do not take: every operator boxed instead
                    self.source = native_source(programs, typed=False)
                    module = load(self.source)
                for s in self.segments:
                    s._fn = getattr(module, s.entry)
            except Exception as exc:  # noqa: BLE001 - any build failure: the flat programs run, reported
                self.error = exc
                for s in self.segments:
                    s._fn = None
                for s in self.segments:
                    if s.on_failure is not None:
                        s.on_failure(exc)


class NativeSegment:
    """Callable of one native segment; runs the flat program until (and unless) the module is built,
    and for inputs the native entry point does not take (tensor subclasses)."""

    def __init__(self, group: NativeGroup, entry: str, gm: fx.GraphModule, flat: Callable[..., Any],
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        self.group = group
        self.on_failure = on_failure
        self.entry = entry
        self.gm = gm
        self.inference = False  # an inference graph: dispatch below autograd when grad is off
        self.flat = flat
        self._fn: Callable[..., Any] | None | bool = False  # False: not built yet; None: failed

    def __call__(self, *args: Any) -> Any:
        fn = self._fn
        if fn is False:
            self.group.build()
            fn = self._fn
        if fn is None:
            return self.flat(*args)
        out = fn(*args)
        if out is NotImplemented:
            return self.flat(*args)
        return out
