"""What ``superkernel.compile(fn, cfg)`` returns for a function when static kernels are on.

On the first call with a new input signature it looks for a precompiled frame of ``fn``
in the package (``frames.py``): found, verified and accepted by its guards, the call runs
it and Dynamo never traces ``fn``. Not found, it traces ``fn`` once as a frame (torch's AOT
precompile, through the superkernel backend); a process that builds the package stores the
frame in it. Whatever cannot be a frame (a graph break, a guard torch cannot save, a torch
without AOT precompile) runs the normal ``torch.compile`` path, with one notice.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch

from superkernel.static_kernel import frame_keys, frames
from superkernel.static_kernel.settings import StaticKernelWarning, log
from superkernel.static_kernel.step import WatchedFrame
from superkernel.ir.graph import device_kind
from superkernel.util import exception_summary


class StaticFunction:
    """A function compiled with the superkernel backend whose Dynamo frame comes from the static package."""

    def __init__(self, fn: Callable[..., Any], backend: Any, compiled: Callable[..., Any]) -> None:
        self._fn = fn
        self._backend = backend
        self._compiled = compiled            # torch.compile(fn, backend=backend): the normal path
        self._frames: list[WatchedFrame] = []  # frames in use (AOTCompiledFunction + its state watch)
        self._last: WatchedFrame | None = None   # the frame that accepted the last call (its watch: the fast path)
        self._seen: set[str] = set()         # call signatures already resolved
        self._notified: set[str] = set()
        self._no_frames = False              # frames can never serve this function: skip the lookup
        functools.update_wrapper(self, fn)

    @property
    def backend(self) -> Any:
        return self._backend

    @property
    def guard_path(self) -> str:
        """Which checks a call runs: ``"precompiled"`` (a frame and its state watch), ``"precompiled-frame-guards"``
        (a frame whose state cannot be watched: torch's frame guards every call) or ``"full-guards"`` (Dynamo)."""
        if self._last is None:
            return "full-guards"
        return self._last.guard_path

    @property
    def guard_costs(self) -> dict[str, float]:
        """The last check of torch's guards of the frame in use, as measured when it ran (µs)."""
        us = self._last.guard_check_us if self._last is not None else None
        return {"frame_guards_last_check": us} if us is not None else {}

    @property
    def frame_counters(self) -> dict[str, int]:
        """Summed over the frames in use: ``guard_checks`` (calls that checked torch's frame guards), ``snapshots``."""
        total: dict[str, int] = {}
        for wf in self._frames:
            for k, v in wf.counters.items():
                total[k] = total.get(k, 0) + v
        return total

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        frame_args = frame_keys.frame_args(self._fn, args)
        last = self._last
        if last is not None and not kwargs and last.fast(frame_args):
            return last.aot.fn(*frame_args)
        for wf in self._frames:
            if wf.accepts(frame_args, kwargs):
                self._last = wf
                return wf.aot.fn(*frame_args, **kwargs)
        self._last = None
        if self._no_frames:
            return self._compiled(*args, **kwargs)
        signature = frame_keys.call_signature(args, kwargs)
        if signature not in self._seen:
            self._seen.add(signature)
            resolved = self._resolve(args, kwargs, signature)
            if resolved is not None:
                frame, ws = resolved
                wf = WatchedFrame(self._fn, frame)
                self._frames.append(wf)
                if wf.accepts(frame_args, kwargs):
                    self._last = wf
                    return frame.fn(*frame_args, **kwargs)
                self._notice(ws, f"precompiled frame of {frame_keys.function_name(self._fn)} rejected by its guards "
                                    f"({frames.rejection(frame, frame_args, kwargs)}); tracing it")
        return self._compiled(*args, **kwargs)

    # -- finding or building a frame ------------------------------------------------------
    def _resolve(self, args: tuple[Any, ...], kwargs: dict[str, Any], signature: str) -> tuple[Any, Any] | None:
        static = self._backend.static_kernels
        ws = static.workspace_for_call(self._fn, args)
        if not (ws.compiles or ws.native):  # run_eagerly, or no native modules: nothing is built statically
            self._no_frames = True
            return None
        key = frame_keys.frame_key(self._fn, args, kwargs, ws.fingerprint)
        found = ws.frame_bytes(key)
        if found is None:
            others = ws.frames_of(frame_keys.function_name(self._fn))
            if others and not (ws.holding or static.extend):  # (a builder adds it: no news)
                self._notice(ws, f"no precompiled frame of {frame_keys.function_name(self._fn)} for this call in the "
                                    f"package (it holds {len(others)} for other calls; differing: "
                                    f"{frame_keys.signature_difference(others[0].get('inputs', ''), signature)})")
        else:
            entry, data = found
            stale = frame_keys.stale_sources(entry.get("sources", {}))
            if stale:
                self._notice(ws, f"precompiled frame of {frame_keys.function_name(self._fn)} in the package is out of date "
                             f"(source changed or unreadable: {', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''}); "
                             "tracing it again", warn=True)
            else:
                try:
                    frame = frames.load(data, self._fn, self._backend)
                except Exception as exc:  # noqa: BLE001 - a package never crashes the run
                    ws.counters["frame_load_failed"] += 1
                    self._notice(ws, f"could not load the precompiled frame of {frame_keys.function_name(self._fn)} "
                                 f"({exception_summary(exc)}); tracing it again", warn=True)
                else:
                    ws.counters["frames_loaded"] += 1
                    return frame, ws
        frame = self._build(ws, key, args, kwargs, signature)
        return (frame, ws) if frame is not None else None

    def _build(self, ws: Any, key: str, args: tuple[Any, ...], kwargs: dict[str, Any], signature: str) -> Any | None:
        ws.deferred += 1  # one package holds the partitions and the frame
        try:
            aot_fn = frames.precompile(self._fn, self._backend, args, kwargs)
        except frames.FrameUnsupported as exc:  # a graph break, ...: no signature will be one frame
            aot_fn = None
            ws.counters["frames_unsupported"] += 1
            self._no_frames = True
            self._notice(ws, f"{frame_keys.function_name(self._fn)} cannot be precompiled as one frame ({exc}); "
                         "Dynamo traces it at the first call of each process")
        finally:
            ws.deferred -= 1
        try:
            if aot_fn is not None and (ws.holding or (self._backend.static_kernels.extend
                                                         and ws.become_builder())):
                entry = {"function": frame_keys.function_name(self._fn), "inputs": signature,
                         "level": frames.frame_level(aot_fn), "sources": frame_keys.sources_of(aot_fn)}
                data = frames.serialize(aot_fn, self._fn)
                frames.check_loads(data, self._fn)  # a frame that cannot load back is not stored
                ws.add_frame(key, entry, data)
        except frames.FrameUnsupported as exc:
            ws.counters["frames_unsupported"] += 1
            self._notice(ws, f"{frame_keys.function_name(self._fn)}: {exc}; the package holds its partitions only")
        finally:
            ws.finalize()
        return aot_fn

    def _notice(self, ws: Any, message: str, *, warn: bool = False) -> None:
        if message in self._notified:
            return
        self._notified.add(message)
        text = f"superkernel static kernels: {message}"
        if warn:
            warnings.warn(text, StaticKernelWarning, stacklevel=4)
        else:
            log.warning(text)
        ws.notices.append(text)

    def __repr__(self) -> str:
        return f"StaticFunction({frame_keys.function_name(self._fn)})"


def device_kind_of_call(fn: Any, args: tuple[Any, ...]) -> str:
    """The device kind a call runs on: its tensor arguments, else the first tensor of a closed-over module."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        first = next((p for o in frame_keys.external_objects(fn).values() if isinstance(o, torch.nn.Module)
                      for p in o.parameters()), None)
        tensors = [first] if first is not None else []
    return device_kind(tensors)
