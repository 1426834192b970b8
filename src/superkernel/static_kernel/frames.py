"""Precompiled frames: Dynamo's capture of a compiled function, kept in the static package.

Loading a package's partitions removes TorchInductor's compile time, but the first call
still pays Dynamo tracing the model's Python (about as long again as everything else in a
cold start of a small model). A *frame* removes that too. It is torch's own AOT precompile
(``torch.compile(fn, fullgraph=True).aot_compile``): the transformed bytecode, the guards
and the Dynamo graph, saved with ``AOTCompiledFunction.serialize``. The backend part of a
frame (:class:`FrameGraph`) stores only Dynamo's graph; when a loaded frame is first
called, the superkernel backend captures and segments that graph again and its partitions
load from the package as usual, so a frame holds no compiled code of its own.

What keeps a loaded frame honest (torch drops guards it cannot serialize: object
identities, classes, closures):

* its key (:func:`frame_key`) covers the function's code, the compiler config, the input
  signature and the *structure* of every object the function closes over (module classes,
  parameter and buffer shapes and dtypes);
* the source of every module Dynamo inlined must be unchanged since the build
  (:func:`stale_sources`), else the frame is ignored with a warning;
* the guards torch keeps (tensor shapes, strides, dtypes, devices, grad mode, constants)
  are checked on every call; a call they reject runs the normal ``torch.compile`` path.

Objects the function closes over (the model, the KV cache) are never serialized: they are
passed in as external data when the frame is saved and loaded.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import inspect
import json
import logging
from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel.static_kernel.signature import value_signature

FRAME_FORMAT = "superkernel-frame-1"
log = logging.getLogger("superkernel.static_kernel")

# The backend that compiles frames being loaded (deserialization gets bytes only).
_LOADING_BACKEND: contextvars.ContextVar[Any] = contextvars.ContextVar("superkernel_frame_backend", default=None)

_PLAIN = (type(None), bool, int, float, complex, str, bytes)


class FrameUnsupported(RuntimeError):
    """This function cannot be precompiled as one frame (the message says why)."""


def _abc_base() -> type:
    try:
        from torch._dynamo.aot_compile_types import SerializableCallable
    except ImportError:  # pragma: no cover - torch without AOT precompile
        return object
    return SerializableCallable


class FrameGraph(_abc_base()):  # type: ignore[misc]
    """The backend output of a precompiled frame, compiled by superkernel when first called.

    ``level`` says which graph it holds: ``"dynamo"`` (Dynamo's graph: the backend captures
    it with AOTAutograd again) or ``"aten"`` (the inference ATen graph AOTAutograd handed
    the backend, kept only when AOTAutograd's runtime wrapper would add nothing but
    ``no_grad`` around it — see :func:`direct_call_blocker`; then loading skips AOTAutograd).
    """

    def __init__(self, level: str, data: bytes, graph: fx.GraphModule | None, compiled: Callable[..., Any] | None,
                 backend: Any) -> None:
        self.level = level
        self._data = data
        self._graph = graph
        self._compiled = compiled
        self._backend = backend

    def __call__(self, *args: Any) -> Any:
        if self._compiled is None:
            self._compiled = self._compile(list(args))
        return self._compiled(*args)

    def _compile(self, args: list[Any]) -> Callable[..., Any]:
        if self._backend is None:
            raise RuntimeError("a precompiled frame was loaded without a superkernel backend")
        if self._graph is None:
            self._graph = _load_graph(self._data)
        if self.level == "dynamo":
            return self._backend(self._graph, args)
        step = self._backend.compile_aten(self._graph, args, name=f"graph_{len(self._backend.explanation().graphs)}")

        def run(*inputs: Any) -> Any:
            with torch.no_grad():  # what AOTAutograd's inference wrapper does
                return step(*inputs)

        return run

    @classmethod
    def serialize_compile_artifacts(cls, fn: "FrameGraph") -> bytes:
        return f"{FRAME_FORMAT} {fn.level}".encode() + b"\n" + fn._data

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> "FrameGraph":
        head, _, graph_data = data.partition(b"\n")
        tag, _, level = head.decode("utf-8", "replace").partition(" ")
        if tag != FRAME_FORMAT or level not in ("dynamo", "aten"):
            raise FrameUnsupported(f"frame format {head[:40]!r} (this superkernel reads {FRAME_FORMAT!r})")
        return cls(level, graph_data, None, None, _LOADING_BACKEND.get())


def _dump_graph(gm: fx.GraphModule, kept_meta: tuple[str, ...]) -> bytes:
    """A graph as bytes (torch's GraphPickler), with the node metadata named in ``kept_meta``.

    Graphs that read tensors as attributes are refused: those would be weights (or other
    live state) copied into the package, and stale when the process changes them.
    """
    from torch.fx._graph_pickler import GraphPickler, Options

    if any(n.op == "get_attr" for n in gm.graph.nodes):
        raise FrameUnsupported("the graph reads tensors as module attributes")
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
        env[node].meta = {k: v for k, v in node.meta.items() if k in kept_meta}
    return GraphPickler.dumps(fx.GraphModule(torch.nn.Module(), graph), Options(ops_filter=None))


# scope annotations (custom) and source lines survive a frame; ATen graphs keep their fake values too
DYNAMO_META = ("custom", "stack_trace", "seq_nr")
ATEN_META = DYNAMO_META + ("val",)  # fake values: partition inputs, shape records


def _load_graph(data: bytes) -> fx.GraphModule:
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    gm = GraphPickler.loads(data, FakeTensorMode(shape_env=ShapeEnv()))
    gm.recompile()
    return gm


class FrameBackend:
    """The backend given to ``aot_compile``: superkernel compiles, the result is a :class:`FrameGraph`.

    ``aot_compile`` patches AOTAutograd's cache settings for its own (Inductor) path; the
    superkernel backend runs under the settings of the caller instead.
    """

    compiler_name = "superkernel"

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._functorch = {k: getattr(torch._functorch.config, k) for k in _FUNCTORCH_KEYS
                           if hasattr(torch._functorch.config, k)}

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> FrameGraph:
        capture = AtenCapture(len(example_inputs))
        data = _dump_graph(gm, DYNAMO_META)  # before AOTAutograd touches the graph
        token = _CAPTURE.set(capture)
        try:
            with torch._functorch.config.patch(self._functorch):
                compiled = self.backend(gm, example_inputs)
        finally:
            _CAPTURE.reset(token)
        if capture.data is not None:
            return FrameGraph("aten", capture.data, None, compiled, self.backend)
        log.info("superkernel frame keeps Dynamo's graph (AOTAutograd runs at load): %s", capture.reason)
        return FrameGraph("dynamo", data, gm, compiled, self.backend)


class AtenCapture:
    """What the backend reports from inside AOTAutograd while a frame is built."""

    def __init__(self, num_dynamo_inputs: int) -> None:
        self.num_dynamo_inputs = num_dynamo_inputs
        self.data: bytes | None = None
        self.reason: str | None = None
        self.graphs = 0

    def record(self, gm: fx.GraphModule) -> None:
        """Called by the backend with the ATen graph, before any pass changes it."""
        self.graphs += 1
        self.data = None
        if self.graphs > 1:
            self.reason = "AOTAutograd produced more than one graph"
            return
        self.reason = direct_call_blocker(gm, self.num_dynamo_inputs)
        if self.reason is None:
            try:
                self.data = _dump_graph(gm, ATEN_META)
            except Exception as exc:  # noqa: BLE001 - keep Dynamo's graph instead
                from superkernel.util import exception_summary

                self.reason = f"cannot serialize the ATen graph: {exception_summary(exc)}"


def _autocast_on() -> bool:
    try:
        return any(torch.is_autocast_enabled(kind) for kind in ("cpu", "cuda"))
    except TypeError:  # pragma: no cover - older signature without a device argument
        return bool(torch.is_autocast_enabled())


_CAPTURE: contextvars.ContextVar[AtenCapture | None] = contextvars.ContextVar("superkernel_aten_capture", default=None)


def current_capture() -> AtenCapture | None:
    """The frame being built in this context, if any (the backend reports its ATen graph to it)."""
    return _CAPTURE.get()


def direct_call_blocker(gm: fx.GraphModule, num_dynamo_inputs: int) -> str | None:
    """Why AOTAutograd's runtime wrapper would do more than call the ATen graph (None: it would not).

    Runs inside AOTAutograd (its metadata is in the tracing context). Calling the graph
    directly is equivalent when it is an inference graph of the very inputs Dynamo passes
    (no deduplicated, synthetic-base or lifted inputs, no effect tokens, no tensor
    subclasses, no functionalized RNG), every input mutation is kept inside the graph and
    no output aliases an input or an intermediate. Anything else, or metadata this torch
    does not have, keeps the Dynamo-level frame.
    """
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None:
        return "no AOTAutograd metadata"
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != num_dynamo_inputs:
        return f"AOTAutograd changed the inputs ({num_dynamo_inputs} -> {len(placeholders)})"
    checks = [
        (len(getattr(meta, "traced_tangents", [None])) > 0, "training graph"),
        (getattr(meta, "num_mutated_inp_runtime_indices", 1), "input mutations applied outside the graph"),
        (getattr(meta, "num_intermediate_bases", 1), "outputs alias intermediates"),
        (getattr(meta, "tokens", {"?": None}), "effect tokens"),
        (getattr(meta, "is_rng_op_functionalized", True), "functionalized RNG"),
        (getattr(meta, "grad_enabled_mutation", None) is not None, "the graph changes grad mode"),
        (any(getattr(getattr(o, "output_type", None), "name", "?") != "non_alias"
             for o in getattr(meta, "output_info", [None])), "outputs alias inputs"),
        (any(type(m).__name__ == "SubclassCreationMeta"
             for m in [*getattr(meta, "subclass_inp_meta", []), *getattr(meta, "subclass_fw_graph_out_meta", [])]),
         "tensor subclasses"),
        (_autocast_on(), "autocast"),
    ]
    for failed, why in checks:
        if failed:
            return why
    return None


_FUNCTORCH_KEYS = ("strict_autograd_cache", "bypass_autograd_cache_key", "bundled_autograd_cache",
                   "force_non_lazy_backward_lowering", "force_autograd_cache")


# --- what a frame depends on -------------------------------------------------------------

def _inner(fn: Any) -> Any:
    return fn.__func__ if inspect.ismethod(fn) else fn


def external_objects(fn: Any) -> dict[str, Any]:
    """Objects the frame uses but must not serialize: ``self`` of a method, and the non-plain
    values of its closure and of the module globals its code names (a model, a cache)."""
    out: dict[str, Any] = {}
    if inspect.ismethod(fn):
        out["self"] = fn.__self__
    inner = _inner(fn)
    code = getattr(inner, "__code__", None)
    for name, cell in zip(getattr(code, "co_freevars", ()), getattr(inner, "__closure__", None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # empty cell
            continue
        if not isinstance(value, _PLAIN):
            out[f"closure:{name}"] = value
    f_globals = getattr(inner, "__globals__", None) or {}
    for name in sorted(_global_names(code)) if code is not None else ():
        value = f_globals.get(name)
        if value is not None and not isinstance(value, _PLAIN) and not _is_code_or_type(value):
            out[f"global:{name}"] = value
    return out


def _global_names(code: Any) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _global_names(const)
    return names


def _is_code_or_type(value: Any) -> bool:
    """Modules, classes and plain functions: torch pickles these by reference, which is right for them."""
    return inspect.ismodule(value) or inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value)


def _type_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _structure(obj: Any) -> Any:
    if isinstance(obj, torch.nn.Module):
        from superkernel.scope_apply import applied_scope

        return {
            "modules": [(n, _type_name(m), applied_scope(m)) for n, m in obj.named_modules()],
            "tensors": [(n, list(t.shape), str(t.dtype), t.device.type)
                        for n, t in [*obj.named_parameters(), *obj.named_buffers()]],
        }
    if isinstance(obj, torch.Tensor):
        return {"tensor": [list(obj.shape), str(obj.dtype), obj.device.type]}
    return {"type": _type_name(obj)}


def call_signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A call's arguments (shapes, strides, dtypes, devices, which tensors require grad; plain
    values), grad mode and torch thread count (torch's frame guards check both) as JSON;
    cheap: no structure walk."""
    values = [*args, *kwargs.values()]
    requires_grad = [bool(v.requires_grad) for v in values if isinstance(v, torch.Tensor)]
    return json.dumps([value_signature(list(args)), value_signature(kwargs), torch.is_grad_enabled(),
                       torch.get_num_threads(), requires_grad])


def signature_difference(built: str, here: str) -> str:
    """What differs between two call signatures, in a few words."""
    try:
        a, b = json.loads(built), json.loads(here)
    except ValueError:
        return "another call signature"
    parts = []
    if a[:2] != b[:2] or a[4:] != b[4:]:
        parts.append("argument shapes, dtypes or values")
    if len(a) > 2 and a[2] != b[2]:
        parts.append(f"grad mode ({'on' if a[2] else 'off'} in the package, {'on' if b[2] else 'off'} here)")
    if len(a) > 3 and a[3] != b[3]:
        parts.append(f"torch threads ({a[3]} in the package, {b[3]} here)")
    return ", ".join(parts) or "the closed-over objects' structure or the code"


def function_name(fn: Any) -> str:
    inner = _inner(fn)
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', type(inner).__name__)}"


def frame_key(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], fingerprint: str) -> str:
    """Content key of a frame: code, compiler config, call signature and closed-over structure."""
    inner = _inner(fn)
    h = hashlib.sha256()
    h.update(FRAME_FORMAT.encode())
    h.update(function_name(fn).encode())
    code = getattr(inner, "__code__", None)
    if code is not None:
        _hash_code(h, code)
    h.update(fingerprint.encode())
    h.update(call_signature(args, kwargs).encode())
    ext = external_objects(fn)
    h.update(json.dumps({k: _structure(v) for k, v in sorted(ext.items())}, sort_keys=True).encode())
    return h.hexdigest()[:32]


