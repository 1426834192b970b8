"""CPU max-autotune: the best of what TorchInductor offers for inference, per segment, by measurement.

A segment is compiled by TorchInductor as one unit (:func:`superkernel.runtime.inductor.compile.compile_partition`,
``cpp_wrapper`` per ``inductor.cpp_wrapper``). For inference, Inductor can do better when
the weights are constants: *freezing* folds them into the graph, prepacks the linear weights
for oneDNN/MKL, and makes its C++ GEMM templates (micro-kernels on packed weights) possible;
with ``inductor.gemm_templates`` (default) Inductor times them against ATen/MKL for every
GEMM at its real shape and keeps the faster. Freezing is only correct when the weights are not trained and not mutated, so a
segment is frozen only when

* the graph is an inference graph (no output requires grad: not the forward of a training step),
* each frozen input is an ``nn.Parameter`` or a static buffer (Dynamo's static inputs) with
  ``requires_grad`` off or grad disabled, not written in place anywhere in the graph, and
  not aliased by the segment's outputs,
* and the real tensors behind the graph's inputs are known (they are matched to the graph's
  placeholders by shape, stride and dtype; any mismatch -> no freezing).

With ``inductor.freezing = "auto"`` (default) both versions are compiled and timed at the
real shapes (the frozen weights themselves, clones of the other inputs), alternating, and the
faster is kept; ``True`` freezes whenever allowed without timing, ``False`` never. explain()
shows the choice in the realization: ``inductor-cpp+frozen`` / ``inductor-cpp``.

Like ``torch.compile(options={"freezing": True})``, a frozen segment keeps its own (possibly
prepacked) copy of the weights: assigning new values to the parameters in place afterwards
is not seen by it — recompile after loading new weights.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import statistics
import unittest.mock
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx


#: the GEMM backends Inductor times against each other with ``gemm_templates`` (C++ templates, ATen/MKL)
GEMM_BACKENDS = "CPP,ATEN"


@dataclass
class Choice:
    fn: Callable[..., Any]
    label: str                       # "+frozen" or ""
    timings_ms: dict[str, float]     # variant -> median time per call (empty when not measured)


def graph_real_inputs(parent: fx.GraphModule, found: Sequence[Any] | None) -> list[Any] | None:
    """The real tensors behind the parent graph's placeholders, in order, when they line up.

    ``found``: the real example inputs Dynamo handed the backend (parameters included, with
    inlined nn.Modules; the backend passes them down in its ``GraphContext``); AOTAutograd
    traces a graph with one placeholder per input. They are matched by position and checked by
    shape/stride/dtype; ``None`` if anything does not line up.
    """
    if found is None:
        return None
    placeholders = [n for n in parent.graph.nodes if n.op == "placeholder"]
    if len(found) != len(placeholders):
        return None
    for real, node in zip(found, placeholders):
        fake = node.meta.get("val")
        if isinstance(fake, torch.Tensor) != isinstance(real, torch.Tensor):
            return None
        if isinstance(real, torch.Tensor):
            if isinstance(real, torch._subclasses.FakeTensor) or real.shape != fake.shape \
                    or real.dtype != fake.dtype or real.stride() != fake.stride():
                return None
    return list(found)


def _mutated_anywhere(parent: fx.GraphModule) -> set[fx.Node]:
    """Placeholders written in place by any operator of the graph (or by copy_ at its end)."""
    out = set()
    for node in parent.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        for arg, value in zip(schema.arguments, node.args):
            if isinstance(value, fx.Node) and arg.alias_info is not None and arg.alias_info.is_write:
                out.add(value)
    return out


def _reaches_output_through_views(node: fx.Node, output: fx.Node) -> bool:
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        for user in n.users:
            if user is output:
                return True
            if user in seen:
                continue
            seen.add(user)
            schema = getattr(user.target, "_schema", None)
            if schema is not None and any(r.alias_info is not None for r in schema.returns):
                todo.append(user)
    return False


def frozen_inputs(gm: fx.GraphModule, inputs: Sequence[fx.Node], parent: fx.GraphModule,
                  parent_reals: list[Any] | None, static_indices: Sequence[int] = ()) -> dict[int, torch.Tensor]:
    """Partition input position -> real weight tensor that may be frozen (see the module doc)."""
    if parent_reals is None or torch.is_grad_enabled():
        return {}
    parent_ph = [n for n in parent.graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(parent_ph)}
    mutated = _mutated_anywhere(parent)
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    own_ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    result = {}
    for pos, node in enumerate(inputs):
        i = index.get(node)
        if i is None or node in mutated:
            continue
        real = parent_reals[i]
        if not isinstance(real, torch.Tensor) or real.device.type != "cpu":
            continue
        if not (isinstance(real, torch.nn.Parameter) or i in static_indices):
            continue
        if real.requires_grad and torch.is_grad_enabled():
            continue
        if _reaches_output_through_views(own_ph[pos], output):
            continue
        result[pos] = real
    return result


#: Operators whose weights Inductor's freezing prepacks (the reason to freeze at all).
_WEIGHT_OPS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "linear", "matmul"}


def _has_weight_op(gm: fx.GraphModule, frozen: dict[int, torch.Tensor]) -> bool:
    """Whether a frozen input reaches a GEMM/convolution (through views): otherwise freezing
    only costs a second compile."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    todo = [placeholders[i] for i in frozen]
    seen: set[fx.Node] = set()
    while todo:
        node = todo.pop()
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            packet = getattr(getattr(user.target, "overloadpacket", None), "__name__", "")
            if packet in _WEIGHT_OPS:
                return True
            schema = getattr(user.target, "_schema", None)
            if schema is not None and any(r.alias_info is not None for r in schema.returns):
                todo.append(user)  # a view of the weight (t, permute, ...)
    return False


