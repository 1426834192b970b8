"""The torch.compile backend: capture -> passes -> segments -> partition -> realize -> assemble.

Each stage is a separate module so it can be tested alone:

* :func:`superkernel.pipeline.capture.capture` (AOTAutograd) turns Dynamo's graph into an
  inference ATen graph and hands it to :meth:`SuperKernelBackend.compile_aten`;
* :func:`superkernel.pipeline.segments.build_segments` cuts scopes into segments;
* :mod:`superkernel.pipeline.realize` turns every partition into one callable, by the graph's
  row of the realization table (:mod:`superkernel.runtime.realizations`);
* :func:`superkernel.pipeline.partition.assemble` stitches them into one step.

Also here: the backend registry (``backend="superkernel"``), :func:`compile` and
:func:`explain`, which finds the backend behind a compiled object.
"""

from __future__ import annotations

import copy
import functools
import time
import warnings
import weakref
from collections import Counter
from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel.config import CompilerConfig
from superkernel.pipeline.aot_compile import plain_autograd_cache, serializable, under_aot_compile
from superkernel.pipeline.capture import break_text, capture, dynamo_graph_breaks
from superkernel.pipeline.backend_context import BackendName, mark
from superkernel.pipeline.graph_dump import dump_graph
from superkernel.ir.graph import (
    Cut, Explanation, GraphInfo, SegmentInfo, SuperKernelScopeError, device_kind, graph_device, parse_options,
)
from superkernel.pipeline.partition import assemble, named_callable, split_partitions
from superkernel.pipeline.passes import reinplace_input_updates
from superkernel.pipeline.realize import Realizer
from superkernel.pipeline.segments import build_segments, last_scope
from superkernel.pipeline.tracing import (
    BREAK_AT, GRAPH_BREAK_IN_SCOPE, CaptureContext, SuperKernelScopeBreakWarning, install_break_log,
    register_compile_callbacks, scope_of_break,
)
from superkernel.runtime.realizations import GraphContext, NullStaticCompiler, StaticCompilerSeam, realization_for


