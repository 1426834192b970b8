"""The torch.compile backend: capture -> passes -> segments -> partition -> realize -> assemble.

Each stage is a separate module so it can be tested alone:

* :func:`superkernel.pipeline.capture.capture` (AOTAutograd) turns Dynamo's graph into an
  inference ATen graph and hands it to :meth:`SuperKernelBackend.compile_aten`;
* :func:`superkernel.pipeline.segments.build_segments` cuts scopes into segments;
* :mod:`superkernel.pipeline.realize` turns every partition into one callable;
* :func:`superkernel.pipeline.partition.assemble` stitches them into one step.

Also here: the backend registry (``backend="superkernel"``), :func:`compile` and
:func:`explain`, which finds the backend behind a compiled object.
"""

from __future__ import annotations

import copy
import functools
import logging
import re
import time
import warnings
import weakref
from collections import Counter
from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel.config import MAX_AUTOTUNE, CompilerConfig
from superkernel.pipeline.capture import break_text, capture, dynamo_graph_breaks
from superkernel.pipeline.graph_dump import dump_graph
from superkernel.pipeline.ir import Cut, Explanation, GraphInfo, SegmentInfo, SuperKernelScopeError, graph_device
from superkernel.pipeline.partition import assemble, named_callable, split_partitions
from superkernel.pipeline.passes import reinplace_input_updates
from superkernel.pipeline.realize import Realizer
from superkernel.pipeline.segments import build_segments, last_scope


# --- Dynamo settings under which a superkernel compile traces ----------------------------
#
# A data-dependent op (nonzero, boolean masking) or a host sync (.item()) inside a scope
# makes Dynamo graph-break inside ``torch.fx.traceback.annotate``, which it cannot resume:
# the whole frame would run eagerly and the scope vanish. With these two settings Dynamo
# captures those ops instead, and the segmentation cuts the scope around them.
# Dynamo enters ``backend_ctx_ctor`` around every call of an object compiled with the
# backend (torch.compile(backend=get_backend(cfg)), superkernel.compile and
# backend="superkernel"), so tracing and recompiles see the settings; already-set flags
# (the decode harness, a user's global setting) cost two attribute reads per call.
CAPTURE_SETTINGS = {"capture_scalar_outputs": True, "capture_dynamic_output_shape_ops": True}
#: Python ints of transformers' caches that grow with every decode step (a sliding window's
#: ``cumulative_length_int``): Dynamo would specialize on them and recompile at every
#: position until its recompile limit; as dynamic sources, decode compiles once.
GROWING_CACHE_INTS = r".*\.cumulative_length_int$"


class SuperKernelScopeBreakWarning(UserWarning):
    """Dynamo graph-broke inside a superkernel scope: the scope's operators run uncompiled."""


class _BreakLog(logging.Handler):
    """Keeps Dynamo's graph-break log records (file:line, reason, the ``with`` line of the scope)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append(record.getMessage())
            del self.records[:-64]
        except Exception:  # pragma: no cover - logging must never break compilation
            pass


_break_log: _BreakLog | None = None


def _install_break_log() -> _BreakLog | None:
    """Listen to Dynamo's graph-break artifact log (without printing it unless the user asked)."""
    global _break_log
    try:
        from torch._dynamo.symbolic_convert import graph_break_log
    except ImportError:  # pragma: no cover - other torch versions
        return None
    if _break_log is None:
        _break_log = _BreakLog()
    try:  # Dynamo logs each (kind, place) of graph break once per process; this backend needs its own
        from torch._dynamo.utils import graph_break_dup_warning_checker

        graph_break_dup_warning_checker.reset()
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    if _break_log not in graph_break_log.handlers:
        graph_break_log.addHandler(_break_log)
    if not graph_break_log.isEnabledFor(logging.DEBUG):  # the user did not ask for graph-break logs
        graph_break_log.setLevel(logging.DEBUG)
        graph_break_log.propagate = False
    return _break_log


_SCOPE_CALL = re.compile(r"super(?:kernel_scope|_kernel)\(([^)]*)")
_LITERAL = re.compile(r"[\"']([^\"']*)[\"']")
_BREAK_AT = re.compile(r"Graph break in user code at (\S+:\d+)")


