"""One graph's native partitions at run time: the loaded module and a callable per partition."""

from __future__ import annotations

import operator
import threading
from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel.runtime.cpu.native.build import compiler, load
from superkernel.runtime.cpu.native.codegen import NativeSource, _Function, _Module, _check_python_variable_layout, native_source
from superkernel.runtime.cpu.native.literals import NativeBuildError, NativeUnsupported


# --- one graph's native segments -------------------------------------------------------------

class NativeGroup:
    """The native segments of one graph: emitted together and built as one module at the
    first call of any of them (or by :meth:`build`), so a graph costs one compiler run.

    ``provider(source)``, when given, supplies the loaded module instead of :func:`~.build.load` (a static
    package's module, or built and added to the package); it raises :class:`NativeBuildError` when it cannot."""

    def __init__(self, provider: Callable[[NativeSource], Any] | None = None) -> None:
        self.provider = provider
        self.segments: list[NativeSegment] = []
        self.source: NativeSource | None = None
        self.error: BaseException | None = None
        self._built = False
        self._lock = threading.Lock()

    def add(self, name: str, gm: fx.GraphModule, flat: Callable[..., Any],
            on_failure: Callable[[BaseException], None] | None = None, inference: bool = False) -> "NativeSegment":
        """Add a segment; raises :class:`NativeUnsupported` at once if it cannot be emitted.
        ``on_failure(exc)`` is called if the module later fails to build (the segment then runs ``flat``)."""
        entry = "seg_%d_%s" % (len(self.segments), "".join(c if c.isalnum() else "_" for c in name)[:48])
        _check_python_variable_layout()
        _Function(_Module(), entry, gm).emit()  # unsupported constructs surface now, per segment
        seg = NativeSegment(self, entry, gm, flat, on_failure)
        seg.inference = inference
        self.segments.append(seg)
        return seg

    def build(self) -> None:
        with self._lock:
            if self._built:
                return
            self._built = True
            try:
                programs = [(s.entry, s.gm, s.inference) for s in self.segments]
                self.source = native_source(programs)
                load_module = self.provider or load
                try:
                    module = load_module(self.source)
                except NativeBuildError:
                    if "(typed)" not in self.source.source:
                        raise
                    # a typed call this torch's headers do not take: every operator boxed instead
                    self.source = native_source(programs, typed=False)
                    module = load_module(self.source)
                for s in self.segments:
                    s._fn = getattr(module, s.entry)
            except Exception as exc:  # noqa: BLE001 - any build failure: the flat programs run, reported
                self.error = exc
                for s in self.segments:
                    s._fn = None
                for s in self.segments:
                    if s.on_failure is not None:
                        s.on_failure(exc)


class NativeSegment:
    """Callable of one native segment; runs the flat program until (and unless) the module is built,
    and for inputs the native entry point does not take (tensor subclasses)."""

    def __init__(self, group: NativeGroup, entry: str, gm: fx.GraphModule, flat: Callable[..., Any],
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        self.group = group
        self.on_failure = on_failure
        self.entry = entry
        self.gm = gm
        self.inference = False  # an inference graph: dispatch below autograd when grad is off
        self.flat = flat
        self._fn: Callable[..., Any] | None | bool = False  # False: not built yet; None: failed

    def __call__(self, *args: Any) -> Any:
        fn = self._fn
        if fn is False:
            self.group.build()
            fn = self._fn
        if fn is None:
            return self.flat(*args)
        out = fn(*args)
        if out is NotImplemented:
            return self.flat(*args)
        return out
