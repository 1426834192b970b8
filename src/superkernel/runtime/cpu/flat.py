"""A partition as one flat ATen program (CPU reduce-overhead segments, and every
partition that runs operator by operator).

The partition's generated code already calls ATen operators in a straight line. Two
changes make it cheaper to run without changing a single kernel (so results stay
bit-identical to the reference):

* every ``torch.ops.aten.X.overload(...)`` call goes straight to the operator's C++
  entry point (``OpOverload._op``), skipping the Python ``OpOverload.__call__`` layer
  and the ``torch.ops`` attribute lookups;
* the program is ``GraphModule.forward`` itself, so there is no ``nn.Module.__call__``
  (hooks) per segment.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx


def direct_call_targets(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` whose OpOverload calls go straight to their C++ entry points."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    direct: dict[str, Any] = {}
    for node in gm.graph.nodes:
        new = graph.node_copy(node, lambda n: env[n])
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and callable(getattr(target, "_op", None)):
            new.target = _placeholder_for(target, direct)
        env[node] = new
    out = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    # fx generated the code with named Python placeholders (its codegen needs a
    # __name__, which C++ entry points lack); rebind those globals to the entry points.
    code_globals = out.forward.__func__.__globals__
    for name, value in list(code_globals.items()):
        if getattr(value, "_superkernel_direct", None) is not None:
            code_globals[name] = value._superkernel_direct
    return out


def _placeholder_for(overload: torch._ops.OpOverload, cache: dict[str, Any]) -> Callable[..., Any]:
    name = "aten_" + overload.name().split("::", 1)[-1].replace(".", "_") + f"_{overload._overloadname or 'default'}"
    if name not in cache:
        def placeholder(*args: Any, **kwargs: Any) -> Any:  # replaced by the entry point after codegen
            return overload(*args, **kwargs)

        placeholder.__name__ = placeholder.__qualname__ = name
        placeholder._superkernel_direct = overload._op  # type: ignore[attr-defined]
        cache[name] = placeholder
    return cache[name]


def flat_program(gm: fx.GraphModule) -> Callable[..., Any]:
    """The segment's straight-line ATen program as a plain function."""
    return direct_call_targets(gm).forward
