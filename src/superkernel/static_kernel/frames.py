"""Serializing a precompiled frame: Dynamo's capture of a compiled function, kept in the package.

Loading a package's partitions removes TorchInductor's compile time, but the first call
still pays Dynamo tracing the model's Python. A *frame* removes that too. It is torch's
own AOT precompile (``torch.compile(fn, fullgraph=True).aot_compile``): the transformed
bytecode, the guards and a graph, saved with ``AOTCompiledFunction.serialize``. The
backend part of a frame (:class:`FrameGraph`) stores only a graph; when a loaded frame is
first called, the superkernel backend segments that graph again and its partitions load
from the package as usual, so a frame holds no compiled code of its own.

What a frame is keyed by and when a stored one is stale: :mod:`.frame_keys`. Torch drops
the guards it cannot serialize (object identities, classes, closures); the key and the
source check stand in for them, and the guards torch keeps run on every call.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel import eager_branch
from superkernel.static_kernel.frame_keys import FRAME_FORMAT, _inner, external_objects
from superkernel.util import exception_summary

log = logging.getLogger("superkernel.static_kernel")

# The backend that compiles frames being loaded (deserialization gets bytes only).
_LOADING_BACKEND: contextvars.ContextVar[Any] = contextvars.ContextVar("superkernel_frame_backend", default=None)


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
                 backend: Any, inference: bool = False) -> None:
        self.level = level
        self.inference = inference  # an ATen inference graph (no output requires grad): compiled as such at load
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
        # (reduce-overhead: its CPU native modules depend on it; Inductor's compile reads AOTAutograd's real metadata)
        from superkernel.config import REDUCE_OVERHEAD

        with _inference_context(self.inference and getattr(self._backend.config, "mode", None) == REDUCE_OVERHEAD):
            step = self._backend.compile_aten(self._graph, args,
                                              name=f"graph_{len(self._backend.explanation().graphs)}")

        def run(*inputs: Any) -> Any:
            with torch.no_grad():  # what AOTAutograd's inference wrapper does
                return step(*inputs)

        return run

    @classmethod
    def serialize_compile_artifacts(cls, fn: "FrameGraph") -> bytes:
        flags = " inference" if fn.level == "aten" and fn.inference else ""
        return f"{FRAME_FORMAT} {fn.level}{flags}".encode() + b"\n" + fn._data

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> "FrameGraph":
        head, _, graph_data = data.partition(b"\n")
        tag, level, *flags = head.decode("utf-8", "replace").split(" ") + [""]
        flags = [f for f in flags if f]
        if tag != FRAME_FORMAT or level not in ("dynamo", "aten") or not set(flags) <= {"inference"}:
            raise FrameUnsupported(f"frame format {head[:40]!r} (this superkernel reads {FRAME_FORMAT!r})")
        return cls(level, graph_data, None, None, _LOADING_BACKEND.get(), inference="inference" in flags)


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

    return GraphPickler.loads(data, FakeTensorMode(shape_env=ShapeEnv()))  # (its graph setter generated the code)


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
            return FrameGraph("aten", capture.data, None, compiled, self.backend, inference=capture.inference)
        log.info("superkernel frame keeps Dynamo's graph (AOTAutograd runs at load): %s", capture.reason)
        return FrameGraph("dynamo", data, gm, compiled, self.backend)


class AtenCapture:
    """What the backend reports from inside AOTAutograd while a frame is built."""

    def __init__(self, num_dynamo_inputs: int) -> None:
        self.num_dynamo_inputs = num_dynamo_inputs
        self.data: bytes | None = None
        self.reason: str | None = None
        self.graphs = 0
        self.inference = False

    def record(self, gm: fx.GraphModule) -> None:
        """Called by the backend with the ATen graph, before any pass changes it."""
        self.graphs += 1
        self.data = None
        if self.graphs > 1:
            self.reason = "AOTAutograd produced more than one graph"
            return
        self.reason = direct_call_blocker(gm, self.num_dynamo_inputs)
        infos = getattr(getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None), "output_info", None)
        self.inference = infos is not None and not any(getattr(o, "requires_grad", False) for o in infos)
        if self.reason is None:
            try:
                self.data = _dump_graph(gm, ATEN_META)
            except Exception as exc:  # noqa: BLE001 - keep Dynamo's graph instead
                self.reason = f"cannot serialize the ATen graph: {exception_summary(exc)}"


class _InferenceOutputs:
    """What the realizer reads of AOTAutograd's metadata to know an inference graph (no output requires grad)."""

    output_info: tuple[Any, ...] = ()


def _inference_context(inference: bool) -> Any:
    """Compiling a loaded ATen inference frame outside AOTAutograd: tell the realizer what AOTAutograd told it at
    build (native CPU modules of inference graphs are generated differently), so the same module is used."""
    import contextlib

    if not inference or torch._guards.TracingContext.try_get() is not None:
        return contextlib.nullcontext()
    ctx = torch._guards.TracingContext(None)
    ctx.fw_metadata = _InferenceOutputs()  # type: ignore[assignment]
    return torch._guards.tracing(ctx)


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


