"""A captured ATen graph labelled for another scope plan, without tracing the model again.

Scopes put on a model by :func:`superkernel.apply_scopes` are module boundaries, and Dynamo
records for every operator the module calls it was traced inside (``nn_module_stack``, keyed by
the module's ``id`` and kept through AOTAutograd). Two plans over the same model therefore
capture the same ATen graph; only the scope labels differ. ``optimize``'s analysis captures the
first plan and labels that graph for the others here (a capture of SmolLM2's 30 layers costs
~40 s of Dynamo and AOTAutograd on 2 cores; labelling costs milliseconds).

:func:`labels_for` refuses (returns None) whenever the graph's own labels are not exactly what
its plan's module boundaries give — scopes written in the model's code, a module Dynamo did not
record — so a shared analysis is only ever one that a capture would have produced.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

import torch
import torch.fx as fx

from superkernel.ir.graph import ANNOTATION_KEY


def scoped_modules(model: torch.nn.Module, scopes: Mapping[str, str | list[str]]
                   ) -> Iterator[tuple[str, str, torch.nn.Module]]:
    """``(label, module path, module)`` for each module a plan's globs match, in the order
    :func:`~superkernel.apply_scopes` wraps them."""
    from superkernel.scope_apply import match_modules

    for label, globs in scopes.items():
        for pattern in [globs] if isinstance(globs, str) else list(globs):
            for name, module in match_modules(model, pattern):
                yield label, name, module


def module_labels(model: torch.nn.Module, scopes: Mapping[str, str | list[str]]) -> dict[int, str] | None:
    """``id(module) -> label`` for a plan's module globs; None when one module instance would get two labels."""
    out: dict[int, str] = {}
    for label, _, module in scoped_modules(model, scopes):
        if out.setdefault(id(module), label) != label:
            return None
    return out


def _stack_label(node: fx.Node, by_module: dict[int, str]) -> str:
    """The label of the innermost labelled module the node was traced in ("" if none); the stack's keys are
    module ids (:func:`labels_for` checks that first)."""
    stack = node.meta.get("nn_module_stack") or {}
    return next((by_module[int(key)] for key in reversed(list(stack)) if int(key) in by_module), "")


def _own_label(node: fx.Node) -> str:
    return ((node.meta.get("custom") or {}).get(ANNOTATION_KEY) or {}).get("scope", "") or ""


def labels_for(gm: fx.GraphModule, model: torch.nn.Module, captured_with: Mapping[str, str | list[str]],
               wanted: Mapping[str, str | list[str]]) -> dict[fx.Node, str] | None:
    """Each operator's label under plan ``wanted`` for a graph captured with plan ``captured_with`` applied
    (without scope options); None when the graph's labels are not exactly ``captured_with``'s module
    boundaries, so ``wanted``'s cannot be read from it either."""
    module_ids = {id(m) for m in model.modules()}
    have, want = module_labels(model, captured_with), module_labels(model, wanted)
    if have is None or want is None:
        return None
    out: dict[fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        stack = node.meta.get("nn_module_stack") or {}
        if any(not str(k).isdigit() or int(k) not in module_ids for k in stack):
            return None
        if _stack_label(node, have) != _own_label(node):
            return None  # a scope in the model's code, or one Dynamo's stack does not show
        out[node] = _stack_label(node, want)
    return out


@contextlib.contextmanager
def labelled(gm: fx.GraphModule, labels: dict[fx.Node, str]) -> Iterator[fx.GraphModule]:
    """``gm`` with its operators' scope annotations set to ``labels`` (no options) while inside; restored after."""
    saved = {node: node.meta.get("custom") for node in labels}
    try:
        for node, label in labels.items():
            custom = dict(saved[node] or {})
            custom.pop(ANNOTATION_KEY, None)
            if label:
                custom[ANNOTATION_KEY] = {"scope": label, "options": ""}
            node.meta["custom"] = custom
        yield gm
    finally:
        for node, custom in saved.items():
            if custom is None:
                node.meta.pop("custom", None)
            else:
                node.meta["custom"] = custom
