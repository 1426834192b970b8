"""Native CPU modules in a package: one per graph in CPU reduce-overhead (:mod:`superkernel.runtime.cpu.native`).

A graph's native segments are one generated C++ module, built with the system's C++
compiler. A package carries the built library as ``native/<key>.so`` (``key``: a hash of
the module's source, :func:`~superkernel.runtime.cpu.native.build.source_key`, the same in a
process without a compiler), with the module's import name and the torch/Python ABI it was
built for (:func:`~superkernel.runtime.cpu.native.build.abi_fingerprint`). A process that needs
the module for the same source takes it from the package — only a verified package signed
by this user, after which the library is written into the package's private 0700 cache
directory and imported from there — so it runs the native module without a compiler. An ABI
that differs (another torch or Python build) is never loaded: the module is built here
instead (or the flat program runs when there is no compiler), with one notice. A builder
adds every module it builds to the next package.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from superkernel.runtime.cpu.native.build import (
    abi_fingerprint, library_path, load, load_library, source_key, trusted_library_bytes,
)
from superkernel.static_kernel.builder import Artifact, Builder
from superkernel.static_kernel.loader import ArtifactLoader
from superkernel.static_kernel.package import Package
from superkernel.static_kernel.settings import log
from superkernel.util import exception_summary



class WorkspaceView(Protocol):
    """What the native modules use of their :class:`~superkernel.static_kernel.workspace.Workspace`
    (which owns them: the workspace imports this module, not the other way round)."""

    package: Package | None
    builder: Builder
    loader: ArtifactLoader
    mutex: Any  # a threading.RLock
    counters: Counter[str]
    graphs: dict[str, dict[str, Any]]
    current_graph: str | None
    notices: list[str]

    @property
    def holding(self) -> bool: ...

    def check(self) -> None: ...

    def become_builder(self, need_graph: str | None = None, need_key: str | None = None) -> bool: ...


def abi_difference(recorded: dict[str, Any], here: dict[str, str]) -> str | None:
    """Why a module built for ``recorded`` must not load here (None when it may)."""
    for key in sorted(set(recorded) | set(here)):
        if recorded.get(key) != here.get(key):
            return f"{key} differs (package: {recorded.get(key)!r}, here: {here.get(key)!r})"
    return None


class NativeModules:
    """The native modules of one workspace: from its package, or built here (and packaged by a builder)."""

    def __init__(self, ws: WorkspaceView) -> None:
        self.ws = ws
        self.loaded: dict[str, Any] = {}
        self._notified: set[str] = set()

    def _find(self, key: str) -> tuple[Package, dict[str, Any]] | None:
        ws = self.ws
        if ws.package is not None and key in ws.package.native:
            return ws.package, ws.package.native[key]
        carried = ws.builder.carried_from
        if carried is not None and key in carried.native:  # extending a package: its modules load as well
            return carried, carried.native[key]
        return None

    def module(self, src: Any, *, extend: bool = False) -> Any:
        """The loaded module of ``src`` (a NativeSource); raises NativeBuildError when it can be neither
        taken from the package nor built."""
        ws = self.ws
        ws.check()
        key = source_key(src.source)
        with ws.mutex:
            module = self.loaded.get(key)
            if module is not None:
                return module
            found = self._find(key)
            if found is not None:
                module = self._from_package(*found, key, "native module", mismatch=", building it here (the flat "
                                            "program runs if there is no C++ compiler)", failed="; building it here")
                if module is not None:
                    return module
            module = load(src)  # built here (or from this user's cache); NativeBuildError when it cannot be
            self.loaded[key] = module
            if found is None and self._may_add(extend):
                self._add(key, src)
            elif found is None:
                ws.counters["native_fallback"] += 1
                graph = ws.graphs.get(ws.current_graph or "", {}).get("names", [])
                self._notice(ws.current_graph or key, f"native module of graph {', '.join(graph) or '?'} not in "
                                                      f"package {ws.package.path.name if ws.package else '-'}; "
                                                      "built (or loaded from this user's cache) the normal way")
            return module

    def load_op_libraries(self, pkg: Package) -> None:
        """Load the operator libraries ``pkg`` carries (superkernel's int8 kernels), before any of its partitions:
        compiled code calls their operators by name. Verified, trusted and same-ABI only, like every module; one
        that cannot load leaves the partitions that need it to fail to load and be built again."""
        import superkernel.runtime.cpu.quant_kernels as quant_kernels

        with self.ws.mutex:
            for key, entry in pkg.native.items():
                if entry.get("ops") is True and key not in self.loaded:
                    module = self._from_package(pkg, entry, key, "operator library", mismatch="", failed="")
                    if module is not None:
                        quant_kernels.adopt(module)

    def _from_package(self, pkg: Package, entry: dict[str, Any], key: str, what: str, *, mismatch: str,
                      failed: str) -> Any | None:
        """Module ``key`` of ``pkg`` loaded (verified and trusted, same ABI), or None with a notice (``what`` names
        it, ``mismatch`` / ``failed`` end the notice: what happens instead)."""
        ws = self.ws
        why = abi_difference(entry["abi"], abi_fingerprint())
        if why is not None:
            ws.counters["native_abi_mismatch"] += 1
            self._notice(key, f"{what} {key[:12]} in package {pkg.path.name} was built for another torch/Python ABI "
                              f"({why}); not loading it{mismatch}")
            return None
        try:
            path = ws.loader.install_native(pkg, key)  # (verified and trusted, else PackageError)
            module = load_library(path, entry["module"])
        except Exception as exc:  # noqa: BLE001 - a package never crashes the run
            ws.counters["native_load_failed"] += 1
            self._notice(key, f"could not load {what} {key[:12]} from {pkg.path.name} "
                              f"({exception_summary(exc)}){failed}")
            return None
        ws.counters["native_loaded"] += 1
        self.loaded[key] = module
        return module

    def _may_add(self, extend: bool) -> bool:
        ws = self.ws
        if ws.holding:
            return True
        if ws.package is not None and not extend:
            return False
        return ws.become_builder()

    def _add(self, key: str, src: Any) -> None:
        data = trusted_library_bytes(library_path(src))
        if data is None:
            return  # (removed or replaced in the cache meanwhile: never packaged unless this user built it)
        ws = self.ws
        entry = {"file": f"native/{key}.so", "module": src.module_name, "abi": abi_fingerprint(),
                 "graph": ws.current_graph, "entries": list(src.entries)}
        if src.registers_ops:
            entry["ops"] = True  # loaded before any partition of the package (they call its operators)
        ws.builder.new_native[key] = Artifact(entry, data)
        ws.counters["native_built"] += 1

    def _notice(self, topic: str, message: str) -> None:
        if topic in self._notified:
            return
        self._notified.add(topic)
        text = f"superkernel static kernels: {message}"
        self.ws.notices.append(text)
        log.warning(text)


__all__ = ["NativeModules", "abi_difference"]
