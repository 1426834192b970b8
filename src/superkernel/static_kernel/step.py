"""The precompiled step: a function compiled once ahead of time, then called without Dynamo.

``torch.compile`` checks Dynamo's whole guard tree (about a thousand checks for a
4-layer decoder) before every call. A precompiled step instead holds torch's AOT
precompiled frame of the function (:func:`.frames.precompile`, or one loaded from a static
package) and runs it directly. Per call it checks:

1. **fast path** — :class:`~.watch.StateWatch`: nothing the frame can depend on changed
   since the last call that torch's guards accepted (dict version tags, list and cell
   identities, object classes, tensor metadata, global state; a few microseconds);
2. otherwise **torch's guards of the frame** (what a precompiled function checks: tensor,
   shape, constant and global-state guards); accepted: the watch takes a new snapshot and
   the frame runs;
3. rejected: the **guarded path** (``on_violation="fallback"``, the default: the function
   compiled with ``torch.compile`` and the same backend, which traces and recompiles as it
   must) or a :class:`PrecompiledStepError` naming the rejected guard
   (``on_violation="error"``).

So a violated assumption (other weights by identity, another cache, other shapes or dtypes)
is either still accepted by torch's guards (the frame reads weights and cache as inputs:
the result is right) or leaves the frame — never a stale result.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from typing import Any, Callable

import torch

from superkernel.static_kernel import frame_keys, frames
from superkernel.static_kernel.watch import StateWatch, WatchUnsupported

ON_VIOLATION = ("fallback", "error")


class PrecompiledStepError(RuntimeError):
    """A precompiled step was called where its frame does not apply (``on_violation="error"``)."""


def closure_cells(fn: Any) -> list[Any]:
    inner = frame_keys._inner(fn)
    return list(getattr(inner, "__closure__", None) or ())


class WatchedFrame:
    """One precompiled frame of ``fn`` and the :class:`~.watch.StateWatch` that lets calls skip its guards.

    The watch is (re)taken whenever torch's guards of the frame accept a call, *before* the
    frame runs: it records the state the guards approved, so side effects of the step on
    Python state make the next call check the guards again.
    """

    def __init__(self, fn: Callable[..., Any], aot_fn: Any, unguarded_subclass_guards: int = 0) -> None:
        self.fn = fn
        self.aot = aot_fn
        #: guards on tensor-subclass weights the frame was built without (:class:`.frames.GuardFilter`): once
        #: the watch saw a change, torch's remaining guards cannot vouch for those weights, so the call leaves
        #: the frame
        self.unguarded_subclass_guards = unguarded_subclass_guards
        self.refusal: str | None = None  # why the last refused call was refused without asking torch's guards
        self.watch: StateWatch | None = None
        self.unsupported: str | None = None  # why this frame cannot be watched (every call checks its guards)
        self.guard_check_us: float | None = None  # the last check of torch's frame guards took this long
        self.counters: Counter[str] = Counter()

    @property
    def guard_path(self) -> str:
        """``"precompiled"`` (watched), ``"precompiled-frame-guards"`` (the state cannot be watched: torch's frame
        guards on every call) or ``"full-guards"``: a quantized frame whose state cannot be watched sends every
        call after the first to the guarded path (its own guards cannot vouch for its quantized weights)."""
        if self.unsupported is None:
            return "precompiled"
        return "full-guards" if self.unguarded_subclass_guards else "precompiled-frame-guards"

    def fast(self, frame_args: tuple[Any, ...]) -> bool:
        """Whether nothing watched changed since the last accepted call (the frame may run without guards)."""
        return self.watch is not None and self.watch.unchanged(frame_args)

    def accepts(self, frame_args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Torch's guards of the frame; on acceptance, a new snapshot for the fast path."""
        self.counters["guard_checks"] += 1
        self.refusal = None
        if self.unguarded_subclass_guards and (self.watch is not None or self.unsupported is not None):
            self.refusal = ("the watched state changed, and the frame does not guard its tensor-subclass (quantized) "
                            "weights")
            return False
        start = time.perf_counter()
        accepted = self.aot.guard_check(*frame_args, **kwargs)
        self.guard_check_us = (time.perf_counter() - start) * 1e6
        if not accepted:
            return False
        if kwargs or self.unsupported is not None:
            return True
        try:
            if self.watch is None:
                self.watch = StateWatch(frame_keys.external_objects(self.fn).values(), closure_cells(self.fn),
                                        frame_args)
            else:
                self.watch.refresh(frame_args)
            self.counters["snapshots"] += 1
        except WatchUnsupported as exc:
            self.unsupported = str(exc)
            self.watch = None
        return True