def _hash_code(h: Any, code: Any) -> None:
    """What a code object does, not where it lives: no file name or line numbers (moving a
    script keeps its frames; edits elsewhere in a traced module are caught by its source hash)."""
    h.update(code.co_code)
    for name in ("co_names", "co_varnames", "co_freevars", "co_cellvars"):
        h.update(repr(getattr(code, name)).encode())
    for const in code.co_consts:
        if inspect.iscode(const):
            _hash_code(h, const)
        elif isinstance(const, frozenset):  # its repr order follows string hashing, which varies per process
            h.update(repr(sorted(repr(c) for c in const)).encode())
        else:
            h.update(repr(const).encode())


def _module_source_hash(module_name: str) -> str | None:
    try:
        source = inspect.getsource(importlib.import_module(module_name))
    except (ImportError, OSError, TypeError):
        return None
    return hashlib.sha256(source.encode()).hexdigest()


def sources_of(aot_fn: Any) -> dict[str, str]:
    """Module name -> sha256 of its source, for every module Dynamo inlined while tracing."""
    info = aot_fn.source_info()
    out: dict[str, str] = {}
    for src in getattr(info, "inlined_sources", ()):
        out[src.module] = hashlib.sha256(src.content.encode()).hexdigest()
    return dict(sorted(out.items()))


