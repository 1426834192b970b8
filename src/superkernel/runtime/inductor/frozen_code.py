"""Identical layers compiled frozen generate the same code, so Inductor builds their C++ once.

A frozen partition (:func:`superkernel.runtime.inductor.cpu_freezing.compile_frozen`) holds its weights as
constants. Inductor lowers it with them: the freezing passes prepack the linear weights, the C++ GEMM
templates block them, and the generated C++ takes every constant as an input of its entry point
(``cpp_wrapper``; the Python wrapper's kernels take pointers). The C++ itself therefore does not depend
on the weights' values, yet identical decoder layers used to get different sources and one g++ build
each (~5 s CPU per layer at Qwen2-0.5B width), for three reasons:

* FX gave the nodes of each layer other names (``add_7`` / ``arg19_1``); they become argument and
  variable names in the C++. :func:`canonical_graph` renames them by position.
* ``from_node`` provenance (the Dynamo-level names, ``layer_norm_2``) is written into kernel comments;
  it is dropped from the copy (it only feeds comments and provenance reports).
* torch 2.11's C++ wrapper numbers its shape arrays (``int_array_<n>``) through a cache keyed by the
  ``id`` of a bound method, made anew on every call: whether a shape reuses an earlier array depended on
  where Python put that object, so a second identical layer got other numbers (found under torch 2.11 by
  ``make test-gpu-versions``; torch 2.13 keys it by the method's object).
  :func:`stable_int_array_names` keys it as 2.13 does, on a torch whose method still keys by the ``id``.
* Inductor writes one comment per constant with the tensor's ``hash`` (its ``id``) into the C++
  header, so that "different constants get different files". The constants are not in that file: they
  are attached to a fresh Python module on every load (``PyCodeCache.load_by_key_path`` with
  ``attrs`` never shares a module) and passed to the C++ entry point as inputs.
  :func:`value_free_constant_comments` writes the comment without the ``id``.

Each layer is still lowered by Inductor with its own constants (its own prepacked and blocked weights);
what identical layers share is a byte-identical source, built once by Inductor's code cache.

Why not Inductor's FX graph cache, which with freezing keys constants by metadata and binds the new
graph's constants on a hit: a frozen graph whose weights were prepacked for oneDNN holds mkldnn
tensors and is always bypassed ("mkldnn tensors unpickleable", measured in f32); where there are none
(bf16 on a CPU without native bf16, or ``cpp.weight_prepack`` off), a hit binds only the constants
still marked frozen and keeps the *previous* graph's values of the others, such as the weight a C++
GEMM template blocked during lowering (``constant3``) — measured (bf16, 2 linears, the template chosen):
a second layer with other weights gave outputs off by 77 where the first matched eager within 0.25.
The FX graph
cache is therefore off for frozen compiles (:data:`FROZEN_PATCHES`): it could serve another model's
weights from disk.
"""

from __future__ import annotations

import contextlib
import functools
import unittest.mock
from typing import Any, Iterator

import torch.fx as fx

#: Inductor options for every frozen compile (see the module doc).
FROZEN_PATCHES: dict[str, Any] = {"fx_graph_cache": False}


