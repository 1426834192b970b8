"""A cheap "nothing changed since the last verified call" check for a precompiled step.

A precompiled frame (:mod:`.frames`) checks torch's guards on every call: a tree of
several hundred checks over the model's modules, their attributes and every tensor
(0.2-0.4 ms per decode step of a 4-layer model on one CPU thread). Between two decode
steps, though, nothing the guards read normally changes. :class:`StateWatch` records,
from the objects a step closes over, everything those guards can reach by plain data
(instance ``__dict__``\\ s, dicts, lists, tuples, tensors) and answers "is all of it as it
was?" from a handful of C-level calls:

* every dict reached (module ``__dict__``, ``_parameters``, ``_buffers``, ``_modules``, hook
  dicts holding hooks, a config's and a cache's ``__dict__``): its version tag, which
  CPython changes on every insertion, deletion or assignment (``dict_version``, the tag
  Dynamo's own ``DICT_VERSION`` guard reads). The tags only grow, so one sum compares them
  all. An empty module *hook* dict can only
  be filled by ``register_*_hook``, which creates a ``RemovableHandle``: the watch reads that
  class's counter once (any hook registered anywhere in the process sends the next call to
  torch's guards);
* every list, set and closure cell reached: the identity of what it holds;
* every object with a ``__dict__`` reached (modules, configs, caches): its class;
* every tensor reached (weights, buffers, the KV cache): dtype, device, shape, stride,
  ``requires_grad`` and dispatch keys, in one C++ call (Dynamo's ``TensorGuards``) — a
  tensor changed in place through ``.data`` or ``Module.to()`` keeps its identity and its
  dict, and is caught here;
* torch's global state (grad mode, autocast, default dtype, thread count, ...: Dynamo's
  ``GlobalStateGuard``) and the depth of the torch-function mode stack (a default device
  is such a mode).

What it does not see, by design (precisely what a user of the fast path assumes): class
attributes and methods (a class monkeypatched while the step is used), the insides of
functions (``__code__``, ``__defaults__``, a closure cell's contents of a *nested* function),
hooks written into a module's hook dicts directly instead of through ``register_*_hook``,
``Module._non_persistent_buffers_set`` and module state-dict hooks (they do not affect a
forward), objects only reachable through properties, and Python globals (which a precompiled
function does not guard either). A change to any of those must go with a new step.

The watch never decides that a call is safe on its own: when anything watched changed,
the caller checks torch's guards and, if they accept the call, takes a new snapshot
(:meth:`StateWatch.refresh`).
"""

from __future__ import annotations

import operator
import types
from typing import Any, Iterable

import torch
from torch.utils.hooks import RemovableHandle