def stale_sources(recorded: dict[str, str]) -> list[str]:
    """Modules whose source changed (or cannot be read) since the frame was built."""
    return [m for m, digest in recorded.items() if _module_source_hash(m) != digest]


# --- build and load --------------------------------------------------------------------------

def serializable_guard_filter() -> Callable[[Any], list[bool]]:
    """Keep the guards torch can serialize (tensor, shape, constant and grad-mode guards)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)

    def keep(entries: Any) -> list[bool]:
        # Guards reaching into a function's closure (a decorator's or apply_scopes' wrapper)
        # need that function object at load, which torch cannot carry: the frame key (scope
        # labels and options) and the source checks stand in for them.
        return [not (e.is_global or e.guard_type in unsupported or "__closure__" in str(e.name)
                     or any(t in unsupported for t in (e.derived_guard_types or ())))
                for e in entries]

    return keep


def precompile(fn: Any, backend: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Trace ``fn`` once with Dynamo (fullgraph) and compile it with ``backend``; an ``AOTCompiledFunction``.

    Raises :class:`FrameUnsupported` when this torch lacks AOT precompile or the function
    cannot be one frame (a graph break, an unserializable guard, ...).
    """
    try:
        compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=FrameBackend(backend),
                                 options={"guard_filter_fn": serializable_guard_filter()})
        if not hasattr(compiled, "aot_compile"):
            raise FrameUnsupported(f"torch {torch.__version__} has no AOT precompile (torch.compile(...).aot_compile)")
        return compiled.aot_compile((tuple(args), dict(kwargs)))
    except FrameUnsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - any reason: the normal path traces it
        from superkernel.util import exception_summary

        raise FrameUnsupported(exception_summary(exc)) from exc