def _scope_of_break(message: str) -> tuple[str, str] | None:
    """(scope label, options) a graph-break record happened in, or None when outside every scope."""
    from superkernel.scope_apply import applied_scopes_in

    inside = any(mark in message for mark in ("annotate", "super_kernel(", "superkernel_scope(", "scoped_forward"))
    if not inside:
        return None
    for line in message.splitlines():
        if "with " in line and ("super_kernel(" in line or "superkernel_scope(" in line):
            found = _SCOPE_CALL.search(line)
            literals = _LITERAL.findall(found.group(1)) if found else []
            if literals:
                return literals[0], literals[1] if len(literals) > 1 else ""
    applied = applied_scopes_in(message)  # scopes put on modules with apply_scopes
    if applied:
        return applied[0]
    return ("?", "")


_configs: tuple[Any, Any, Any] | None = None  # (dynamo config, compiler config, dynamo counters), looked up once


def _modules() -> tuple[Any, Any, Any]:
    global _configs
    if _configs is None:
        import torch._dynamo.config
        import torch.compiler.config
        from torch._dynamo.utils import counters

        _configs = (torch._dynamo.config, torch.compiler.config, counters)
    return _configs


def _break_count() -> int:
    breaks = _modules()[2].get("graph_break")
    return sum(breaks.values()) if breaks else 0


def _override(module: Any, key: str) -> Any:
    """A config value as explicitly set (patch / assignment); cheap, for the per-call fast path."""
    try:
        return module._config[key].user_override.get()
    except Exception:  # other torch versions: the public (slower) read
        return getattr(module, key)


class _CaptureContext:
    """What Dynamo enters around each call of a compiled object (see CAPTURE_SETTINGS)."""

    __slots__ = ("backend", "saved", "saved_sources", "breaks", "log_mark")

    def __init__(self, backend: "SuperKernelBackend") -> None:
        self.backend = backend
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> None:
        cfg, compiler_cfg, _ = _modules()
        self.saved_sources = None
        self.breaks = _break_count()
        self.log_mark = len(_break_log.records) if _break_log is not None else 0
        if _override(cfg, "capture_scalar_outputs") is True and \
                _override(cfg, "capture_dynamic_output_shape_ops") is True and \
                GROWING_CACHE_INTS in str(_override(compiler_cfg, "dynamic_sources")):
            return  # already in place (the decode harness, an outer call): nothing to set or restore
        for key, value in CAPTURE_SETTINGS.items():
            if getattr(cfg, key) != value:
                self.saved[key] = getattr(cfg, key)
                setattr(cfg, key, value)
        sources = torch.compiler.config.dynamic_sources
        if GROWING_CACHE_INTS not in sources:
            self.saved_sources = sources
            torch.compiler.config.dynamic_sources = f"{sources},{GROWING_CACHE_INTS}" if sources else GROWING_CACHE_INTS

    def __exit__(self, *exc: Any) -> None:
        cfg = torch._dynamo.config
        for key, value in self.saved.items():
            setattr(cfg, key, value)
        self.saved = {}
        if self.saved_sources is not None:
            torch.compiler.config.dynamic_sources = self.saved_sources
        if _break_count() != self.breaks and _break_log is not None:
            records = _break_log.records[self.log_mark:] if self.log_mark <= len(_break_log.records) else []
            self.backend._scope_breaks(records)