def compile_frozen(gm: fx.GraphModule, example_inputs: list[Any], frozen: dict[int, torch.Tensor], *,
                   cpp_wrapper: bool, autotune: bool, gemm_templates: bool = True, gemm_timing: str = "memory",
                   rewrite: Callable[[fx.GraphModule], Any] | None = None, bf16_gemv: Any = "auto",
                   step: int | None = None) -> Callable[..., Any]:
    """``gm`` with the ``frozen`` inputs as constants, through Inductor's freezing passes
    (weight prepacking, constant folding), compiled as one unit; called with all inputs.

    ``gemm_templates``: Inductor times its C++ GEMM templates (micro-kernels on the packed
    weights) against ATen/MKL for every GEMM at its real shape and keeps the faster.
    ``rewrite(gm)``: a graph rewrite run once the weights are constants, before Inductor's freezing
    passes (the autofusion planner, :mod:`superkernel.runtime.inductor.autofusion`).
    ``bf16_gemv``: Inductor's fp32 micro-kernel loads bf16/fp16 weights whole and prefetches ahead on CPUs
    without native bf16 (:mod:`superkernel.runtime.inductor.bf16_gemv`).
    ``step``: the bytes the whole graph reads per call, what a GEMM's timing reads between its timed calls
    (:mod:`superkernel.runtime.inductor.gemm_timing`; ``None``: twice the last-level cache)."""
    from torch._functorch.compile_utils import fx_graph_cse
    from torch._inductor import config as inductor_config
    from torch._inductor.constant_folding import constant_fold, replace_node_with_constant
    from torch._inductor.freezing_utils import enter_freezing, record_has_frozen_params
    from torch._inductor.fx_passes.freezing_patterns import freezing_passes
    from torch._inductor.fx_passes.post_grad import view_to_reshape

    from superkernel.runtime.inductor import tweaks
    from superkernel.runtime.inductor.compile import compile_partition
    from superkernel.runtime.inductor.frozen_code import FROZEN_PATCHES, canonical_graph

    # a copy (the original stays the eager fallback); without a planner, with canonical names so that
    # identical layers generate identical code (built once: superkernel.runtime.inductor.frozen_code)
    gm = fx.GraphModule(gm, copy.deepcopy(gm.graph)) if rewrite is not None else canonical_graph(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    kept = [i for i in range(len(placeholders)) if i not in frozen]
    patches: dict[str, Any] = {"freezing": True, **FROZEN_PATCHES}
    if gemm_templates:
        patches.update({"max_autotune_gemm": True, "max_autotune_gemm_backends": GEMM_BACKENDS})
    with enter_freezing(), inductor_config.patch(patches), \
            tweaks.frozen_compile(gemm_templates=gemm_templates, gemm_timing=gemm_timing, bf16_gemv=bf16_gemv,
                                  step=step):
        for i, tensor in frozen.items():
            replace_node_with_constant(gm, placeholders[i], tensor)
        gm.recompile()
        view_to_reshape(gm)
        gm.graph = fx_graph_cse(gm.graph)
        gm.recompile()
        if rewrite is not None:
            rewrite(gm)
        kept_inputs = [example_inputs[i] for i in kept]
        freezing_passes(gm, kept_inputs)
        constant_fold(gm)
        gm.graph.lint()
        gm.recompile()
        record_has_frozen_params(gm)
        # Inductor's own freezing compiles with the fake mode accepting the real constants.
        fake_mode = torch._guards.detect_fake_mode(kept_inputs)
        with tweaks.context("real constants in the frozen compile", fake_mode), \
                tweaks.context("value-free constant comments"), tweaks.context("stable int-array names"):
            compiled = compile_partition(gm, kept_inputs, device="cpu", cpp_wrapper=cpp_wrapper, autotune=autotune)

    def run(*args: Any) -> Any:
        return compiled(*[args[i] for i in kept])

    run.source_key = getattr(compiled, "source_key", None)  # type: ignore[attr-defined]
    return run


def real_constants_allowed(fake_mode: Any) -> Any:
    """The fake mode of a frozen compile accepting the real frozen weights (:mod:`.tweaks`)."""
    if fake_mode is None:
        return contextlib.nullcontext()
    return unittest.mock.patch.object(fake_mode, "allow_non_fake_inputs", True)


def measurement_inputs(example_inputs: list[Any], reals: list[Any | None], frozen: dict[int, torch.Tensor]) -> list[Any]:
    """Real-shaped arguments for timing: the frozen weights themselves, clones of the other
    real inputs (so a timing run never writes the user's tensors), zeros/randn otherwise."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    out = []
    with unset_fake_temporarily():
        gen = torch.Generator().manual_seed(0)
        for i, fake in enumerate(example_inputs):
            if i in frozen:
                out.append(frozen[i])
                continue
            real = reals[i] if i < len(reals) else None
            if isinstance(real, torch.Tensor):
                out.append(real.detach().clone(memory_format=torch.preserve_format))
                continue
            if not isinstance(fake, torch.Tensor):
                out.append(_hint(fake))
                continue
            t = torch.empty_strided(tuple(_hint(s) for s in fake.shape), tuple(_hint(s) for s in fake.stride()),
                                    dtype=fake.dtype, device="cpu")
            if t.dtype.is_floating_point:
                t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
            else:
                t.zero_()
            out.append(t)
    return out


def _hint(value: Any) -> Any:
    """A symbolic int's example value, read without adding a guard.

    ``int(sym)`` (or a SymInt passed to a compiled partition, which wraps it in a tensor) would
    specialize it: the graph would then guard on this one value, and a decode whose cache
    int grows every step (a dynamic source) would recompile every step. An unbacked int
    (data-dependent) has no example value: this raises and the choice keeps the plain compile."""
    if isinstance(value, torch.SymInt):
        try:
            from torch.fx.experimental.symbolic_shapes import has_guarding_hint as has_hint
            from torch.fx.experimental.symbolic_shapes import optimization_hint as hint
        except ImportError:  # torch 2.11 names them has_hint / size_hint (neither guards; hint_int is deprecated)
            from torch.fx.experimental.symbolic_shapes import has_hint, size_hint as hint

        if not has_hint(value):
            raise ValueError(f"data-dependent size {value}: no example value to time with")
        return hint(value)
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        raise TypeError(f"symbolic {type(value).__name__} input: no example value to time with")
    return value


def time_variants(variants: dict[str, Callable[..., Any]], args: list[Any], rounds: int = 5, calls: int = 5) -> dict[str, float]:
    """Median ms per call of each variant, measured in alternating rounds after two throw-away rounds
    (first-call work, caches): :func:`superkernel.timing.interleaved_seconds`."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from superkernel.timing import interleaved_seconds

    names = list(variants)
    with unset_fake_temporarily(), torch.no_grad():
        seconds = interleaved_seconds([functools.partial(variants[k], *args) for k in names], rounds, warmup=2,
                                      calls=calls)
    return {k: statistics.median(t * 1e3 for t in xs) for k, xs in zip(names, seconds)}


def choose(module: Any, parent: fx.GraphModule, parent_reals: list[Any] | None, static_indices: Sequence[int],
           compile_plain: Callable[[], Callable[..., Any]], *, freezing: Any, cpp_wrapper: bool,
           autotune: bool, gemm_templates: bool = True, gemm_timing: str = "memory",
           rewrite: Callable[[fx.GraphModule], Any] | None = None, background_build: bool = False,
           bf16_gemv: Any = "auto") -> Choice:
    """Compile the segment plainly and (when allowed) frozen; keep the faster (see the module doc).

    ``background_build``: the plain variant's C++ is built on a worker thread while the frozen one is
    lowered (:mod:`superkernel.runtime.inductor.background_build`); waited for before this returns."""
    from superkernel.runtime.inductor import tweaks
    from superkernel.runtime.inductor.background_build import wait_all

    with tweaks.context("background plain build", background_build and freezing is not False, absent=[]) as pending:
        plain = compile_plain()
    try:
        return _choose(module, parent, parent_reals, static_indices, plain, freezing=freezing, cpp_wrapper=cpp_wrapper,
                       autotune=autotune, gemm_templates=gemm_templates, gemm_timing=gemm_timing, rewrite=rewrite,
                       bf16_gemv=bf16_gemv)
    finally:
        wait_all(pending)  # a failed plain build fails the compile, as before


def _choose(module: Any, parent: fx.GraphModule, parent_reals: list[Any] | None, static_indices: Sequence[int],
            plain: Callable[..., Any], *, freezing: Any, cpp_wrapper: bool, autotune: bool, gemm_templates: bool,
            gemm_timing: str, rewrite: Callable[[fx.GraphModule], Any] | None, bf16_gemv: Any = "auto") -> Choice:
    if freezing is False:
        return Choice(plain, "", {})
    frozen = frozen_inputs(module.gm, module.inputs, parent, parent_reals, static_indices)
    if not frozen or not _has_weight_op(module.gm, frozen):
        return Choice(plain, "", {})
    from superkernel.runtime.inductor.gemm_timing import step_bytes

    try:
        frozen_fn = compile_frozen(module.gm, module.example_inputs, frozen, cpp_wrapper=cpp_wrapper, autotune=autotune,
                                   gemm_templates=gemm_templates, gemm_timing=gemm_timing, rewrite=rewrite,
                                   bf16_gemv=bf16_gemv, step=step_bytes(parent_reals))
    except Exception:  # noqa: BLE001 - freezing is an optimization: the plain compile stays
        return Choice(plain, "", {})
    if freezing is True:
        return Choice(frozen_fn, "+frozen", {})
    index = {n: i for i, n in enumerate(n for n in parent.graph.nodes if n.op == "placeholder")}
    reals = [parent_reals[index[n]] if parent_reals is not None and n in index else None for n in module.inputs]
    try:
        args = measurement_inputs(module.example_inputs, reals, frozen)
        timings = time_variants({"plain": plain, "frozen": frozen_fn}, args)
    except Exception:  # noqa: BLE001 - cannot time it: keep the plain compile
        return Choice(plain, "", {})
    import logging

    logging.getLogger("superkernel").info("%s: plain %.3f ms, frozen %.3f ms per call", module.partition.name,
                                          timings["plain"], timings["frozen"])
    if timings["frozen"] < timings["plain"]:
        return Choice(frozen_fn, "+frozen", timings)
    return Choice(plain, "", timings)
