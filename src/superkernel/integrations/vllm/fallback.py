"""A graph the superkernel backend cannot compile inside vLLM runs as Dynamo traced it: the engine keeps serving.

One warning per failure names the scope(s) of the graph and the reason (the exception's one-line text). The
graph then runs operator by operator, vLLM's custom ops included -- what vLLM runs with ``enforce_eager`` --
and under Dynamo's AOT compile it is handed back unserialized, so vLLM's AOT cache never keeps the fallback as
if it were the plan.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch.fx as fx

from superkernel.ir.graph import ANNOTATION_KEY


class VllmPlanFallbackWarning(UserWarning):
    """A superkernel plan did not compile inside vLLM; that graph runs as traced."""


def scopes_of(gm: fx.GraphModule) -> list[str]:
    seen: dict[str, None] = {}
    for node in gm.graph.nodes:
        scope = (node.meta.get("custom") or {}).get(ANNOTATION_KEY, {}).get("scope")
        if scope:
            seen.setdefault(scope, None)
    return list(seen)


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def guarded(compile_fn: Callable[[], Callable[..., Any]], gm: fx.GraphModule, plan: str,
            wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[..., Any]:
    """``compile_fn()``, or ``gm`` as traced (through ``wrap``) after one warning when it raises."""
    try:
        return compile_fn()
    except Exception as exc:  # any compile failure: the engine must keep serving
        scopes = scopes_of(gm)
        where = ", ".join(scopes[:4]) + (f" (+{len(scopes) - 4} more)" if len(scopes) > 4 else "") if scopes \
            else "(no scope)"
        warnings.warn(f"superkernel plan {plan!r} did not compile inside vLLM; scope {where} runs as traced "
                      f"(vLLM's eager path for this graph): {one_line(exc)}", VllmPlanFallbackWarning, stacklevel=2)
        return wrap(gm)


__all__ = ["VllmPlanFallbackWarning", "guarded", "one_line", "scopes_of"]