class SuperKernelBackend:
    """A torch.compile backend. One instance keeps the explanation of what it compiled."""

    __name__ = "superkernel"

    def __init__(self, compiler_config: CompilerConfig | None = None) -> None:
        if compiler_config is None:
            compiler_config = CompilerConfig()
        if not isinstance(compiler_config, CompilerConfig):
            raise TypeError(f"compiler_config must be a superkernel.CompilerConfig, got {type(compiler_config).__name__}")
        self.config = copy.deepcopy(compiler_config)
        self.counters: Counter[str] = Counter()
        self._graphs: list[GraphInfo] = []
        # (scope the previous graph ended in, Dynamo's graph-break reason if it ended in one)
        self._previous: tuple[str, str | None] = ("", None)
        self._pending_break: str | None = None
        self._graph_breaks_at_start = dynamo_graph_breaks()
        #: graph breaks Dynamo took inside a scope (their operators run uncompiled), as cuts
        self.scope_breaks: list[Cut] = []
        _install_break_log()
        self.backend_ctx_ctor = functools.partial(_CaptureContext, self)  # read by Dynamo (see CAPTURE_SETTINGS)
        self.static_kernels = None
        if self.config.experimental_config.static_kernel.enable:
            from superkernel.static_kernel.compiler import open_compiler

            self.static_kernels = open_compiler(self.config)

    # -- torch.compile entry -------------------------------------------------------
    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        name = f"graph_{len(self._graphs)}"
        reason = getattr(gm, "compile_subgraph_reason", None)  # why Dynamo ended this graph
        self._pending_break = break_text(reason) if getattr(reason, "graph_break", False) else None
        return capture(gm, example_inputs, functools.partial(self.compile_aten, name=name),
                       decompositions=self._decompositions())

    def _decompositions(self) -> dict[Any, Any] | None:
        if self.config.mode == MAX_AUTOTUNE and not self.config.debug.run_eagerly:
            from torch._inductor.decomposition import select_decomp_table

            return select_decomp_table()
        return None

    # -- ATen graph -> one step ----------------------------------------------------
    def compile_aten(self, gm: fx.GraphModule, example_inputs: list[Any], *, name: str) -> Callable[..., Any]:
        start = time.perf_counter()
        cfg = self.config
        if self.static_kernels is not None:  # a precompiled frame being built keeps this graph
            self.static_kernels.observe_aten_graph(gm)
        device = graph_device(gm)
        # A graph that starts in the scope the previous graph ended in, right after Dynamo
        # broke the previous graph, continues that scope: the break is a cut.
        prev_scope, prev_break = self._previous
        self._previous = (last_scope(gm), self._pending_break)
        if cfg.debug.graph_dump.type:
            dump_graph(gm, cfg.debug.graph_dump, f"{name}_captured")
        if not cfg.debug.run_eagerly:  # the exactness reference keeps the graph as captured
            self.counters["inputs_updated_in_place"] += reinplace_input_updates(gm)
        segmentation = build_segments(gm, device, continues_scope=prev_scope if prev_break else None,
                                      break_reason=prev_break)
        num_ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        info = GraphInfo(name=name, num_ops=num_ops, mode=cfg.mode, device=device, cuts=segmentation.cuts,
                         unscoped_ops=sum(p.num_ops for p in segmentation.partitions if p.kind == "unscoped"))
        self._graphs.append(info)
        self.counters["graphs"] += 1
        self.counters["cuts"] += len(segmentation.cuts)
        if cfg.debug.graph_dump.type:
            dump_graph(gm, cfg.debug.graph_dump, f"{name}_segments", segmentation)
        if self.static_kernels is not None:
            self.static_kernels.record_graph(gm, name, device)

        if cfg.debug.run_eagerly:  # the exactness reference: the captured graph as it is
            for p in segmentation.segments:
                info.segments.append(SegmentInfo.of(p, "reference"))
            info.compile_seconds = time.perf_counter() - start
            return gm

        modules = split_partitions(gm, segmentation.partitions)
        realizer = Realizer(cfg, device, self.counters, static_kernels=self.static_kernels)
        callables = []
        for module in modules:
            part = module.partition
            seg_info = None
            if part.kind == "segment":
                seg_info = SegmentInfo.of(part)
                info.segments.append(seg_info)
                self.counters["segments"] += 1
            callables.append(named_callable(realizer.realize(module, seg_info), part.name))
        step = assemble(gm, modules, callables)
        if self.static_kernels is not None:
            self.static_kernels.finalize()  # end of this graph's build: write the package, release the lock
        if cfg.debug.graph_dump.type:
            dump_graph(step, cfg.debug.graph_dump, f"{name}_segmented", segmentation, modules)
        info.compile_seconds = time.perf_counter() - start
        return step

    def _scope_breaks(self, records: list[str]) -> None:
        """Report graph breaks inside scopes at compile time; strict-scope-check=abort raises."""
        from superkernel.pipeline.ir import parse_options

        found_here = 0
        for message in records:
            scope = _scope_of_break(message)
            # Dynamo's follow-up record ("annotate escaped from compiled region") only matters
            # when the record of the break itself was not logged (Dynamo logs each place once)
            if scope is None or ("escaped from compiled region" in message and found_here):
                continue
            found_here += 1
            label, options = scope
            where = _BREAK_AT.search(message)
            reason_lines = [line.strip() for line in message.splitlines() if line.strip()]
            reason = next((line.split(":", 1)[1].strip() for line in reason_lines
                           if line.startswith("Graph Break Reason:")), "graph break")
            detail = next((line for line in reason_lines if line.startswith("Explanation:")), "")
            text = f"{GRAPH_BREAK_IN_SCOPE}: {reason}" + (f" ({detail})" if detail else "")
            cut = Cut(scope=label, node_index=-1, op="graph break", reason=text[:400],
                      source=where.group(1) if where else None)
            if any(c.source == cut.source and c.scope == cut.scope for c in self.scope_breaks):
                continue
            self.scope_breaks.append(cut)
            try:
                strict = parse_options(options).strict_scope_check == "abort"
            except Exception:
                strict = False
            if strict:
                raise SuperKernelScopeError(f"strict-scope-check=abort: {cut.describe()}", cut)
            warnings.warn(f"superkernel: {cut.describe()}; the scope's operators run uncompiled",
                          SuperKernelScopeBreakWarning, stacklevel=2)

    # -- introspection -------------------------------------------------------------
    def explanation(self) -> Explanation:
        return Explanation(graphs=list(self._graphs),
                           graph_breaks=max(0, dynamo_graph_breaks() - self._graph_breaks_at_start))

    def reset(self) -> None:
        """Forget what was compiled (use together with ``torch._dynamo.reset()``)."""
        self._graphs.clear()
        self.counters.clear()
        self._previous, self._pending_break = ("", None), None
        self._graph_breaks_at_start = dynamo_graph_breaks()
        self.scope_breaks.clear()
        _install_break_log()