def frame_level(aot_fn: Any) -> str:
    """``"aten"`` or ``"dynamo"``: which graph a precompiled frame keeps (see :class:`FrameGraph`)."""
    artifacts = getattr(aot_fn, "_artifacts", None)
    return getattr(getattr(artifacts, "compiled_fn", None), "level", "unknown")


def serialize(aot_fn: Any, fn: Any) -> bytes:
    try:
        return type(aot_fn).serialize(aot_fn, external_objects(fn)).serialized_data
    except Exception as exc:  # noqa: BLE001
        from superkernel.util import exception_summary

        raise FrameUnsupported(f"cannot serialize the frame: {exception_summary(exc)}") from exc


def check_loads(data: bytes, fn: Any) -> None:
    """Deserialize a frame once (guards rebuilt, nothing run); FrameUnsupported if that fails."""
    try:
        load(data, fn, None)
    except Exception as exc:  # noqa: BLE001
        from superkernel.util import exception_summary

        raise FrameUnsupported(f"the frame does not load back: {exception_summary(exc)}") from exc


def load(data: bytes, fn: Any, backend: Any) -> Any:
    """Deserialize a frame for ``fn`` (its closed-over objects are this process's); ``backend`` compiles it."""
    from torch._dynamo.aot_compile import AOTCompiledFunction

    inner = _inner(fn)
    token = _LOADING_BACKEND.set(backend)
    try:
        return AOTCompiledFunction.deserialize(data, f_globals=getattr(inner, "__globals__", None),
                                               external_closure_data=external_objects(fn))
    finally:
        _LOADING_BACKEND.reset(token)


def frame_args(fn: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments a frame of ``fn`` takes: a method's frame takes its ``self`` first."""
    return (fn.__self__, *args) if inspect.ismethod(fn) else tuple(args)


def rejection(aot_fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Which guard of a frame rejects this call, as torch words it."""
    try:
        manager = aot_fn._artifacts.guard_manager
        parts = manager.check_verbose(aot_fn.prepare_f_locals(*args, **kwargs)).verbose_code_parts
        return "; ".join(str(p).strip() for p in parts[:2]) or "a guard failed"
    except Exception:  # noqa: BLE001 - private torch structure: the reason is a courtesy
        return "a guard failed"


def call(aot_fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """Run a frame if its guards accept the call: ``(True, result)``, else ``(False, None)``."""
    if not aot_fn.guard_check(*args, **kwargs):
        return False, None
    return True, aot_fn.fn(*args, **kwargs)


__all__ = ["FrameBackend", "FrameGraph", "FrameUnsupported", "call", "check_loads", "call_signature", "external_objects", "signature_difference",
           "frame_args", "frame_key", "frame_level", "rejection", "function_name", "load", "precompile", "serializable_guard_filter", "serialize",
           "sources_of", "stale_sources"]
