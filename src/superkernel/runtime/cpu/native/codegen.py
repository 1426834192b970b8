"""C++ code generation: one translation unit per graph, one entry point per partition."""

from __future__ import annotations

import functools
import operator
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.fx as fx

from superkernel.runtime.cpu.native.build import GENERATOR_VERSION, NativeSource, _torch_include, native_key
from superkernel.runtime.cpu.native.templates import _INIT, _PRELUDE
from superkernel.runtime.cpu.native.literals import NativeUnsupported, _DTYPES, _LAYOUTS, _MEMORY_FORMATS, _double_literal, _int_literal, _string_literal
from superkernel.runtime.cpu.native.typed import _INT_OPS, _TypedMixin, _is_int_value, _type_kind


# --- code generation -----------------------------------------------------------------------

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
        work = [n for n in nodes if n.op != "placeholder"]
        parts = _parts(work, CHUNK_OPS)
        chunked = len(parts) > 1

        self.inputs = {ph: i for i, ph in enumerate(placeholders)}
        checks = []
        for i, ph in enumerate(placeholders):
            val = ph.meta.get("val")
            if isinstance(val, torch.Tensor):
                tensor = f"reinterpret_cast<THPVariable*>(args[{i}])->cdata"
                held = f"sk_in[{i}] = c10::IValue({tensor})" if chunked else f"at::Tensor a{i} = {tensor}"  # parts load sk_in
                checks.append(f"  if (!sk_is_plain_tensor(args[{i}])) Py_RETURN_NOTIMPLEMENTED;\n  {held};")
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
        if chunked:
            functions, body = self.emit_parts(parts, outputs, release_after)
        else:
            functions = ""
            for node in work:
                self.node(node, outputs, release_after)
            body = ["    torch::jit::Stack s;", "    s.reserve(32);", *("  " + line for line in self.lines),
                    *(f"    sk_out[{k}] = {expr};" for k, expr in enumerate(outputs))]
        n_in, n_out = len(placeholders), len(outputs)
        head = [
            f"// {self.name}: {sum(1 for n in nodes if n.op == 'call_function')} operators"
            + (f" in {len(parts)} parts" if chunked else ""),
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
        ]
        tail = [
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
        return functions + "\n".join(head + body + tail) + "\n"

    def emit_parts(self, parts: list[list[fx.Node]], outputs: list[str],
                   release_after: dict[fx.Node, list[fx.Node]]) -> tuple[str, list[str]]:
        """A large partition as several C++ functions called one after the other from its entry point:
        (their source, the entry point's body that calls them).

        One function of thousands of operators (a 24-layer W8A8 decode step is 8,800) takes the C++
        compiler minutes: its time grows faster than the function's length. Parts of ``CHUNK_OPS``
        operators keep it linear; a value one part makes and a later part uses passes through
        ``sk_env`` (an IValue, released after its last use as the local would be). The operators, their
        order and their arguments are the same as in one function."""
        part_of = {node: k for k, part in enumerate(parts) for node in part}
        slot: dict[fx.Node, int] = {}
        for node in (n for part in parts for n in part):
            if node.op != "output" and any(part_of[user] > part_of[node] for user in node.users):
                slot[node] = len(slot)
        functions = []
        for k, part in enumerate(parts):
            self.lines = []
            loaded: dict[fx.Node, None] = {}
            for node in part:
                for dep in node.all_input_nodes:
                    if part_of.get(dep, -1) < k:
                        loaded[dep] = None
            for dep in loaded:
                if dep.op == "placeholder":
                    if dep in self.tensors:
                        self.lines.append(f"  at::Tensor {self.tensors[dep]} = sk_in[{self.inputs[dep]}].toTensor();")
                    continue  # numbers are read from sk_in[i] where used
                if dep in self.tensors:
                    self.lines.append(f"  at::Tensor {self.tensors[dep]} = sk_env[{slot[dep]}].toTensor();")
                elif dep in self.values:
                    self.lines.append(f"  c10::IValue {self.values[dep]} = sk_env[{slot[dep]}];")
                else:  # _parts keeps a multi-output operator and its getitems in one part
                    raise NativeUnsupported(f"{dep.name}: a multi-output value used in a later part")
            for node in part:
                self.node(node, outputs, release_after, slot)
                if node in slot:
                    if node in self.tensors:
                        self.lines.append(f"  sk_env[{slot[node]}] = c10::IValue({self.tensors[node]});")
                    elif node in self.values:
                        self.lines.append(f"  sk_env[{slot[node]}] = {self.values[node]};")
                    else:
                        raise NativeUnsupported(f"{node.name}: a multi-output value used in a later part")
            if k == len(parts) - 1:
                self.lines += [f"  sk_out[{j}] = {expr};" for j, expr in enumerate(outputs)]
            functions.append("\n".join([
                f"static void {self.name}_part{k}(c10::IValue* sk_in, c10::IValue* sk_env, c10::IValue* sk_out) {{",
                "  torch::jit::Stack s;",
                "  s.reserve(32);",
                *self.lines,
                "}",
            ]))
        calls = [f"    std::vector<c10::IValue> sk_env({max(len(slot), 1)});"]
        calls += [f"    {self.name}_part{k}(sk_in, sk_env.data(), sk_out);" for k in range(len(parts))]
        return "\n\n".join(functions) + "\n\n", calls

    def node(self, node: fx.Node, outputs: list[str], release_after: dict[fx.Node, list[fx.Node]],
             slot: dict[fx.Node, int] | None = None) -> None:
        """Emit one operator (or the output's values into ``outputs``), then release what it used last."""
        body = self.lines
        if node.op == "output":
            results = node.args[0]
            if not isinstance(results, (list, tuple)):
                raise NativeUnsupported("the partition's output is not a tuple")
            for r in results:
                val = r.meta.get("val") if isinstance(r, fx.Node) else None
                if not (isinstance(val, (torch.Tensor, float, torch.SymFloat, bool, torch.SymBool)) or _is_int_value(val)):
                    raise NativeUnsupported(f"output {r!r} is not a tensor or a number")
                outputs.append(self.node_value(r))
            return
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
            if slot is not None and dep in slot:
                body.append(f"  sk_env[{slot[dep]}] = c10::IValue();")

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


#: Operators per C++ function of a partition: a larger partition is emitted in parts (``_Function.emit_parts``).
CHUNK_OPS = 600


def _parts(work: list[fx.Node], size: int) -> list[list[fx.Node]]:
    """``work`` (the partition's nodes after its inputs) cut into runs of about ``size`` operators.

    A cut falls only where no operator before it still has a ``getitem`` after it (its multi-output
    value stays within one part), so only single values cross a cut."""
    parts: list[list[fx.Node]] = [[]]
    open_items: dict[fx.Node, int] = {}
    ops = 0
    for node in work:
        if ops >= size and not open_items and node.op != "output":
            parts.append([])
            ops = 0
        parts[-1].append(node)
        if node.op == "call_function":
            ops += 1
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node):
            src = node.args[0]
            open_items[src] = open_items.get(src, 0) - 1
            if open_items[src] <= 0:
                del open_items[src]
        items = sum(1 for user in node.users if user.target is operator.getitem)
        if items:
            open_items[node] = open_items.get(node, 0) + items
    return parts



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
    symbols: dict[str, str] = {}      # entry name -> the C function it calls
    emitted: dict[str, str] = {}      # a function's text under the placeholder name -> its C function
    for name, gm, *rest in programs:
        if not name.isidentifier():
            raise ValueError(f"entry name {name!r} is not a C identifier")
        text = _Function(module, _SHARED_NAME, gm, inference=bool(rest and rest[0])).emit()
        # identical segments (the decoder layers of a per-layer plan) emit the same text: one C++ function, built
        # once, every entry point of them calling it (the tables it reads are the module's, shared and deduplicated)
        if text not in emitted:
            emitted[text] = name
            functions.append(text.replace(_SHARED_NAME, name))
        symbols[name] = emitted[text]
        names.append(name)
    ops = "\n".join(f"  sk_ops.push_back(dispatcher.findSchemaOrThrow({_string_literal(n)}, {_string_literal(o)}));"
                    for n, o in module.op_specs)
    consts = "\n".join(f"  sk_k.push_back({init});" for init in module.const_inits)
    methods = "\n".join(f"  {{{_string_literal(n)}, (PyCFunction)(void (*)(void)){symbols[n]}, METH_FASTCALL, nullptr}},"
                        for n in names)
    headers = "".join(f"#include <{h}>\n" for h in sorted(module.headers))
    arrays = "".join(f"const int64_t {name}[] = {{{', '.join(_int_literal(v) for v in values)}}};\n"
                     for values, name in module.int_arrays.items())
    source = (_PRELUDE % {"version": GENERATOR_VERSION}).replace("// %HEADERS%\n", headers) + \
        "\nnamespace {\n" + arrays + "}  // namespace\n\n" + "\n".join(functions) + \
        (_INIT % {"ops": ops, "consts": consts, "methods": methods})
    return NativeSource(source=source, key=native_key(source), entries=tuple(names))


#: The name every function is emitted under first (a C identifier nothing else in a module uses), then replaced.
_SHARED_NAME = "sk_function_being_emitted"


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