# Module dicts that do not affect a forward (state-dict hooks): not watched.
_IGNORED_MODULE_ATTRS = frozenset({"_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                                   "_load_state_dict_post_hooks", "_non_persistent_buffers_set"})
# Module hook dicts: while empty, a hook can only enter them through a RemovableHandle (register_*_hook),
# whose class-wide counter the watch reads once instead of checking every empty dict.
_HOOK_DICTS = frozenset({"_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                         "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs"})
_OPAQUE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type, types.CodeType,
           str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.layout,
           torch.memory_format)
MAX_OBJECTS = 50_000


class WatchUnsupported(RuntimeError):
    """This torch/Python cannot watch the step's state cheaply (the message says why)."""


def _guards() -> Any:
    try:
        g = torch._C._dynamo.guards
        g.dict_version, g.TensorGuards, g.GlobalStateGuard  # noqa: B018 - presence check
    except AttributeError as exc:
        raise WatchUnsupported(f"torch {torch.__version__} lacks Dynamo's guard primitives ({exc})") from exc
    probe: dict[str, int] = {}
    before = g.dict_version(probe)
    probe["x"] = 1
    if not g.dict_version(probe) > before:  # the sum check needs tags that grow on every change
        raise WatchUnsupported("dict version tags do not grow on mutation in this Python")
    return g


class StateWatch:
    """Snapshot of the state reachable from ``roots`` (see module doc); :meth:`unchanged` compares."""

    def __init__(self, roots: Iterable[Any], cells: Iterable[Any] = (), args: tuple[Any, ...] = ()) -> None:
        self._g = _guards()
        self._roots = list(roots)
        self._cells = list(cells)
        self.refresh(args)

    # -- snapshot -----------------------------------------------------------------------
    def refresh(self, args: tuple[Any, ...]) -> None:
        """Take a new snapshot (after torch's guards accepted a call with ``args``)."""
        dicts: list[dict[Any, Any]] = []
        seqs: list[Any] = []
        typed: list[Any] = []
        tensors: list[torch.Tensor] = []
        seen: set[int] = set()
        todo = list(self._roots)
        while todo:
            obj = todo.pop()
            if id(obj) in seen or isinstance(obj, _OPAQUE):
                continue
            seen.add(id(obj))
            if len(seen) > MAX_OBJECTS:
                raise WatchUnsupported(f"the step reaches more than {MAX_OBJECTS} objects")
            if isinstance(obj, torch.Tensor):
                tensors.append(obj)
            elif isinstance(obj, dict):
                dicts.append(obj)
                todo.extend(obj.values())
            elif isinstance(obj, (list, set)):
                seqs.append(obj)
                todo.extend(obj)
            elif isinstance(obj, (tuple, frozenset)):
                todo.extend(obj)
            elif hasattr(obj, "__dict__") and isinstance(vars(obj), dict):
                typed.append(obj)
                attrs = vars(obj)
                dicts.append(attrs)
                todo.extend(v for k, v in attrs.items() if k not in _IGNORED_MODULE_ATTRS
                            and not (k in _HOOK_DICTS and isinstance(v, dict) and not v))
            else:  # no instance dict (slots, C objects): its class at least
                typed.append(obj)
        # torch.nn.Module's global hooks apply to every module's forward
        from torch.nn.modules import module as _m

        dicts.extend(d for d in (getattr(_m, n, None) for n in dir(_m) if n.startswith("_global_") and "hooks" in n)
                     if isinstance(d, dict) and d)
        self._handles = RemovableHandle.next_id
        self._dicts = dicts
        self._version_sum = sum(map(self._g.dict_version, self._dicts))
        self._seqs = seqs
        self._seq_items = [list(s) if isinstance(s, list) else frozenset(s) for s in seqs]
        self._typed = typed
        self._types = list(map(type, typed))
        self._cell_items = [c.cell_contents for c in self._cells]
        self._tensors = tensors
        self._arg_types = list(map(type, args))
        self._arg_values = [(i, a) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
        self._arg_tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self._tensor_args_only = len(self._arg_tensors) == len(args)
        # one C++ check of every tensor: the call's tensor arguments first, then the watched tensors
        self._tensor_guard = self._tensor_guards([args[i] for i in self._arg_tensors] + tensors)
        self._global = self._g.GlobalStateGuard()
        self._modes = torch._C._len_torch_function_stack()

    def _tensor_guards(self, tensors: list[torch.Tensor]) -> Any:
        return self._g.TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                                    dynamic_dims_strides=[list(t.stride()) for t in tensors])

    # -- per call -------------------------------------------------------------------------
    def unchanged(self, args: tuple[Any, ...]) -> bool:
        """Whether everything watched, the call's arguments and the global state are as in the snapshot."""
        if list(map(type, args)) != self._arg_types:
            return False
        for i, value in self._arg_values:
            if args[i] != value:
                return False
        if not self._global.check() or torch._C._len_torch_function_stack() != self._modes:
            return False
        if RemovableHandle.next_id != self._handles:
            return False
        if sum(map(self._g.dict_version, self._dicts)) != self._version_sum:
            return False
        if list(map(type, self._typed)) != self._types:
            return False
        for seq, items in zip(self._seqs, self._seq_items):
            if isinstance(items, list):
                if len(seq) != len(items) or not all(map(operator.is_, seq, items)):
                    return False
            elif seq != items:
                return False
        if not all(map(operator.is_, (c.cell_contents for c in self._cells), self._cell_items)):
            return False
        if self._tensor_args_only:
            return bool(self._tensor_guard.check(*args, *self._tensors))
        return bool(self._tensor_guard.check(*[args[i] for i in self._arg_tensors], *self._tensors))

    @property
    def size(self) -> dict[str, int]:
        """How much is watched (reported by explain and the benchmarks)."""
        return {"dicts": len(self._dicts), "tensors": len(self._tensors), "objects": len(self._typed),
                "sequences": len(self._seqs)}


__all__ = ["MAX_OBJECTS", "StateWatch", "WatchUnsupported"]