class PrecompiledStep:
    """``fn`` served by its precompiled frame, checked by a :class:`~.watch.StateWatch` (module doc).

    ``guarded`` (no arguments) returns the guarded path, created on first need.
    """

    def __init__(self, fn: Callable[..., Any], aot_fn: Any, guarded: Callable[[], Callable[..., Any]], *,
                 on_violation: str = "fallback", unguarded_subclass_guards: int = 0) -> None:
        if on_violation not in ON_VIOLATION:
            raise ValueError(f"on_violation={on_violation!r}: allowed values are {', '.join(ON_VIOLATION)}")
        self._fn = fn
        self._frame = WatchedFrame(fn, aot_fn, unguarded_subclass_guards)
        self._aot = aot_fn
        self._guarded_factory = guarded
        self._guarded: Callable[..., Any] | None = None
        self.on_violation = on_violation
        self.last_violation: str | None = None
        functools.update_wrapper(self, fn)

    @property
    def counters(self) -> Counter[str]:
        """``guard_checks`` (calls that checked torch's guards), ``snapshots``, ``rejected``, ``fallback_calls``."""
        return self._frame.counters

    @property
    def watch(self) -> StateWatch | None:
        return self._frame.watch

    @property
    def guard_costs(self) -> dict[str, float]:
        """The last check of torch's frame guards, as measured when it ran (µs); see :meth:`guard_cost_us`."""
        us = self._frame.guard_check_us
        return {"frame_guards_last_check": us} if us is not None else {}

    @property
    def guard_path(self) -> str:
        """``"precompiled"`` (watched; torch's frame guards when something changed) or, where the state cannot
        be watched, ``"precompiled-frame-guards"`` (torch's frame guards on every call) or, for a quantized
        frame, ``"full-guards"`` (:attr:`WatchedFrame.guard_path`)."""
        return self._frame.guard_path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        frame_args = frame_keys.frame_args(self._fn, args)
        if not kwargs and self._frame.fast(frame_args):
            return self._aot.fn(*frame_args)
        if self._frame.accepts(frame_args, kwargs):
            return self._aot.fn(*frame_args, **kwargs)
        return self._violated(args, kwargs, frame_args)

    @property
    def unguarded_subclass_guards(self) -> int:
        """How many guards on tensor-subclass (quantized) weights the frame was built without (see
        :class:`WatchedFrame`)."""
        return self._frame.unguarded_subclass_guards

    def _violated(self, args: tuple[Any, ...], kwargs: dict[str, Any], frame_args: tuple[Any, ...]) -> Any:
        reason = self._frame.refusal or frames.rejection(self._aot, frame_args, kwargs)
        self.last_violation = reason
        self.counters["rejected"] += 1
        if self.on_violation == "error":
            raise PrecompiledStepError(
                f"precompiled step {frame_keys.function_name(self._fn)}: this call breaks an assumption of its frame "
                f"({reason}); allowed: the same module objects, weights and cache of the same dtype/shape/stride, "
                "inputs of the built shapes and dtypes (on_violation='fallback' runs the guarded path instead)")
        if self._guarded is None:
            self._guarded = self._guarded_factory()
        self.counters["fallback_calls"] += 1
        return self._guarded(*args, **kwargs)

    def guard_cost_us(self, *args: Any, repeats: int = 200) -> dict[str, float]:
        """Measured cost of one check, in microseconds: torch's frame guards and (once watched) the watch."""
        frame_args = frame_keys.frame_args(self._fn, args)
        watch = self.watch
        checks = {"frame_guards": lambda: self._aot.guard_check(*frame_args)}
        if watch is not None:
            checks["watch"] = lambda: watch.unchanged(frame_args)
        return {name: _time_us(check, repeats) for name, check in checks.items()}

    def __repr__(self) -> str:
        return f"PrecompiledStep({frame_keys.function_name(self._fn)}, {self.guard_path})"


def _time_us(check: Callable[[], Any], repeats: int) -> float:
    check()
    start = time.perf_counter()
    for _ in range(repeats):
        check()
    return (time.perf_counter() - start) / repeats * 1e6


def full_guard_cost_us(fn: Callable[..., Any], args: tuple[Any, ...], repeats: int = 200) -> float | None:
    """Measured cost (µs) of Dynamo's guard check for a call of ``fn`` compiled with ``torch.compile`` (the cache
    entry that accepts ``args``); None when no entry accepts it (or this torch does not expose them)."""
    import inspect

    inner = frame_keys._inner(fn)
    try:
        entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(inner.__code__)
        f_locals = {name: cell.cell_contents for name, cell in zip(inner.__code__.co_freevars, closure_cells(fn))}
        f_locals.update(inspect.signature(inner).bind(*frame_keys.frame_args(fn, args)).arguments)
    except Exception:  # noqa: BLE001 - private torch structure: a measurement, not a feature
        return None
    for entry in entries:
        manager = getattr(entry, "guard_manager", None)
        if manager is not None and manager.check(f_locals):
            return _time_us(lambda: manager.check(f_locals), repeats)
    return None


__all__ = ["ON_VIOLATION", "PrecompiledStep", "PrecompiledStepError", "WatchedFrame", "closure_cells", "full_guard_cost_us"]