class SuperKernelBackend:
    """A torch.compile backend. One instance keeps the explanation of what it compiled."""

    #: read by torch.compile's wrapper, which then also gets :attr:`backend_ctx_ctor` (``pipeline.backend_context``)
    __name__ = BackendName("superkernel")

    def __init__(self, compiler_config: CompilerConfig | None = None) -> None:
        if compiler_config is None:
            compiler_config = CompilerConfig()
        if not isinstance(compiler_config, CompilerConfig):
            raise TypeError(f"compiler_config must be a superkernel.CompilerConfig, got {type(compiler_config).__name__}")
        self.config = copy.deepcopy(compiler_config)
        from superkernel.cache_dir import check_inductor_cache

        check_inductor_cache()  # TorchInductor loads compiled modules from it: private or refused
        self.counters: Counter[str] = Counter()
        self._graphs: list[GraphInfo] = []
        #: what the realizations keep for the backend's lifetime (the CUDA graphs' shared memory pool)
        self._shared: dict[str, Any] = {}
        # (scope the previous graph ended in, Dynamo's graph-break reason if it ended in one)
        self._previous: tuple[str, str | None] = ("", None)
        self._pending_break: str | None = None
        self._graph_breaks_at_start = dynamo_graph_breaks()
        #: graph breaks Dynamo took inside a scope (their operators run uncompiled), as cuts
        self.scope_breaks: list[Cut] = []
        #: the exactness reference's captured ATen graphs and their realization rows (``debug.run_eagerly``), which
        #: ``optimize``'s analysis labels for other scope plans (:mod:`superkernel.pipeline.relabel`)
        self.reference_graphs: list[tuple[fx.GraphModule, Any]] = []
        install_break_log()
        register_compile_callbacks()
        self.backend_ctx_ctor = mark(functools.partial(CaptureContext, self))  # read by Dynamo (see CAPTURE_SETTINGS)
        #: the static-kernel compiler (a NullStaticCompiler, which just builds, when static kernels are off)
        self.static_kernels: StaticCompilerSeam = NullStaticCompiler()
        if self.config.experimental_config.static_kernel.enable:
            from superkernel.static_kernel.compiler import open_compiler

            self.static_kernels = open_compiler(self.config)
        if self.config.experimental_config.cuda_decode_kernels:
            warnings.warn("experimental_config.cuda_decode_kernels: superkernel's decode kernel set is not yet "
                          "measured on a GPU (checked on the CPU only; docs/gpu.md, 'Decode kernel set'); it runs the "
                          "decoder layers of a model prepared with this config (apply_for_generate(..., "
                          "compiler_config=...) or decode_kernels.hookup.install), the rest compiles as without it",
                          stacklevel=2)

    # -- torch.compile entry -------------------------------------------------------
    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        name = f"graph_{len(self._graphs)}"
        reason = getattr(gm, "compile_subgraph_reason", None)  # why Dynamo ended this graph
        self._pending_break = break_text(reason) if getattr(reason, "graph_break", False) else None
        row = realization_for(self.config, device_kind(example_inputs))
        # under Dynamo's AOT compile (vLLM's default): AOTAutograd without its forced, bundled cache, and the
        # step handed back as the serializable callable Dynamo requires (pipeline.aot_compile)
        aot = under_aot_compile()
        # the real inputs travel with the graph (CPU freezing matches them to the ATen graph's inputs)
        with row.tracing(self.config), plain_autograd_cache(aot):
            step = capture(gm, example_inputs,
                           functools.partial(self.compile_aten, name=name, real_inputs=example_inputs, row=row),
                           decompositions=row.decompositions(self.config))
        return serializable(step) if aot else step

    # -- ATen graph -> one step ----------------------------------------------------
    def compile_aten(self, gm: fx.GraphModule, example_inputs: list[Any], *, name: str,
                     real_inputs: list[Any] | None = None, row: Any = None) -> Callable[..., Any]:
        """``real_inputs``: the real example inputs Dynamo gave :meth:`__call__` (None when unknown); ``row``: the
        graph's row of the realization table, chosen once in :meth:`__call__` (looked up here when not given)."""
        start = time.perf_counter()
        cfg = self.config
        self.static_kernels.observe_aten_graph(gm)  # a precompiled frame being built keeps this graph
        device = graph_device(gm)
        context = GraphContext(cfg, device, self.counters, self.static_kernels, real_inputs, self._shared)
        row = row or realization_for(cfg, device)
        # A graph that starts in the scope the previous graph ended in, right after Dynamo
        # broke the previous graph, continues that scope: the break is a cut.
        prev_scope, prev_break = self._previous
        self._previous = (last_scope(gm), self._pending_break)
        if cfg.debug.graph_dump.type:
            dump_graph(gm, cfg.debug.graph_dump, f"{name}_captured")
        if not cfg.debug.run_eagerly:  # the exactness reference keeps the graph as captured
            self.counters["inputs_updated_in_place"] += reinplace_input_updates(gm)
        segmentation = build_segments(gm, continues_scope=prev_scope if prev_break else None,
                                      break_reason=prev_break, cut_rule=row.cut_reason,
                                      split_unscoped=row.splits_unscoped(cfg) and not cfg.debug.run_eagerly)
        num_ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        info = GraphInfo(name=name, num_ops=num_ops, mode=cfg.mode, device=device, cuts=segmentation.cuts,
                         unscoped_ops=sum(p.num_ops for p in segmentation.partitions if p.kind == "unscoped"),
                         step_cuts=segmentation.step_cuts)
        self._graphs.append(info)
        self.counters["graphs"] += 1
        self.counters["cuts"] += len(segmentation.cuts)
        if cfg.debug.graph_dump.type:
            dump_graph(gm, cfg.debug.graph_dump, f"{name}_segments", segmentation)
        self.static_kernels.record_graph(gm, name, device)

        if cfg.debug.run_eagerly:  # the exactness reference: the captured graph as it is
            for p in segmentation.segments:
                info.segments.append(SegmentInfo.of(p, "reference"))
            self.reference_graphs.append((gm, row))
            info.compile_seconds = time.perf_counter() - start
            return gm

        modules = split_partitions(gm, segmentation.partitions)
        realizer = Realizer(context, row)
        callables = []
        for module in modules:
            part = module.partition
            seg_info = None
            if part.kind == "segment":
                seg_info = SegmentInfo.of(part)
                info.segments.append(seg_info)
                self.counters["segments"] += 1
            callables.append(named_callable(realizer.realize(module, seg_info), part.name))
        realizer.finish()  # the graph's native module is built now, inside compile_seconds
        step = realizer.step(gm, modules, callables, info) or assemble(gm, modules, callables)
        self.static_kernels.finalize()  # end of this graph's build: write the package, release the lock
        if cfg.debug.graph_dump.type:
            dump_graph(step, cfg.debug.graph_dump, f"{name}_segmented", segmentation, modules)
        info.compile_seconds = time.perf_counter() - start
        return step

    def _scope_breaks(self, records: list[str]) -> None:
        """Report graph breaks inside scopes at compile time; strict-scope-check=abort raises."""
        found_here = 0
        unscoped: dict[str, str] = {}  # break place -> a record there that named no scope
        for message in records:
            scope = scope_of_break(message)
            where = BREAK_AT.search(message)
            escaped = "escaped from compiled region" in message
            if scope is None:
                if where:
                    unscoped[where.group(1)] = message
                continue
            # Dynamo's follow-up record ("annotate escaped from compiled region") only matters
            # when the record of the break itself was not logged (Dynamo logs each place once)
            if escaped and found_here:
                continue
            found_here += 1
            label, options = scope
            # torch 2.11 logs the break itself without the scope's ``with`` line, then the follow-up: the
            # scope is read from the follow-up, the reason from the break's own record at the same place
            said = unscoped.get(where.group(1), message) if escaped and where else message
            reason_lines = [line.strip() for line in said.splitlines() if line.strip()]
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
        self.reference_graphs.clear()
        self.counters.clear()
        self._previous, self._pending_break = ("", None), None
        self._graph_breaks_at_start = dynamo_graph_breaks()
        self.scope_breaks.clear()
        install_break_log()
        register_compile_callbacks()  # torch._dynamo.reset() clears them


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


