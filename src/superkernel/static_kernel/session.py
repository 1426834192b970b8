"""The static kernel session: the backend's hook for recording, building and loading.

The backend (``backend.py`` / ``realize.py``) calls, with static kernels enabled::

    session = open_session(compiler_config)
    session.record_graph(gm, name)                          # every captured ATen graph
    fn = session.compiled_partition(gm, example_inputs, compile_fn)   # every Inductor partition
    session.finalize()                                      # end of a graph's build

What happens, per build directory:

* **Load.** The newest package under ``<build_dir>/static_kernel_outputs/*/`` whose
  environment (torch, python, platform, device, capability) and compiler config match
  and whose files pass their sha256 checks is used: a partition whose key (content hash
  of code + input signature + config) is in it is loaded, not compiled
  (``counters["loaded"]``). Packages that do not match are ignored with a warning.
* **Build.** Without a usable package this process takes the build lock (other
  processes wait on it), records every operator's shapes, compiles each partition with
  ``torch._inductor.standalone_compile`` into a private Inductor cache directory
  (``counters["compiled"]``), and ``finalize`` writes one package atomically and
  releases the lock; waiting processes then find and load it.
* **Another graph** (model or code changed): the package is ignored with a warning and
  a new one is built that also carries the old one's artifacts.
* **Another shape** of a known graph (a batch size that was not built): that partition
  is compiled by the normal path, with a one-line notice (``counters["fallback"]``).
  ``extend=True`` (the ``static-compile`` command) builds it into a new package instead.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel.static_kernel import compat
from superkernel.static_kernel.package import (
    OUTPUTS_DIR, Package, PackageError, collect_kernels, environment, find_packages, install_kernels, now_iso,
    package_name, read_manifest, write_package,
)
from superkernel.util import exception_summary
from superkernel.pipeline.ir import device_kind, graph_device
from superkernel.static_kernel.records import ShapeRecorder
from superkernel.static_kernel.signature import (
    fetch_attr, graph_input_shapes, graph_structure_hash, input_signature,
    partition_key,
)
from superkernel.static_kernel.storage import build_lock

ENV_VERIFY = "SUPERKERNEL_STATIC_VERIFY"  # "0": skip the fresh-process load check at finalize
ENV_LOCK_TIMEOUT = "SUPERKERNEL_STATIC_LOCK_TIMEOUT"  # seconds to wait for another builder (default 3600)


class StaticKernelWarning(UserWarning):
    """A package was ignored (and why), or a static kernel could not be built or loaded."""


log = logging.getLogger("superkernel.static_kernel")


class BuildDirError(ValueError):
    """The static kernel build directory does not exist or is not writable."""


# --- configuration ---------------------------------------------------------------------

def default_build_dir() -> Path:
    """Next to the running script (TorchAir's default), else the working directory."""
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if script and script not in ("-c", "-m") and os.path.isfile(script):
        return Path(script).resolve().parent
    return Path.cwd()


def resolve_build_dir(build_dir: str | os.PathLike[str] | None) -> Path:
    path = Path(build_dir).expanduser() if build_dir else default_build_dir()
    if not path.is_dir():
        raise BuildDirError(
            f"static kernel build_dir {str(path)!r} does not exist; create it first "
            "(config.experimental_config.static_kernel.build_dir / --build-dir)")
    if not os.access(path, os.W_OK | os.X_OK):
        raise BuildDirError(f"static kernel build_dir {str(path)!r} is not writable by this user")
    return path.resolve()


def inductor_patches(compiler_config: Any, device_kind: str) -> dict[str, Any]:
    """The TorchInductor options a static build uses: those of runtime/inductor.compile_partition, plus one.

    ``cpp_cache_precompile_headers`` is off: the precompiled-header flag enters the kernel's
    cache name, and a precompiled header would itself have to be compiled at load time.
    """
    from superkernel.runtime.inductor import inductor_patches as partition_patches

    inductor = getattr(compiler_config, "inductor", None)
    patches = partition_patches(device_kind, cpp_wrapper=bool(getattr(inductor, "cpp_wrapper", True)),
                                autotune=bool(getattr(inductor, "autotune", False)))
    patches["cpp_cache_precompile_headers"] = False
    return patches


def config_fingerprint(compiler_config: Any, device_kind: str) -> str:
    base = compiler_config.fingerprint() if hasattr(compiler_config, "fingerprint") else "none"
    patches = json.dumps(inductor_patches(compiler_config, device_kind), sort_keys=True)
    import hashlib

    return f"{base}-{hashlib.sha256(patches.encode()).hexdigest()[:8]}"


# --- helpers ---------------------------------------------------------------------------

def materialize(value: Any) -> Any:
    """A real tensor with the (fake) tensor's size, stride, dtype and device; other values unchanged."""
    if not isinstance(value, torch.Tensor):
        return value
    with compat.unset_fake_mode():
        shape = [int(s) for s in value.shape]
        stride = [int(s) for s in value.stride()]
        offset = int(value.storage_offset())
        if offset == 0:
            out = torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
        else:
            span = 1 + sum((s - 1) * st for s, st in zip(shape, stride) if s > 0)
            base = torch.empty(offset + span, dtype=value.dtype, device=value.device)
            out = base.as_strided(shape, stride, offset)
        if out.dtype.is_floating_point or out.dtype.is_complex:
            out.zero_()
        return out


def constant_values(gm: fx.GraphModule) -> list[torch.Tensor]:
    """The tensors ``gm`` reads as attributes, in graph order ([] unless every attribute is a tensor)."""
    values = [fetch_attr(gm, str(n.target)) for n in gm.graph.nodes if n.op == "get_attr"]
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        return []
    return [v.detach() for v in values]


def lift_constants(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` with its tensor get_attr nodes turned into trailing placeholders (values stay out
    of the package), matching :func:`constant_values`; ``gm`` itself when there are none.

    A standalone artifact compiled with tensor attributes expects them as arguments when
    loaded; lifting makes that explicit, and weights are passed from this process at run time.
    """
    if not constant_values(gm):
        return gm
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr"]
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in placeholders:
        env[node] = graph.node_copy(node, lambda n: env[n])
    for i, node in enumerate(attrs):
        ph = graph.placeholder(f"_sk_const_{i}")
        ph.meta = dict(node.meta)
        env[node] = ph
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    return fx.GraphModule(torch.nn.Module(), graph, class_name=type(gm).__name__)


def _call_compile_fn(compile_fn: Callable[..., Any], gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    import inspect

    try:
        params = [p for p in inspect.signature(compile_fn).parameters.values()
                  if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return compile_fn(gm, example_inputs) if len(params) >= 2 else compile_fn()


def _with_constants(fn: Callable[..., Any], constants: list[torch.Tensor]) -> Callable[..., Any]:
    if not constants:
        return fn

    def run(*args: Any) -> Any:
        return fn(*args, *constants)

    return run


@dataclass
class _Artifact:
    entry: dict[str, Any]
    data: bytes


# --- per build directory state ----------------------------------------------------------

class _BuildState:
    """Everything one process knows about one build directory (shared by its sessions)."""

    def __init__(self, build_dir: Path, fingerprint: str, device_kind: str, patches: dict[str, Any],
                 compiles: bool = True) -> None:
        self.build_dir = build_dir
        self.compiles = compiles  # False: reduce-overhead / run_eagerly, nothing to build: record only, no lock
        self.root = build_dir / OUTPUTS_DIR
        self.fingerprint = fingerprint
        self.device_kind = device_kind
        self.patches = patches
        self.env = environment(device_kind)
        self.counters: Counter[str] = Counter()
        self.mutex = threading.RLock()
        self.lock = build_lock(self.root)
        self.holding = False
        self.checked = False
        self.package: Package | None = None
        self.carried: dict[str, _Artifact] = {}
        self.carried_graphs: dict[str, Any] = {}
        self.carried_from: Package | None = None
        self.new: dict[str, _Artifact] = {}
        self.carried_frames: dict[str, _Artifact] = {}
        self.new_frames: dict[str, _Artifact] = {}
        self.deferred = 0  # > 0: a frame is being built; finalize waits for it
        self.graphs: dict[str, dict[str, Any]] = {}
        self.rejected: dict[Path, str] = {}
        self.superseded: set[Path] = set()
        self.written: list[Path] = []
        self.loaded_fns: dict[str, Callable[..., Any]] = {}
        self.kernels_installed: Path | None = None
        self.run_dir: Path | None = None
        self.recorder: ShapeRecorder | None = None
        self._notified: set[str] = set()
        self.notices: list[str] = []
        self.current_graph: str | None = None
        self._probe: threading.Thread | None = None

    # -- where things go ------------------------------------------------------------------
    def ensure_run_dir(self) -> Path:
        if self.run_dir is None:
            stamp = _dt.datetime.now().strftime("%Y%m%d%H%M%S%f")
            pid = os.getpid()
            self.run_dir = self.root / f"{stamp}_{pid}_outputs"
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.recorder = ShapeRecorder(self.run_dir, pid)
        return self.run_dir

    @property
    def staging(self) -> Path:
        """Private TorchInductor cache dir of this build (kernels land here, then in the package)."""
        path = self.ensure_run_dir() / ".inductor_cache"
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- choosing a package ---------------------------------------------------------------
    def _usable_packages(self, need_graph: str | None = None, need_key: str | None = None) -> Package | None:
        """Newest package that matches here and passes its hash check (warns once per rejected package)."""
        for path in find_packages(self.build_dir):
            if path in self.rejected:
                continue
            if self.package is not None and path == self.package.path:
                pkg = self.package
            else:
                try:
                    pkg = read_manifest(path)
                except PackageError as exc:
                    self._reject(path, str(exc))
                    continue
                if pkg.manifest.get("environment", {}).get("device_kind") != self.device_kind:
                    continue  # a package for another device kind (CPU vs CUDA): not ours, not wrong
                reason = pkg.mismatch(self.env, self.fingerprint)
                if reason is not None:
                    self._reject(path, reason)
                    continue
            if need_graph is not None and need_graph not in pkg.graphs:
                continue
            if need_key is not None and need_key not in pkg.artifacts:
                continue
            if not pkg.verified:
                try:
                    pkg.verify()
                except PackageError as exc:
                    self._reject(path, str(exc), corrupt=True)
                    continue
            return pkg
        return None

    def _reject(self, path: Path, reason: str, *, corrupt: bool = False) -> None:
        if path in self.rejected:
            return
        self.rejected[path] = reason
        self.counters["packages_ignored"] += 1
        if corrupt:
            self.superseded.add(path)
        warnings.warn(f"superkernel static kernels: ignoring package {path}: {reason}; "
                      "a fresh build replaces it", StaticKernelWarning, stacklevel=4)

    def prewarm(self) -> None:
        """Adopt a usable package early (no lock taken) and start TorchInductor's CPU-ISA probe.

        Called when the backend is created, before Dynamo traces: the probe (one short
        subprocess per vector ISA, which every load of a CPU kernel needs once per process)
        then runs on another core while the graph is being captured.
        """
        with self.mutex:
            if self.checked or not self.compiles:
                return
            pkg = self._usable_packages()
            if pkg is None:
                return  # check() decides later (and may build)
            self.checked = True
            self.package = pkg
            try:
                self._install(pkg)
            except Exception:  # noqa: BLE001 - the load path reports problems
                return
            if self.device_kind == "cpu" and self._probe is None:
                self._probe = threading.Thread(target=_probe_vec_isa, name="superkernel-isa-probe", daemon=True)
                self._probe.start()

    def _install(self, pkg: Package) -> None:
        if self.kernels_installed != pkg.path:
            self.counters["kernels_installed"] += install_kernels(pkg, compat.inductor_cache_dir())
            self.kernels_installed = pkg.path

    def check(self) -> None:
        """Decide once: load a usable package, or become the builder (waiting for one first)."""
        with self.mutex:
            if self.checked:
                return
            self.checked = True
            if not self.compiles:
                return
            pkg = self._usable_packages()
            if pkg is not None:
                self.package = pkg
                return
            self.become_builder()

    def acquire(self) -> bool:
        """Take the build lock (waiting for another builder); False on timeout."""
        if self.holding:
            return True
        timeout = float(os.environ.get(ENV_LOCK_TIMEOUT, "3600"))
        try:
            self.lock.acquire(timeout=0.05)
        except Exception:  # noqa: BLE001 - filelock.Timeout: someone else is building
            world = os.environ.get("LOCAL_WORLD_SIZE")
            rank = os.environ.get("LOCAL_RANK")
            who = f" (LOCAL_RANK {rank} of LOCAL_WORLD_SIZE {world})" if world else ""
            print(f"superkernel static kernels: another process is building in {self.root}; waiting{who}",
                  file=sys.stderr, flush=True)
            start = time.monotonic()
            try:
                self.lock.acquire(timeout=timeout)
            except Exception:  # noqa: BLE001
                warnings.warn(f"superkernel static kernels: gave up waiting {timeout:.0f}s for the build lock "
                              f"{self.lock.lock_file}; compiling without static kernels", StaticKernelWarning,
                              stacklevel=4)
                return False
            self.counters["waited_for_lock"] += 1
            self.counters["lock_wait_ms"] += int((time.monotonic() - start) * 1000)
        self.holding = True
        return True

    def release(self) -> None:
        if self.holding:
            self.holding = False
            try:
                self.lock.release()
            except Exception:  # noqa: BLE001 - already released by the OS
                pass

    def become_builder(self, need_graph: str | None = None, need_key: str | None = None) -> bool:
        """Hold the lock so this process builds; adopts a newer package that already has what is needed."""
        if self.holding:
            return True
        if not self.acquire():
            return False
        newest = self._usable_packages(need_graph=need_graph, need_key=need_key)
        if newest is not None and (need_graph is not None or need_key is not None or self.package is None):
            self.package = newest
            self.release()
            return False
        if self.package is not None and self.carried_from is not self.package:
            # extend: the new package keeps everything the current one holds
            self.carried_from = self.package
            self.superseded.add(self.package.path)
            for key, entry in self.package.artifacts.items():
                self.carried[key] = _Artifact(dict(entry), self.package.artifact_bytes(key))
            for key, entry in self.package.frames.items():
                self.carried_frames[key] = _Artifact(dict(entry), self.package.frame_bytes(key))
            for h, g in self.package.graphs.items():
                self.carried_graphs[h] = g
        return True

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
            if not self.holding and self.package is not None and h not in self.package.graphs and h not in self.carried_graphs:
                old = self.package
                if self.become_builder(need_graph=h) and old.path not in self.written:  # (own package: next graph)
                    warnings.warn(
                        f"superkernel static kernels: package {old.path} was built for other graphs "
                        f"(graph {graph_name!r} is not in it: model, code or config changed); "
                        "building a new package that replaces it", StaticKernelWarning, stacklevel=3)
            if self.holding or not self.compiles:
                self.ensure_run_dir()
                assert self.recorder is not None
                self.counters["records"] += self.recorder.record_graph(gm, graph_name, h)
                g["record_dir"] = str(self.recorder.dir)

    # -- partitions -------------------------------------------------------------------------
    def compiled_partition(self, key: str, gm: fx.GraphModule, example_inputs: list[Any],
                           compile_fn: Callable[..., Any], *, extend: bool, name: str | None) -> Callable[..., Any]:
        self.check()
        with self.mutex:
            constants = constant_values(gm)  # the graph copy with them lifted is made only to build
            fn = self.loaded_fns.get(key)
            if fn is not None:  # same code and shapes seen before in this process (weights are per call site)
                self.counters["reused"] += 1
                return _with_constants(fn, constants)
            if self.package is not None and key in self.package.artifacts:
                fn = self._load(key, self.package)
                if fn is not None:
                    return _with_constants(self._remember(key, fn), constants)
            if key in self.carried:  # extending a package: its artifacts load as well
                fn = self._load_bytes(key, self.carried[key].data, self.carried_from)
                if fn is not None:
                    return _with_constants(self._remember(key, fn), constants)
            if not self.holding:
                wanted = extend or self.package is None
                if not wanted:
                    self.counters["fallback"] += 1
                    topic = self.current_graph or key
                    if topic not in self._notified:  # one line per graph, not per partition
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
                    return _call_compile_fn(compile_fn, gm, example_inputs)
                if not self.become_builder(need_key=key):
                    if self.package is not None and key in self.package.artifacts:
                        fn = self._load(key, self.package)
                        if fn is not None:
                            return _with_constants(self._remember(key, fn), constants)
                    self.counters["fallback"] += 1
                    return _call_compile_fn(compile_fn, gm, example_inputs)
            return self._build(key, gm, lift_constants(gm), constants, example_inputs, compile_fn, name)

    def _remember(self, key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.loaded_fns[key] = fn
        return fn

    def _build(self, key: str, gm: fx.GraphModule, lifted: fx.GraphModule, constants: list[torch.Tensor],
               example_inputs: list[Any], compile_fn: Callable[..., Any], name: str | None) -> Callable[..., Any]:
        staging = self.staging
        start = time.perf_counter()
        try:
            inputs = [materialize(v) for v in example_inputs] + constants
            with compat.inductor_cache_dir_at(str(staging)):
                artifact = compat.standalone_compile(lifted, inputs, self.patches)
                path = staging.parent / ".artifacts" / f"{key}.bin"
                path.parent.mkdir(parents=True, exist_ok=True)
                artifact.save(path=str(path), format="binary")
            data = path.read_bytes()
        except Exception as exc:  # noqa: BLE001 - not buildable statically: the normal path compiles it
            self.counters["build_failed"] += 1
            warnings.warn(f"superkernel static kernels: could not build partition {name or key[:12]} ahead of time "
                          f"({exception_summary(exc)}); compiling it the normal way", StaticKernelWarning, stacklevel=4)
            return _call_compile_fn(compile_fn, gm, example_inputs)
        seconds = time.perf_counter() - start
        self.counters["compiled"] += 1
        graph_hash = self.current_graph
        self.new[key] = _Artifact({
            "file": f"artifacts/{key}.bin", "partition": name, "graph": graph_hash,
            "inputs": input_signature(example_inputs), "constants": len(constants),
            "num_ops": sum(1 for n in gm.graph.nodes if n.op == "call_function"),
            "compile_seconds": round(seconds, 3),
        }, data)
        return _with_constants(self._remember(key, artifact), constants)

    def _load(self, key: str, pkg: Package) -> Callable[..., Any] | None:
        return self._load_bytes(key, pkg.artifact_bytes(key), pkg)

    def _load_bytes(self, key: str, data: bytes, pkg: Package | None) -> Callable[..., Any] | None:
        if self._probe is not None:
            self._probe.join(timeout=120)  # started at prewarm: don't probe twice
        try:
            if pkg is not None:
                self._install(pkg)
            with tempfile.TemporaryDirectory(prefix="sk_artifact_") as tmp:
                path = os.path.join(tmp, f"{key}.bin")
                with open(path, "wb") as f:
                    f.write(data)
                fn = compat.load_artifact(path)
        except Exception as exc:  # noqa: BLE001 - a package never crashes the run
            self.counters["load_failed"] += 1
            where = pkg.path.name if pkg is not None else "package"
            warnings.warn(f"superkernel static kernels: could not load {key[:12]} from {where} "
                          f"({exception_summary(exc)}); building it again", StaticKernelWarning, stacklevel=4)
            return None
        self.counters["loaded"] += 1
        return fn

    # -- frames ---------------------------------------------------------------------------------
    def frame_bytes(self, key: str) -> tuple[dict[str, Any], bytes] | None:
        """A precompiled frame by key, from the package in use (or the one being extended)."""
        self.check()
        with self.mutex:
            if self.package is not None and key in self.package.frames:
                return dict(self.package.frames[key]), self.package.frame_bytes(key)
            for table in (self.new_frames, self.carried_frames):
                if key in table:
                    return dict(table[key].entry), table[key].data
        return None

    def frames_of(self, function: str) -> list[dict[str, Any]]:
        """Manifest entries of the frames the package in use holds for ``function``."""
        with self.mutex:
            table = self.package.frames if self.package is not None else {}
            return [dict(e) for e in table.values() if e.get("function") == function]

    def add_frame(self, key: str, entry: dict[str, Any], data: bytes) -> None:
        with self.mutex:
            self.new_frames[key] = _Artifact({**entry, "file": f"frames/{key}.bin"}, data)
            self.counters["frames_built"] += 1

    # -- packaging --------------------------------------------------------------------------
    def finalize(self) -> Path | None:
        with self.mutex:
            if self.deferred:
                return None
            if not self.new and not (self.new_frames and self.holding):
                self.release()
                return None
            try:
                path = self._write_package()
            except Exception as exc:  # noqa: BLE001 - the run goes on with what it compiled
                self.counters["package_failed"] += 1
                warnings.warn(f"superkernel static kernels: could not write the package ({exception_summary(exc)})",
                              StaticKernelWarning, stacklevel=3)
                self.release()
                return None
            self.release()
            return path

    def _write_package(self) -> Path:
        staging = self.staging
        artifacts = {**self.carried, **self.new}
        frames = {**self.carried_frames, **self.new_frames}
        if self.carried_from is not None and self.carried_from.verified:
            install_kernels(self.carried_from, str(staging))
        files = {a.entry["file"]: a.data for a in artifacts.values()}
        if os.environ.get(ENV_VERIFY, "1") != "0":
            self._load_check(staging, files)
        files.update(collect_kernels(staging))
        files.update({f.entry["file"]: f.data for f in frames.values()})
        graphs = {h: {"names": list(g.get("names", [])), "variants": list(g.get("variants", []))}
                  for h, g in self.carried_graphs.items()}
        for h, g in self.graphs.items():
            merged = graphs.setdefault(h, {"names": [], "variants": []})
            merged["names"] = sorted(set(merged["names"]) | set(g["names"]))
            for v in g["variants"]:
                if v not in merged["variants"]:
                    merged["variants"].append(v)
        from superkernel import __version__

        manifest = {
            "created": now_iso(),
            "created_by": {"pid": os.getpid(), "superkernel": __version__,
                           "records": str(self.recorder.dir) if self.recorder else None},
            "environment": self.env,
            "config_fingerprint": self.fingerprint,
            "inductor_options": self.patches,
            "graphs": graphs,
            "artifacts": {k: a.entry for k, a in sorted(artifacts.items())},
            "frames": {k: f.entry for k, f in sorted(frames.items())},
        }
        run_dir = self.ensure_run_dir()
        path = write_package(run_dir / package_name(), manifest, files)
        self.counters["packages_written"] += 1
        # the new package replaces what it extends, earlier ones of this process and corrupt ones
        for old in sorted(self.superseded | set(self.written)):
            if old != path:
                try:
                    old.unlink()
                except OSError:
                    pass
        self.superseded.clear()
        self.written = [path]
        pkg = read_manifest(path)
        pkg.files = files
        pkg.verified = True
        self.package = pkg
        self.carried = {k: _Artifact(dict(a.entry), a.data) for k, a in artifacts.items()}
        self.carried_graphs = graphs
        self.carried_frames = {k: _Artifact(dict(f.entry), f.data) for k, f in frames.items()}
        self.carried_from = pkg
        self.new = {}
        self.new_frames = {}
        self.kernels_installed = None
        return path

    def _load_check(self, staging: Path, files: dict[str, bytes]) -> None:
        """Load every artifact in a fresh interpreter against the staging cache.

        Proves the package loads in a new process, and makes TorchInductor build its CPU-ISA
        probe libraries into the staging cache, so the package carries them too (a fresh
        process with an empty Inductor cache then compiles nothing at all).
        """
        paths = []
        for key_file, data in files.items():
            p = staging.parent / ".artifacts" / Path(key_file).name
            if not p.exists():
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
            paths.append(str(p))
        env = dict(os.environ)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(staging)
        env.pop(ENV_VERIFY, None)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the superkernel package
        env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else root
        cmd = [sys.executable, "-m", "superkernel.static_kernel._loadcheck", *paths]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            failed = proc.returncode != 0
            detail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
        except (OSError, subprocess.SubprocessError) as exc:
            failed, detail = True, exception_summary(exc)
        if failed:  # the package is still right; a later process may have to build Inductor's ISA probe itself
            self.counters["load_check_failed"] += 1
            warnings.warn(f"superkernel static kernels: fresh-process load check of the package failed ({detail}); "
                          "writing it anyway (a process that cannot load an artifact compiles that partition)",
                          StaticKernelWarning, stacklevel=4)
            return
        self.counters["load_checked"] += len(paths)


def _probe_vec_isa() -> None:
    """TorchInductor's CPU vector-ISA probe, the candidate ISAs side by side.

    Each candidate costs a few short subprocesses (build, then dlopen, a test library);
    Inductor runs them one after another. Probing the candidates in parallel threads fills
    its cache of results first, so its own ``pick_vec_isa`` then only reads it.
    """
    try:
        from torch._inductor import cpu_vec_isa

        candidates = list(getattr(cpu_vec_isa, "supported_vec_isa_list", []))
        checker = getattr(cpu_vec_isa, "x86_isa_checker", None)
        if checker is not None and platform.machine() in ("x86_64", "AMD64"):
            flags = set(checker())
            candidates = [isa for isa in candidates if all(f in flags for f in str(isa).split())]
        threads = [threading.Thread(target=bool, args=(isa,), daemon=True) for isa in candidates]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        cpu_vec_isa.pick_vec_isa()
    except Exception:  # noqa: BLE001 - the main thread probes again and reports
        pass


_STATES: dict[tuple[str, str, str, bool], _BuildState] = {}
_STATES_GUARD = threading.Lock()


def _state(build_dir: Path, fingerprint: str, device_kind: str, patches: dict[str, Any],
           compiles: bool = True) -> _BuildState:
    key = (str(build_dir), fingerprint, device_kind, compiles)
    with _STATES_GUARD:
        state = _STATES.get(key)
        if state is None:
            state = _BuildState(build_dir, fingerprint, device_kind, patches, compiles)
            _STATES[key] = state
        return state


@atexit.register
def _finalize_all() -> None:
    """Write what is still pending, release locks, and remove the private build caches."""
    import shutil

    for state in list(_STATES.values()):
        try:
            state.finalize()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
        if state.run_dir is not None:
            for leftover in (".inductor_cache", ".artifacts"):
                shutil.rmtree(state.run_dir / leftover, ignore_errors=True)


# --- the hook --------------------------------------------------------------------------

class StaticKernelSession:
    """The backend's static kernel hook (one per backend; state is shared per build dir)."""

    def __init__(self, static_cfg: Any, compiler_fingerprint: str | None = None, device_kind: str | None = None, *,
                 compiler_config: Any = None, extend: bool = False) -> None:
        self.static_cfg = static_cfg
        self.build_dir = resolve_build_dir(getattr(static_cfg, "build_dir", None))
        self.compiler_config = compiler_config
        self._fingerprint = compiler_fingerprint
        self.device_kind = device_kind
        self.extend = extend
        self._states: dict[str, _BuildState] = {}
        if device_kind in (None, "cpu") and os.environ.get("SUPERKERNEL_STATIC_PREWARM", "1") != "0":
            try:
                if find_packages(self.build_dir):
                    self._state_for("cpu").prewarm()
            except Exception:  # noqa: BLE001 - an optimization only; first use checks again
                pass

    # -- state per device ---------------------------------------------------------------------
    def _state_for(self, device_kind: str) -> _BuildState:
        state = self._states.get(device_kind)
        if state is None:
            patches = inductor_patches(self.compiler_config, device_kind)
            if self.compiler_config is not None:
                fingerprint = config_fingerprint(self.compiler_config, device_kind)
            else:
                import hashlib

                extra = hashlib.sha256(json.dumps(patches, sort_keys=True).encode()).hexdigest()[:8]
                fingerprint = f"{self._fingerprint or 'none'}-{extra}"
            cfg = self.compiler_config
            compiles = cfg is None or (getattr(cfg, "mode", "max-autotune") == "max-autotune"
                                       and not getattr(getattr(cfg, "debug", None), "run_eagerly", False))
            state = _state(self.build_dir, fingerprint, device_kind, patches, compiles)
            self._states[device_kind] = state
        return state

    def state_for_call(self, fn: Any, args: tuple[Any, ...]) -> _BuildState:
        """The build-dir state a call of ``fn`` with ``args`` uses (by the call's device kind)."""
        from superkernel.static_kernel.function import device_kind_of_call

        return self._state_for(self.device_kind or device_kind_of_call(fn, args))

    @property
    def counters(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for state in self._states.values():
            total.update(state.counters)
        return total

    @property
    def package(self) -> Package | None:
        for state in self._states.values():
            if state.package is not None:
                return state.package
        return None

    @property
    def notices(self) -> list[str]:
        """One-line notices of this session (shapes that were not in the package)."""
        return [n for s in self._states.values() for n in s.notices]

    @property
    def packages_written(self) -> list[Path]:
        """Packages this process wrote (the newest replaces earlier ones) that still exist."""
        return [p for s in self._states.values() for p in s.written if p.exists()]

    @property
    def run_dirs(self) -> list[Path]:
        return [s.run_dir for s in self._states.values() if s.run_dir is not None]

    # -- hook API -------------------------------------------------------------------------------
    def record_graph(self, gm: fx.GraphModule, graph_name: str, device: str | None = None) -> None:
        """``device``: the graph's device kind when the caller already knows it (else read from the graph)."""
        kind = self.device_kind or device or graph_device(gm)
        self._state_for(kind).record_graph(gm, graph_name)

    def compiled_partition(self, *args: Any, key: str | None = None, name: str | None = None) -> Callable[..., Any]:
        """``compiled_partition(gm, example_inputs, compile_fn)`` (or ``(key, gm, example_inputs, compile_fn)``).

        ``compile_fn`` is the normal compile path, called with no arguments or with
        ``(gm, example_inputs)``; it runs when the partition cannot be static (symbolic
        shapes) or is not in the package. Returns ``fn(*args)`` like the normal path.
        """
        if args and isinstance(args[0], str):
            key, args = args[0], args[1:]
        gm, example_inputs, compile_fn = args
        kind = self.device_kind or device_kind(example_inputs)
        state = self._state_for(kind)
        computed = partition_key(gm, list(example_inputs), state.fingerprint)
        if computed is None:
            state.counters["dynamic"] += 1
            return _call_compile_fn(compile_fn, gm, list(example_inputs))
        return state.compiled_partition(computed, gm, list(example_inputs), compile_fn, extend=self.extend,
                                        name=name or getattr(gm, "_sk_partition_name", None))

    def finalize(self) -> Path | None:
        """Write a package if this process built something new (atomic); release the build lock."""
        written = None
        for state in self._states.values():
            path = state.finalize()
            written = path or written
        return written

    def key(self, gm: fx.GraphModule, example_inputs: list[Any]) -> str | None:
        """The package key of a partition (see :func:`superkernel.static_kernel.signature.partition_key`)."""
        kind = self.device_kind or device_kind(example_inputs)
        return partition_key(gm, list(example_inputs), self._state_for(kind).fingerprint)


def open_session(compiler_config: Any, *, extend: bool = False) -> StaticKernelSession:
    """The session for a backend built from ``compiler_config`` (static kernels enabled)."""
    static_cfg = compiler_config.experimental_config.static_kernel
    fingerprint = compiler_config.fingerprint() if hasattr(compiler_config, "fingerprint") else None
    return StaticKernelSession(static_cfg, fingerprint, compiler_config=compiler_config, extend=extend)


def reset_states() -> None:
    """Forget all per-build-dir state of this process (tests); releases held locks."""
    with _STATES_GUARD:
        for state in _STATES.values():
            state.release()
        _STATES.clear()


__all__ = ["BuildDirError", "StaticKernelSession", "StaticKernelWarning", "open_session",
           "resolve_build_dir", "reset_states"]