# --- build and load --------------------------------------------------------------------------

class GuardFilter:
    """Keep the guards torch can serialize (tensor, shape, constant and grad-mode guards).

    ``skip_subclass_weights``: also leave out every guard on a tensor-subclass value and on what is reached
    through it (a torchao quantized weight and its inner tensors). Torch serializes a guarded subclass through
    ``torch.empty_like(t, device="meta")``, which torchao's ``Int8Tensor`` does not implement, so such a
    frame cannot be built otherwise. Only for in-process frames (:func:`superkernel.precompile_step`, whose
    watch stands in for those guards); a package's frame, loaded elsewhere, keeps them all (and is refused).
    ``skipped`` counts the guards left out that way.
    """

    def __init__(self, *, skip_subclass_weights: bool = False) -> None:
        from torch._dynamo.guards import CheckFunctionManager

        self.unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
        self.skip_subclass_weights = skip_subclass_weights
        self.skipped = 0

    def __call__(self, entries: Any) -> list[bool]:
        # Guards reaching into a function's closure (a decorator's or apply_scopes' wrapper)
        # need that function object at load, which torch cannot carry: the frame key (scope
        # labels and options) and the source checks stand in for them.
        keep = [not (e.is_global or e.guard_type in self.unsupported or "__closure__" in str(e.name)
                     or any(t in self.unsupported for t in (e.derived_guard_types or ())))
                for e in entries]
        if self.skip_subclass_weights:
            from torch.utils._python_dispatch import is_traceable_wrapper_subclass

            roots = {str(e.name) for e in entries
                     if isinstance(getattr(e, "value", None), torch.Tensor) and is_traceable_wrapper_subclass(e.value)}
            for i, e in enumerate(entries):
                if keep[i] and any(prefix in roots for prefix in _name_prefixes(str(e.name))):
                    keep[i] = False
                    self.skipped += 1
        return keep


def _name_prefixes(name: str) -> list[str]:
    """``name`` and its prefixes ending before a ``.`` or ``[``: ``L['m'].w`` -> ``L``, ``L['m']``, ``L['m'].w``."""
    return [name[:i] for i, c in enumerate(name) if c in ".["] + [name]


def serializable_guard_filter() -> GuardFilter:
    """Keep the guards torch can serialize (:class:`GuardFilter` without options)."""
    return GuardFilter()


def _aot_compile_enabled() -> Any:
    """``torch._dynamo.config.enable_aot_compile`` on where this torch has the switch."""
    import contextlib

    if hasattr(torch._dynamo.config, "enable_aot_compile"):
        return torch._dynamo.config.patch(enable_aot_compile=True)
    return contextlib.nullcontext()


def precompile(fn: Any, backend: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               guard_filter: GuardFilter | None = None) -> Any:
    """Trace ``fn`` once with Dynamo (fullgraph) and compile it with ``backend``; an ``AOTCompiledFunction``.

    ``guard_filter``: which guards the frame keeps (default: those torch can serialize). Raises
    :class:`FrameUnsupported` when this torch lacks AOT precompile or the function cannot be one frame (a
    graph break, an unserializable guard, ...).
    """
    try:
        # torch 2.11 attaches ``aot_compile`` only with this switch on (2.13 always does)
        with _aot_compile_enabled():
            compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=FrameBackend(backend),
                                     options={"guard_filter_fn": guard_filter or serializable_guard_filter()})
        if not hasattr(compiled, "aot_compile"):
            raise FrameUnsupported(f"torch {torch.__version__} has no AOT precompile (torch.compile(...).aot_compile)")
        with _aot_compile_enabled(), eager_branch.traced_for(getattr(backend, "config", None)):
            return compiled.aot_compile((tuple(args), dict(kwargs)))
    except FrameUnsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - any reason: the normal path traces it
        raise FrameUnsupported(exception_summary(exc)) from exc


def frame_level(aot_fn: Any) -> str:
    """``"aten"`` or ``"dynamo"``: which graph a precompiled frame keeps (see :class:`FrameGraph`)."""
    artifacts = getattr(aot_fn, "_artifacts", None)
    return getattr(getattr(artifacts, "compiled_fn", None), "level", "unknown")


def serialize(aot_fn: Any, fn: Any) -> bytes:
    try:
        return type(aot_fn).serialize(aot_fn, external_objects(fn)).serialized_data
    except Exception as exc:  # noqa: BLE001
        raise FrameUnsupported(f"cannot serialize the frame: {exception_summary(exc)}") from exc


def check_loads(data: bytes, fn: Any) -> None:
    """Deserialize a frame once (guards rebuilt, nothing run); FrameUnsupported if that fails."""
    try:
        load(data, fn, None)
    except Exception as exc:  # noqa: BLE001
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


__all__ = ["AtenCapture", "FrameBackend", "FrameGraph", "FrameUnsupported", "call", "check_loads", "current_capture",
           "GuardFilter", "direct_call_blocker", "frame_level", "load", "precompile", "rejection", "serializable_guard_filter",
           "serialize"]
