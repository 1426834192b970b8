"""Everything one process knows about one build directory: load a package, or build one.

One :class:`Workspace` per (build dir, config fingerprint, device kind) and process, shared
by every backend that uses it (:func:`workspace`). It decides once whether a usable package
exists (:class:`~.store.PackageStore`) or this process builds (taking the
:class:`~.lock.BuildLock`); then, per partition, it loads from the package
(:class:`~.loader.ArtifactLoader`), builds (:class:`~.builder.Builder`) or lets the normal
path compile; per graph in CPU reduce-overhead, its native module comes from the package or
is built and added (:class:`~.native.NativeModules`); ``finalize`` writes the package and
releases the lock.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import os
import shutil
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch.fx as fx

from superkernel.static_kernel.builder import Builder
from superkernel.static_kernel.constants import constant_values, lift_constants, with_constants
from superkernel.static_kernel.environment import environment
from superkernel.static_kernel.loader import ArtifactLoader
from superkernel.static_kernel.lock import BuildLock
from superkernel.static_kernel.native import NativeModules
from superkernel.static_kernel.package import OUTPUTS_DIR, Package
from superkernel.static_kernel.records import ShapeRecorder
from superkernel.static_kernel.settings import StaticKernelWarning, log
from superkernel.util import make_dirs
from superkernel.static_kernel.signature import graph_input_shapes, graph_structure_hash, input_signature
from superkernel.static_kernel.store import PackageStore
from superkernel.util import exception_summary

CompileFn = Callable[[], Callable[..., Any]]


class Workspace:
    """One build directory as seen by this process (for one config fingerprint and device kind)."""

    def __init__(self, build_dir: Path, fingerprint: str, device_kind: str, patches: dict[str, Any],
                 compiles: bool = True, native: bool = False) -> None:
        self.build_dir = build_dir
        self.compiles = compiles  # False: reduce-overhead / run_eagerly, nothing to build: record only, no lock
        self.native = native  # CPU reduce-overhead with native modules: they are packaged (the lock when one is built)
        self.root = build_dir / OUTPUTS_DIR
        self.fingerprint = fingerprint
        self.device_kind = device_kind
        self.patches = patches
        self.env = environment(device_kind)
        self.counters: Counter[str] = Counter()
        self.mutex = threading.RLock()
        self.lock = BuildLock(self.root, self.counters)
        self.store = PackageStore(build_dir, device_kind, self.env, fingerprint, self.counters)
        self.builder = Builder(self.ensure_run_dir, self.counters)
        self.loader = ArtifactLoader(self.counters, device_kind)
        self.natives = NativeModules(self)
        self.checked = False
        self.package: Package | None = None
        self.deferred = 0  # > 0: a frame is being built; finalize waits for it
        self.graphs: dict[str, dict[str, Any]] = {}
        self.written: list[Path] = []
        self.loaded_fns: dict[str, Callable[..., Any]] = {}
        self.run_dir: Path | None = None
        self.recorder: ShapeRecorder | None = None
        self._notified: set[str] = set()
        self.notices: list[str] = []
        self.current_graph: str | None = None

    @property
    def holding(self) -> bool:
        """Whether this process holds the build lock (it is the builder)."""
        return self.lock.holding

    def ensure_run_dir(self) -> Path:
        if self.run_dir is None:
            stamp = _dt.datetime.now().strftime("%Y%m%d%H%M%S%f")
            pid = os.getpid()
            self.run_dir = self.root / f"{stamp}_{pid}_outputs"
            make_dirs(self.run_dir, "static kernel run folder")  # never through a link (docs/security.md)
            self.recorder = ShapeRecorder(self.run_dir, pid)
        return self.run_dir

    # -- load or build: decided once ----------------------------------------------------------
    def prewarm(self) -> None:
        """Adopt a usable package early (no lock taken) and install its kernels (when the backend is created)."""
        with self.mutex:
            if self.checked or not (self.compiles or self.native):
                return
            pkg = self.store.usable(self.package)
            if pkg is None:
                return  # check() decides later (and may build)
            self.checked = True
            self.package = pkg
            try:
                self.loader.install(pkg)
            except Exception:  # noqa: BLE001 - the load path reports problems
                return

    def check(self) -> None:
        """Decide once: load a usable package, or become the builder (waiting for one first)."""
        with self.mutex:
            if self.checked:
                return
            self.checked = True
            if not (self.compiles or self.native):
                return
            pkg = self.store.usable(self.package)
            if pkg is not None:
                self.package = pkg
                return
            layout = self.store.layout_error()
            if layout is not None:
                self.checked = False  # (asked again, it says so again)
                raise layout
            if self.compiles:  # (native modules only: the lock is taken when one is built, .native)
                self.become_builder()

    def become_builder(self, need_graph: str | None = None, need_key: str | None = None) -> bool:
        """Hold the lock so this process builds; adopts a newer package that already has what is needed."""
        if self.holding:
            return True
        if not self.lock.acquire():
            return False
        newest = self.store.usable(self.package, need_graph=need_graph, need_key=need_key)
        if newest is not None and (need_graph is not None or need_key is not None or self.package is None):
            self.package = newest
            self.lock.release()
            return False
        if self.package is not None and self.builder.carried_from is not self.package:
            self.store.superseded.add(self.package.path)  # extended: the new package replaces it
            self.builder.carry(self.package)
        return True

    def release(self) -> None:
        self.lock.release()

    # -- graphs -----------------------------------------------------------------------------
    def record_graph(self, gm: fx.GraphModule, graph_name: str) -> None:
        self.check()
        with self.mutex:
            h = graph_structure_hash(gm)
            self.current_graph = h
            g = self.graphs.setdefault(h, {"names": [], "variants": []})
            if graph_name not in g["names"]:
                g["names"].append(graph_name)
            shapes = graph_input_shapes(gm)
            if shapes not in g["variants"]:
                g["variants"].append(shapes)
            if (not self.holding and self.package is not None and h not in self.package.graphs
                    and h not in self.builder.carried_graphs):
                old = self.package
                if self.become_builder(need_graph=h) and old.path not in self.written:  # (own package: next graph)
                    warnings.warn(
                        f"superkernel static kernels: package {old.path} was built for other graphs "
                        f"(graph {graph_name!r} is not in it: model, code or config changed); "
                        "building a new package that replaces it", StaticKernelWarning, stacklevel=4)
            if self.holding or not (self.compiles or self.package is not None):
                # only a building process records (or one with nothing to build and no package: reduce-overhead
                # without native modules); a process loading a package writes nothing into the build dir
                self.ensure_run_dir()
                assert self.recorder is not None
                self.counters["records"] += self.recorder.record_graph(gm, graph_name, h)
                g["record_dir"] = str(self.recorder.dir)

    # -- partitions -------------------------------------------------------------------------
    def load(self, key: str, gm: fx.GraphModule) -> Callable[..., Any] | None:
        """The partition ``key`` from this process, the package in use or the one being extended
        (``gm``'s constants appended to its arguments); None when none holds it or it does not load."""
        self.check()
        with self.mutex:
            constants = constant_values(gm)  # the graph copy with them lifted is made only to build
            fn = self.loaded_fns.get(key)
            if fn is not None:  # same code and shapes seen before in this process (weights are per call site)
                self.counters["reused"] += 1
                return with_constants(fn, constants)
            fn = None
            if self.package is not None and key in self.package.artifacts:
                self.natives.load_op_libraries(self.package)
                fn = self.loader.load(key, self.package.artifact_bytes(key), self.package)
            if fn is None and key in self.builder.carried:  # extending a package: its artifacts load as well
                self.natives.load_op_libraries(self.builder.carried_from)
                fn = self.loader.load(key, self.builder.carried[key].data, self.builder.carried_from)
            if fn is None:
                return None
            self.loaded_fns[key] = fn
            return with_constants(fn, constants)

    def partition(self, key: str, gm: fx.GraphModule, example_inputs: list[Any], compile_fn: CompileFn, *,
                  extend: bool, name: str | None) -> Callable[..., Any]:
        """Load partition ``key``, or build it, or (a shape the package lacks) compile it the normal way."""
        self.check()
        with self.mutex:
            fn = self.load(key, gm)
            if fn is not None:
                return fn
            if not self.holding:
                if not (extend or self.package is None):
                    self.counters["fallback"] += 1
                    self._notice_missing(key, example_inputs, name)
                    return compile_fn()
                if not self.become_builder(need_key=key):
                    fn = self.load(key, gm)  # another process built it meanwhile
                    if fn is not None:
                        return fn
                    self.counters["fallback"] += 1
                    return compile_fn()
            constants = constant_values(gm)
            try:
                artifact = self.builder.build_partition(key, gm, lift_constants(gm), constants, example_inputs,
                                                        self.patches, graph=self.current_graph, name=name)
            except Exception as exc:  # noqa: BLE001 - not buildable statically: the normal path compiles it
                self.counters["build_failed"] += 1
                warnings.warn(f"superkernel static kernels: could not build partition {name or key[:12]} ahead of "
                              f"time ({exception_summary(exc)}); compiling it the normal way", StaticKernelWarning,
                              stacklevel=4)
                return compile_fn()
            self.loaded_fns[key] = artifact
            return with_constants(artifact, constants)

    # -- CPU freezing: the build's measured choice, recorded beside the plain artifact ----------------
    def holds(self, key: str) -> bool:
        """Partition ``key`` comes from a package (the one in use or the one being extended). What this process
        builds does not count: every call site of it is measured (its weights are its own)."""
        self.check()
        with self.mutex:
            return key in self.builder.carried or (self.package is not None and key in self.package.artifacts)

    def _artifact_entry(self, key: str) -> dict[str, Any] | None:
        found = self.builder.new.get(key) or self.builder.carried.get(key)
        if found is not None:
            return found.entry
        return self.package.artifacts.get(key) if self.package is not None else None

    def freezing_choice(self, key: str, *, name: str | None = None) -> str | None:
        with self.mutex:
            entry = self._artifact_entry(key) or {}
            record = entry.get("freezing")
            choice = record.get("chosen") if isinstance(record, dict) else None
            if choice not in ("frozen", "plain"):
                return None
            if choice == "frozen" and key not in self._notified:
                self._notified.add(key)
                timings = record.get("timings_ms") if isinstance(record.get("timings_ms"), dict) else {}
                measured = ", ".join(f"{k} {v:.3f} ms" for k, v in timings.items() if isinstance(v, (int, float)))
                msg = (f"superkernel static kernels: partition {name or key[:12]}: the build chose the frozen "
                       f"variant{f' ({measured})' if measured else ''}; the package carries the plain kernel only "
                       "(a frozen kernel would carry the weights), so it runs plain here")
                self.notices.append(msg)
                log.warning(msg)
            return choice

    def record_freezing_choice(self, key: str, choice: str, timings_ms: dict[str, float]) -> None:
        with self.mutex:
            built = self.builder.new.get(key)
            if built is not None and "freezing" not in built.entry:  # (what this process builds; first call site)
                built.entry["freezing"] = {"chosen": choice,
                                           "timings_ms": {k: round(float(v), 4) for k, v in timings_ms.items()}}

    def _notice_missing(self, key: str, example_inputs: list[Any], name: str | None) -> None:
        topic = self.current_graph or key
        if topic in self._notified:  # one line per graph, not per partition
            return
        self._notified.add(topic)
        sig = input_signature(example_inputs) or []
        shapes = [("x".join(map(str, t["shape"])) or "scalar") for t in sig if isinstance(t, dict) and "shape" in t]
        graph = self.graphs.get(self.current_graph or "", {}).get("names", [])
        msg = (f"superkernel static kernels: shapes not in package "
               f"{self.package.path.name if self.package else '-'} (graph {', '.join(graph) or '?'}, "
               f"partition {name or key[:12]} inputs [{' '.join(shapes[:6])}{' ...' if len(shapes) > 6 else ''}]); "
               "compiling the missing partitions the normal way")
        self.notices.append(msg)
        log.warning(msg)

    # -- frames ---------------------------------------------------------------------------------
    def frame_bytes(self, key: str) -> tuple[dict[str, Any], bytes] | None:
        """A precompiled frame by key, from the package in use (or the one being built)."""
        self.check()
        with self.mutex:
            if self.package is not None and key in self.package.frames:
                return dict(self.package.frames[key]), self.package.frame_bytes(key)
            found = self.builder.frame(key)
            return (dict(found.entry), found.data) if found is not None else None

    def frames_of(self, function: str) -> list[dict[str, Any]]:
        """Manifest entries of the frames the package in use holds for ``function``."""
        with self.mutex:
            table = self.package.frames if self.package is not None else {}
            return [dict(e) for e in table.values() if e.get("function") == function]

    def add_frame(self, key: str, entry: dict[str, Any], data: bytes) -> None:
        with self.mutex:
            self.builder.add_frame(key, entry, data)

    # -- packaging --------------------------------------------------------------------------
    def finalize(self) -> Path | None:
        """Write a package if this process built something new (atomic); release the build lock."""
        with self.mutex:
            if self.deferred:
                return None
            if not self.builder.pending(self.holding):
                self.release()
                return None
            try:
                header = {"environment": self.env, "config_fingerprint": self.fingerprint,
                          "inductor_options": self.patches,
                          "records": str(self.recorder.dir) if self.recorder else None}
                path, pkg = self.builder.write(header, self.graphs)
            except Exception as exc:  # noqa: BLE001 - the run goes on with what it compiled
                self.counters["package_failed"] += 1
                warnings.warn(f"superkernel static kernels: could not write the package ({exception_summary(exc)})",
                              StaticKernelWarning, stacklevel=4)
                self.release()
                return None
            # the new package replaces what it extends, earlier ones of this process and corrupt ones
            self.store.retire(set(self.written), keep=path)
            self.written = [path]
            self.package = pkg
            self.loader.forget_install()
            self.release()
            return path


# --- one workspace per build dir, config and device kind, per process -------------------------

_WORKSPACES: dict[tuple[str, str, str, bool, bool], Workspace] = {}
_GUARD = threading.Lock()


def workspace(build_dir: Path, fingerprint: str, device_kind: str, patches: dict[str, Any],
              compiles: bool = True, native: bool = False) -> Workspace:
    key = (str(build_dir), fingerprint, device_kind, compiles, native)
    with _GUARD:
        ws = _WORKSPACES.get(key)
        if ws is None:
            ws = _WORKSPACES[key] = Workspace(build_dir, fingerprint, device_kind, patches, compiles, native)
        return ws


def reset_workspaces() -> None:
    """Forget all workspaces of this process (tests); releases held locks."""
    with _GUARD:
        for ws in _WORKSPACES.values():
            ws.release()
        _WORKSPACES.clear()


@atexit.register
def _finalize_all() -> None:
    """Write what is still pending, release locks, and remove the private build caches."""
    for ws in list(_WORKSPACES.values()):
        try:
            ws.finalize()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
        if ws.run_dir is not None:
            for leftover in (".inductor_cache", ".artifacts"):
                shutil.rmtree(ws.run_dir / leftover, ignore_errors=True)
