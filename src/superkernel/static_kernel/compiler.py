"""The one seam between the compile pipeline and static kernels.

The backend and the realizer reach static kernels only through :class:`StaticCompiler`
(the shape of vLLM's ``compiler_interface``):

* :meth:`~StaticCompiler.hash` — the handle naming a partition: a content hash of its code,
  its static input signature and the compiler config (None: symbolic shapes, not static);
* :meth:`~StaticCompiler.load` — the compiled partition for a handle, from the package
  (None when the package does not hold it);
* :meth:`~StaticCompiler.compile` — what the realizer calls for every partition Inductor
  compiles: load it, or build it ahead of time into the next package, or (a shape the
  package lacks) run ``compile_fn``, the normal path;

plus the backend's hooks: :meth:`~StaticCompiler.record_graph` for every captured ATen
graph, :meth:`~StaticCompiler.finalize` at the end of a graph's build (writes the package),
for precompiled frames :meth:`~StaticCompiler.observe_aten_graph` and
:meth:`~StaticCompiler.wrap_function`, and for CPU reduce-overhead
:meth:`~StaticCompiler.native_provider` (a graph's native module from the package, or built
and packaged). Nothing else of this package is the backend's
business. The state behind it is shared per build directory (:mod:`.workspace`).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch.fx as fx

from superkernel.ir.graph import device_kind, graph_device
from superkernel.static_kernel import settings
from superkernel.static_kernel.package import Package, find_packages
from superkernel.static_kernel.signature import partition_key
from superkernel.static_kernel.workspace import CompileFn, Workspace, workspace


class StaticCompiler:
    """Static kernels of one backend (``backend.static_kernels``); state is shared per build dir."""

    enabled = True  # (with static kernels off the backend holds runtime.realizations.NullStaticCompiler)

    def __init__(self, compiler_config: Any, *, extend: bool = False) -> None:
        self.compiler_config = compiler_config
        self.build_dir = settings.resolve_build_dir(compiler_config.experimental_config.static_kernel.build_dir)
        self.extend = extend  # build shapes the package lacks instead of compiling them the normal way
        self._workspaces: dict[str, Workspace] = {}
        if os.environ.get(settings.ENV_PREWARM, "1") != "0":
            try:
                if find_packages(self.build_dir):
                    self.workspace("cpu").prewarm()
            except Exception:  # noqa: BLE001 - an optimization only; first use checks again
                pass

    def workspace(self, kind: str) -> Workspace:
        """The shared state of this compiler's build dir for device kind ``kind``."""
        ws = self._workspaces.get(kind)
        if ws is None:
            cfg = self.compiler_config
            ws = workspace(self.build_dir, settings.config_fingerprint(cfg, kind), kind,
                           settings.inductor_patches(cfg, kind), settings.compiles(cfg, kind),
                           settings.packs_native(cfg, kind))
            self._workspaces[kind] = ws
        return ws

    def workspace_for_call(self, fn: Any, args: tuple[Any, ...]) -> Workspace:
        """The workspace a call of ``fn`` with ``args`` uses (by the call's device kind)."""
        from superkernel.static_kernel.function import device_kind_of_call

        return self.workspace(device_kind_of_call(fn, args))

    # -- the compiler interface ------------------------------------------------------------------
    def hash(self, gm: fx.GraphModule, example_inputs: list[Any]) -> str | None:
        """The handle of a partition (see :func:`~.signature.partition_key`); None when not static."""
        return partition_key(gm, list(example_inputs), self.workspace(device_kind(example_inputs)).fingerprint)

    def load(self, handle: str, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any] | None:
        """The compiled partition ``handle`` names (``gm``: its graph, whose constants it is called with)."""
        return self.workspace(device_kind(example_inputs)).load(handle, gm)

    def compile(self, gm: fx.GraphModule, example_inputs: list[Any], compile_fn: CompileFn, *,
                name: str | None = None) -> Callable[..., Any]:
        """``fn(*args)`` for one partition: loaded, built ahead of time, or ``compile_fn()`` (no arguments)."""
        inputs = list(example_inputs)
        ws = self.workspace(device_kind(inputs))
        handle = partition_key(gm, inputs, ws.fingerprint)
        if handle is None:
            ws.counters["dynamic"] += 1
            return compile_fn()
        import superkernel.runtime.cpu.quant_kernels as quant_kernels

        # a partition built here that calls superkernel's int8 kernels carries their library in the package
        provider = None
        if ws.device_kind == "cpu":
            provider = lambda source: ws.natives.module(source, extend=self.extend)  # noqa: E731
        with quant_kernels.provided_by(provider):
            return ws.partition(handle, gm, inputs, compile_fn, extend=self.extend, name=name)

    # -- CPU freezing (the plain-vs-frozen choice; only the plain kernel is packaged) ---------------
    def packaged_choice(self, gm: fx.GraphModule, example_inputs: list[Any], *,
                        name: str | None = None) -> tuple[bool, str | None]:
        """(whether this partition comes from a package rather than being compiled now, what its build chose:
        "frozen", "plain" or None). A loaded partition whose build chose "frozen" gets one notice: the package
        carries the plain kernel only (docs/static_kernel.md)."""
        inputs = list(example_inputs)
        ws = self.workspace(device_kind(inputs))
        handle = partition_key(gm, inputs, ws.fingerprint)
        if handle is None or not ws.holds(handle):
            return False, None
        return True, ws.freezing_choice(handle, name=name)

    def record_freezing_choice(self, gm: fx.GraphModule, example_inputs: list[Any], choice: str,
                               timings_ms: dict[str, float]) -> None:
        """Record in the package being built which variant the build measured faster (and the timings)."""
        inputs = list(example_inputs)
        ws = self.workspace(device_kind(inputs))
        handle = partition_key(gm, inputs, ws.fingerprint)
        if handle is not None:
            ws.record_freezing_choice(handle, choice, timings_ms)

    # -- backend hooks ----------------------------------------------------------------------------
    def record_graph(self, gm: fx.GraphModule, graph_name: str, device: str | None = None) -> None:
        """Record a captured ATen graph's shapes (``device``: its device kind when the caller knows it)."""
        self.workspace(device or graph_device(gm)).record_graph(gm, graph_name)

    def finalize(self) -> Path | None:
        """Write a package if this process built something new (atomic); release the build lock."""
        written = None
        for ws in self._workspaces.values():
            written = ws.finalize() or written
        return written

    def native_provider(self, device: str) -> Callable[[Any], Any] | None:
        """For a graph's native CPU module (``NativeGroup(provider=...)``): ``provider(source)`` returns the
        loaded module from the package (verified, trusted, same ABI) or built here and added to the package
        being built; None when this config packages no native modules."""
        ws = self.workspace(device)
        if not ws.native:
            return None
        return lambda source: ws.natives.module(source, extend=self.extend)

    def observe_aten_graph(self, gm: fx.GraphModule) -> None:
        """A precompiled frame being built keeps the ATen graph the backend received (if any is)."""
        from superkernel.static_kernel.frames import current_capture

        capture = current_capture()
        if capture is not None:
            capture.record(gm)

    def wrap_function(self, fn: Any, backend: Any, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """``compiled`` (``torch.compile(fn)``) served by ``fn``'s precompiled frame when the package has one."""
        from superkernel.static_kernel.function import StaticFunction

        return StaticFunction(fn, backend, compiled)

    # -- what happened ----------------------------------------------------------------------------
    @property
    def counters(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for ws in self._workspaces.values():
            total.update(ws.counters)
        return total

    @property
    def package(self) -> Package | None:
        return next((ws.package for ws in self._workspaces.values() if ws.package is not None), None)

    @property
    def notices(self) -> list[str]:
        """One-line notices (shapes or frames that were not in the package)."""
        return [n for ws in self._workspaces.values() for n in ws.notices]

    @property
    def packages_written(self) -> list[Path]:
        """Packages this process wrote (the newest replaces earlier ones) that still exist."""
        return [p for ws in self._workspaces.values() for p in ws.written if p.exists()]

    @property
    def run_dirs(self) -> list[Path]:
        return [ws.run_dir for ws in self._workspaces.values() if ws.run_dir is not None]


def open_compiler(compiler_config: Any, *, extend: bool = False) -> StaticCompiler:
    """The static kernel compiler of a backend built from ``compiler_config`` (static kernels enabled)."""
    return StaticCompiler(compiler_config, extend=extend)


__all__ = ["StaticCompiler", "open_compiler"]
