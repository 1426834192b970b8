"""``generate()``'s decode steps under a plan without Dynamo's guard check on every step.

transformers compiles ``model.__call__`` (``get_compiled_call``) and calls it once per new token; Dynamo checks the
compiled frame's guards (input shapes, dtypes, strides, the cache object, every parameter, module state, global
flags) on every call: 2.0 ms of SmolLM2-135M's int8-weight max-autotune step under ``generate()`` at 1 thread (41.3
-> 39.3 ms, same tokens, 9 alternating rounds on a noisy box;
``benchmarks/results/generate_guards_smollm2-135m_int8-weight_max-autotune.md``). Within one
``generate()`` the steps differ only in tensor values, so :class:`GuardedOncePerSignature` checks the guards of a
*signature* -- the static cache object and every argument's tensor metadata (shape, dtype, device, strides), every
other argument's value or identity, grad / inference mode -- until one of its calls compiles nothing, and runs the
calls that repeat it after that under ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``, which still tells
apart the frames Dynamo compiled (a longer cache) by their differing guards. A call whose signature is new (a new
``generate()``: a new cache; a changed shape) is checked in full and may compile. A step that breaks the graph is
checked every time (its resumed frames may recompile from step to step; under the stance that raises: MPT). What the signature cannot see
(a tensor attribute of the model swapped between calls of one ``generate()``) is not supported while a plan is on.

Installed on the model instance (its ``get_compiled_call``) by ``apply_for_generate``; :func:`remove` takes it off.
Where torch has no such stance, the steps run guarded, as before.
"""

from __future__ import annotations

import inspect
import types
import weakref
from typing import Any, Callable

import torch

_METHOD = "get_compiled_call"
_WRAPPED = "_superkernel_guarded_once"


def _stance_available() -> bool:
    try:
        return "skip_guard_eval_unsafe" in inspect.signature(torch.compiler.set_stance).parameters
    except (AttributeError, TypeError, ValueError):
        return False


def _part(value: Any, objects: list) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device, value.stride(), value.requires_grad)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, *(_part(v, objects) for v in value))
    if isinstance(value, dict):  # e.g. the attention masks per layer type, a new dict every step
        return ("dict", *sorted((str(k), _part(v, objects)) for k, v in value.items()))
    objects.append(value)
    return ("object", type(value).__qualname__, id(value))  # a cache: a new one each generate()


def signature(args: tuple, kwargs: dict, objects: list | None = None) -> tuple:
    """What decides whether a call passes the guards a call before it passed (see the module's docstring); the
    objects it names by identity are appended to ``objects``."""
    objects = [] if objects is None else objects
    return (tuple(_part(a, objects) for a in args), tuple(sorted((k, _part(v, objects)) for k, v in kwargs.items())),
            torch.is_grad_enabled(), torch.is_inference_mode_enabled())


def _compile_events() -> tuple[int, int]:
    """Graphs Dynamo compiled and graph breaks it met so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), sum(counters["graph_break"].values())


class GuardedOncePerSignature:
    """``compiled`` with Dynamo's guards checked until a call of a signature compiles nothing, and skipped on the
    calls of that signature after it; ``checked`` / ``skipped`` count the calls of each kind. A step with a graph
    break is always checked (its resumed frames may recompile from step to step: under the stance that is an error,
    measured on MPT). At most 16 signatures are kept. A signature names objects (the cache) by identity;
    when one of them is freed every signature is forgotten (its address may be reused by a cache of another length),
    and a call with an object that cannot be watched so is always checked."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self.compiled = compiled
        self.checked = self.skipped = 0
        self._seen: set[tuple] = set()
        self._watched: set[int] = set()
        #: set once a checked call broke the graph: every later call is checked
        self.disabled = False

    def _forget(self, ident: int) -> None:
        self._watched.discard(ident)
        self._seen.clear()

    def _watch(self, objects: list) -> bool:
        for obj in objects:
            if id(obj) not in self._watched:
                try:
                    weakref.finalize(obj, self._forget, id(obj))
                except TypeError:  # not weakly referenceable: its identity cannot be trusted over time
                    return False
                self._watched.add(id(obj))
        return True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        objects: list = []
        key = signature(args, kwargs, objects)
        if key in self._seen and not self.disabled:
            self.skipped += 1
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return self.compiled(*args, **kwargs)
        before = _compile_events()
        out = self.compiled(*args, **kwargs)
        self.checked += 1
        after = _compile_events()
        if after[1] != before[1]:  # a graph break: frames whose guards may change from step to step
            self.disabled = True
        if after == before and self._watch(objects):  # warm: this signature ran without compiling anything
            if len(self._seen) >= 16:
                self._seen.clear()
            self._seen.add(key)
        return out


def _get_compiled_call(self: Any, compile_config: Any) -> Any:
    compiled = getattr(type(self), _METHOD)(self, compile_config)
    wrapped = self.__dict__.get(_WRAPPED)
    if wrapped is None or wrapped.compiled is not compiled:  # transformers compiled anew (another config)
        wrapped = GuardedOncePerSignature(compiled)
        self.__dict__[_WRAPPED] = wrapped
    return wrapped


def install(model: Any) -> None:
    """Decode steps of ``model.generate()`` guarded once per signature (where torch and transformers allow; an
    earlier install is undone first)."""
    remove(model)
    if _stance_available() and callable(getattr(type(model), _METHOD, None)):
        setattr(model, _METHOD, types.MethodType(_get_compiled_call, model))


def remove(model: Any) -> None:
    model.__dict__.pop(_METHOD, None)
    model.__dict__.pop(_WRAPPED, None)


def counts(model: Any) -> tuple[int, int] | None:
    """``(checked, skipped)`` decode calls of the model's wrapped step, None before any."""
    wrapped = model.__dict__.get(_WRAPPED)
    return None if wrapped is None else (wrapped.checked, wrapped.skipped)


__all__ = ["GuardedOncePerSignature", "counts", "install", "remove", "signature"]