def get_backend(compiler_config: CompilerConfig | None = None) -> SuperKernelBackend:
    """Return a torch.compile backend: ``torch.compile(model, backend=get_backend(cfg))``."""
    return SuperKernelBackend(compiler_config)


_default_backend: SuperKernelBackend | None = None


def default_backend() -> SuperKernelBackend:
    """The backend behind ``torch.compile(..., backend="superkernel")`` (default config)."""
    global _default_backend
    if _default_backend is None:
        _default_backend = SuperKernelBackend()
    return _default_backend


def superkernel_backend(gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    """Entry point registered as the Dynamo backend named ``"superkernel"``."""
    if kwargs:
        raise TypeError(f"backend 'superkernel' takes no options ({', '.join(kwargs)}); "
                        "use superkernel.get_backend(CompilerConfig) to configure it")
    return default_backend()(gm, example_inputs)


# backend="superkernel": Dynamo reads the context from the registered function.
superkernel_backend.backend_ctx_ctor = lambda: _CaptureContext(default_backend())  # type: ignore[attr-defined]

GRAPH_BREAK_IN_SCOPE = "graph break inside the scope (Dynamo could not capture it; its operators run uncompiled)"


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "superkernel" not in _BACKENDS or _BACKENDS["superkernel"] is None:
        register_backend(name="superkernel")(superkernel_backend)
    _forward_backend_context()


def _forward_backend_context() -> None:
    """Make ``torch.compile(..., backend=X)`` honour ``X.backend_ctx_ctor`` like ``torch._dynamo.optimize`` does.

    torch.compile wraps a custom backend in ``torch._TorchCompileWrapper``, which drops the
    backend's ``backend_ctx_ctor``; Dynamo then never enters it. The wrapper is given the
    attribute of the backend it wraps (only backends that define one are affected), so
    ``torch.compile(model, backend="superkernel")`` traces with CAPTURE_SETTINGS as well.
    """
    wrapper = getattr(torch, "_TorchCompileWrapper", None)
    if wrapper is None or getattr(wrapper.__init__, "_superkernel_forwarding", False):
        return
    original = wrapper.__init__

    @functools.wraps(original)
    def __init__(self, backend, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, backend, *args, **kwargs)
        ctx = getattr(getattr(self, "compiler_fn", None), "backend_ctx_ctor", None)
        if ctx is not None:
            self.backend_ctx_ctor = ctx

    __init__._superkernel_forwarding = True  # type: ignore[attr-defined]
    wrapper.__init__ = __init__


_register()


def compile(model: Any, compiler_config: CompilerConfig | None = None, **torch_compile_kwargs: Any) -> Any:
    """``torch.compile(model, backend=get_backend(compiler_config), **kwargs)``.

    :func:`superkernel.pipeline.ir` accepts the result. With static kernels enabled and a
    function (not a module) to compile, the result also loads the function's precompiled
    Dynamo frame from the package (see ``superkernel.static_kernel.compiler``).
    """
    backend = get_backend(compiler_config)
    torch_compile_kwargs.setdefault("dynamic", False)
    compiled = torch.compile(model, backend=backend, **torch_compile_kwargs)
    if backend.static_kernels is not None and _frames_apply(model, torch_compile_kwargs):
        compiled = backend.static_kernels.wrap_function(model, backend, compiled)
    _COMPILED[id(compiled)] = (weakref.ref(compiled), backend)
    return compiled


def _frames_apply(model: Any, torch_compile_kwargs: dict[str, Any]) -> bool:
    """Precompiled frames (static kernels) serve plain functions and methods compiled with static shapes."""
    import inspect

    if isinstance(model, torch.nn.Module) or not (inspect.isfunction(model) or inspect.ismethod(model)):
        return False
    return torch_compile_kwargs.get("dynamic") is False and not torch_compile_kwargs.get("mode") \
        and not torch_compile_kwargs.get("options")


# id(compiled object) -> (weak reference to it, backend). Not an attribute on the result:
# torch.compile's OptimizedModule forwards attribute writes to the wrapped model, so two
# compilations of one model would overwrite each other.
_COMPILED: dict[int, tuple[Any, SuperKernelBackend]] = {}


def find_backend(obj: Any) -> SuperKernelBackend:
    """The SuperKernelBackend behind ``obj`` (a backend, or a model/function compiled with one)."""
    entry = _COMPILED.get(id(obj))
    if entry is not None and entry[0]() is obj:
        return entry[1]
    # Follow Dynamo's wrappers: OptimizedModule.dynamo_ctx / a compiled function's closure
    # -> OptimizeContext.callback -> _torchdynamo_orig_backend chain -> compiler_fn.
    todo, seen = [obj], set()
    while todo and len(seen) < 64:
        current = todo.pop(0)
        if isinstance(current, SuperKernelBackend):
            return current
        if current is superkernel_backend:  # backend="superkernel"
            return default_backend()
        if id(current) in seen or isinstance(current, (str, int, float, torch.Tensor)):
            continue
        seen.add(id(current))
        for attr in ("dynamo_ctx", "callback", "_torchdynamo_orig_backend", "compiler_fn", "__wrapped__"):
            nxt = getattr(current, attr, None)
            if nxt is not None:
                todo.append(nxt)
        for cell in getattr(current, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:
                pass
    if obj == "superkernel" or getattr(obj, "__name__", None) == "superkernel_backend":
        return default_backend()
    raise TypeError(
        f"explain() needs a superkernel backend or a model compiled with one, got {type(obj).__name__}; "
        "compile with superkernel.compile(model, cfg) or torch.compile(model, backend=superkernel.get_backend(cfg))"
    )


def explain(obj: Any) -> Explanation:
    """Return the Explanation of a superkernel backend or of a model compiled with one.

    ``str()`` of the result is a readable table of graphs, scopes, segments and cuts.
    """
    return find_backend(obj).explanation()