def canonical_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` whose node names (and placeholder targets) are ``n<position>`` and whose nodes
    carry no ``from_node`` provenance; same operators, arguments and other meta. The original is not
    changed (it stays the eager fallback)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, node in enumerate(gm.graph.nodes):
        name = f"n{i}"
        target = name if node.op == "placeholder" else node.target
        new = graph.create_node(node.op, target, fx.map_arg(node.args, env.__getitem__),
                                fx.map_arg(node.kwargs, env.__getitem__), name=name, type_expr=node.type)
        new.meta = {k: v for k, v in node.meta.items() if k != "from_node"}  # shallow, as Graph's deepcopy does
        env[node] = new
    return fx.GraphModule(gm, graph)


@contextlib.contextmanager
def parsed_templates_reused() -> Iterator[None]:
    """Inside: Inductor's C++ GEMM template parses each jinja template source once, not once per render.

    ``KernelTemplate._template_from_string`` builds a new jinja ``Template`` from the same source string
    for every rendering (a dozen per frozen decoder layer at Qwen2-0.5B width, most of the Python time a
    repeated layer costs); a parsed ``Template`` depends on the source alone and renders reentrantly,
    so the first one is kept (for the process: the next compile renders the same few sources)."""
    try:
        from torch._inductor.codegen.common import KernelTemplate
    except ImportError:
        yield
        return
    parse = getattr(KernelTemplate, "_template_from_string", None)
    if parse is None:
        yield
        return
    parsed = _PARSED_TEMPLATES

    def reuse(source: str) -> Any:
        if source not in parsed:
            parsed[source] = parse(source)
        return parsed[source]

    with unittest.mock.patch.object(KernelTemplate, "_template_from_string", staticmethod(reuse)):
        yield


#: jinja source -> its parsed template (:func:`parsed_templates_reused`)
_PARSED_TEMPLATES: dict[str, Any] = {}
#: text -> its parsed index expression (:func:`parsed_index_expressions_reused`)
_PARSED_INDEX_EXPRESSIONS: dict[str, Any] = {}


@contextlib.contextmanager
def parsed_index_expressions_reused(enabled: bool | None = None) -> Iterator[None]:
    """Inside: the C++ GEMM template's index expressions are parsed by sympy once per text, not per render.

    Rendering a GEMM template (once to time it, once more for the final code, in every frozen layer)
    turns strings such as ``"m_end - m_start"`` into sympy expressions with
    ``cpp_template_kernel.parse_expr_with_index_symbols``: ``sympy.parse_expr`` (Python's tokenizer and
    ``eval``) on the same few dozen strings, ~120 times per Qwen2-0.5B-wide layer, the largest single cost
    of rendering (measured with cProfile on repeated layers: 2.2 of 13 s). The result depends on the text
    alone (``parse_expr(str(expr))``, its free symbols replaced by integer index symbols) and a sympy
    expression is immutable, so one parse per text is kept (for the process: the texts are the templates'
    few dozen snippets, and the next compile renders the same ones); lists are rebuilt on every call
    (callers get their own)."""
    from superkernel.runtime.inductor.autotune_builds import enabled as speedups_enabled

    if enabled is None:
        enabled = speedups_enabled()
    cpp_template_kernel = None
    try:
        import torch._inductor.select_algorithm  # noqa: F401 - imports the C++ template modules in an order without a cycle
        from torch._inductor.codegen import cpp_template_kernel
    except ImportError:
        enabled = False
    parse = getattr(cpp_template_kernel, "parse_expr_with_index_symbols", None) if enabled else None
    if parse is None:
        yield
        return
    parsed = _PARSED_INDEX_EXPRESSIONS

    def reuse(expr: Any) -> Any:
        if isinstance(expr, (list, tuple)):
            return [reuse(e) for e in expr]
        if not isinstance(expr, (str, int)):
            return parse(expr)  # sympy expressions come back as they are; anything else as Inductor does it
        text = str(expr)
        if text not in parsed:
            parsed[text] = parse(text)
        return parsed[text]

    with unittest.mock.patch.object(cpp_template_kernel, "parse_expr_with_index_symbols", reuse):
        yield


@functools.lru_cache(maxsize=None)
def _keys_int_arrays_by_transient_id(method: Any) -> bool:
    """Whether ``CppWrapperCpu.codegen_int_array_var`` keys its cache by ``id(writeline)`` (torch 2.11); read once
    per method, not on every frozen compile."""
    import inspect

    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):
        return False
    return "id(writeline)" in source and "__self__" not in source


def int_array_key(int_array: str, writeline: Any, known_statically: bool, graph: Any) -> tuple[Any, ...]:
    """The shape-array cache key torch 2.13 uses: a bound ``writeline`` counts by the object it writes to."""
    owner = getattr(writeline, "__self__", None)
    return int_array, id(owner) if owner is not None else id(writeline), known_statically, id(graph) if graph else None


@contextlib.contextmanager
def stable_int_array_names() -> Iterator[None]:
    """Inside: the C++ wrapper's shape-array cache is keyed by the buffer a ``writeline`` writes to, not by
    the ``id`` of the bound method (which Python reuses or not): the same graph gets the same array names.
    Only where this torch keys by that ``id``; elsewhere nothing changes."""
    try:
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    except ImportError:
        yield
        return
    original = getattr(CppWrapperCpu, "codegen_int_array_var", None)
    if original is None or not hasattr(CppWrapperCpu, "_codegen_int_array_var_impl") \
            or not _keys_int_arrays_by_transient_id(original):
        yield
        return

    def codegen_int_array_var(self: Any, int_array: str, writeline: Any, known_statically: bool = False,
                              graph: Any = None) -> str:
        key = int_array_key(int_array, writeline, known_statically, graph)
        cache = self.codegen_int_array_var_cache
        if key not in cache:
            cache[key] = self._codegen_int_array_var_impl(int_array, writeline, known_statically)
        return cache[key]

    with unittest.mock.patch.object(CppWrapperCpu, "codegen_int_array_var", codegen_int_array_var):
        yield


@contextlib.contextmanager
def value_free_constant_comments() -> Iterator[None]:
    """Inside: the C++ wrapper's per-constant header comment names the constant without its ``id``.
    Where this torch's Inductor has no such hook, nothing changes (the layers are then built apart)."""
    try:
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    except ImportError:
        yield
        return
    if not hasattr(CppWrapperCpu, "write_constant"):
        yield
        return

    def write_constant(self: Any, name: str, hashed: str) -> None:
        self.header.writeline(f"// {name}")

    with unittest.mock.patch.object(CppWrapperCpu, "write_constant", write_constant):
        yield