# backend="superkernel": the compile-start callback finds the context on the registered function
# (``pipeline.backend_context.context_of_this_compile``), as torch.compile passes the name, not it.
superkernel_backend.backend_ctx_ctor = mark(lambda: CaptureContext(default_backend()))  # type: ignore[attr-defined]


def _register() -> None:
    """The backend's name, and Dynamo's compile callbacks (which do nothing for other backends' compiles).
    Nothing of torch is replaced: see ``runtime.inductor.tweaks.TWEAKS`` for what superkernel reads."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "superkernel" not in _BACKENDS or _BACKENDS["superkernel"] is None:
        register_backend(name="superkernel")(superkernel_backend)
    register_compile_callbacks()


_register()


def compile(model: Any, compiler_config: CompilerConfig | None = None, **torch_compile_kwargs: Any) -> Any:
    """``torch.compile(model, backend=get_backend(compiler_config), **kwargs)``.

    :func:`explain` accepts the result. With static kernels enabled and a
    function (not a module) to compile, the result also loads the function's precompiled
    Dynamo frame from the package (see ``superkernel.static_kernel.compiler``).
    """
    backend = get_backend(compiler_config)
    torch_compile_kwargs.setdefault("dynamic", False)
    if backend.static_kernels.enabled and _frames_apply(model, torch_compile_kwargs):
        # served by its precompiled frame: torch.compile (whose first use imports AOTAutograd and Dynamo's
        # debugging backends) is made only when a call takes the normal path
        compiled = backend.static_kernels.wrap_function(
            model, backend, _CompileOnFirstCall(model, backend, torch_compile_kwargs))
    else:
        compiled = torch.compile(model, backend=backend, **torch_compile_kwargs)
    register_compiled(compiled, backend)
    return compiled


class _CompileOnFirstCall:
    """``torch.compile(fn, backend=backend, **kwargs)``, made when first called."""

    def __init__(self, fn: Any, backend: "SuperKernelBackend", kwargs: dict[str, Any]) -> None:
        self._args = (fn, backend, dict(kwargs))
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled is None:
            fn, backend, options = self._args
            self._compiled = torch.compile(fn, backend=backend, **options)
        return self._compiled(*args, **kwargs)


def register_compiled(compiled: Any, backend: "SuperKernelBackend") -> None:
    """Let :func:`explain` find ``backend`` from ``compiled`` (a compiled model, function or precompiled step)."""
    _COMPILED[id(compiled)] = (weakref.ref(compiled), backend)


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

    ``str()`` of the result is a readable table of graphs, scopes, segments and cuts, and, for a compiled
    object, its guard path (what a call checks) with the measured cost of one check where one was taken.
    """
    explanation = find_backend(obj).explanation()
    if not isinstance(obj, SuperKernelBackend) and not isinstance(obj, str):
        explanation.guard_path = getattr(obj, "guard_path", "full-guards")
        explanation.guard_cost_us = dict(getattr(obj, "guard_costs", {}))
    return explanation
