"""Building a package: compile partitions ahead of time, collect frames, write the zip.

A :class:`Builder` belongs to one build directory of one process. It holds what the next
package will contain — artifacts, frames and native CPU modules carried over from the package
it extends, and the ones built here — and writes them with the kernel libraries of its private
TorchInductor cache (``<run_dir>/.inductor_cache``) as one package, atomically.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx

from superkernel.ir.graph import device_kind
from superkernel.static_kernel import compat, isa_probes
from superkernel.static_kernel.constants import materialize
from superkernel.static_kernel.loader import install_kernels
from superkernel.static_kernel.manifest import valid_member_name
from superkernel.static_kernel.package import Package, now_iso, package_name, read_manifest, write_package
from superkernel.static_kernel.settings import ENV_VERIFY, StaticKernelWarning
from superkernel.static_kernel.signature import input_signature
from superkernel.util import atomic_write, child_env, exception_summary, make_dirs


@dataclass
class Artifact:
    """One package member with its manifest entry: a compiled partition or a frame."""

    entry: dict[str, Any]
    data: bytes


class Builder:
    """The content of the next package of one build directory, and writing it."""

    def __init__(self, run_dir: Callable[[], Path], counters: Counter[str]) -> None:
        self._run_dir = run_dir  # created on first use
        self.counters = counters
        self.carried: dict[str, Artifact] = {}
        self.carried_frames: dict[str, Artifact] = {}
        self.carried_graphs: dict[str, Any] = {}
        self.carried_from: Package | None = None
        self.new: dict[str, Artifact] = {}
        self.new_frames: dict[str, Artifact] = {}
        self.carried_native: dict[str, Artifact] = {}
        self.new_native: dict[str, Artifact] = {}  # native CPU modules (.native), by source key

    @property
    def staging(self) -> Path:
        """Private TorchInductor cache dir of this build (kernels land here, then in the package)."""
        path = self._run_dir() / ".inductor_cache"
        if not path.is_dir():
            make_dirs(path, "static kernel staging cache")
            self._isa_probes(isa_probes.seed, "isa_probes_seeded", path)  # (TorchInductor loads them, not builds)
        return path

    def carry(self, pkg: Package) -> None:
        """Extend ``pkg``: the next package keeps everything it holds."""
        if self.carried_from is pkg:
            return
        self.carried_from = pkg
        for key, entry in pkg.artifacts.items():
            self.carried[key] = Artifact(dict(entry), pkg.artifact_bytes(key))
        for key, entry in pkg.frames.items():
            self.carried_frames[key] = Artifact(dict(entry), pkg.frame_bytes(key))
        for key, entry in pkg.native.items():
            self.carried_native[key] = Artifact(dict(entry), pkg.native_bytes(key))
        self.carried_graphs.update(pkg.graphs)

    def frame(self, key: str) -> Artifact | None:
        return self.new_frames.get(key) or self.carried_frames.get(key)

    def add_frame(self, key: str, entry: dict[str, Any], data: bytes) -> None:
        self.new_frames[key] = Artifact({**entry, "file": f"frames/{key}.bin"}, data)
        self.counters["frames_built"] += 1

    def build_partition(self, key: str, gm: fx.GraphModule, lifted: fx.GraphModule, constants: list[torch.Tensor],
                        example_inputs: list[Any], patches: dict[str, Any], *, graph: str | None,
                        name: str | None) -> Any:
        """Compile one partition with ``standalone_compile`` into the staging cache; the loaded artifact.

        Raises whatever TorchInductor raises (the caller compiles the normal way then).
        """
        from superkernel.runtime.inductor.compile import build_tweaks, graph_rewrites

        staging = self.staging
        start = time.perf_counter()
        inputs = [materialize(v) for v in example_inputs] + constants
        rewrites = graph_rewrites(lifted, device_kind(inputs))  # what compile_partition does first, the same here
        with compat.inductor_cache_dir_at(str(staging)), build_tweaks():
            artifact = compat.standalone_compile(lifted, inputs, patches)
            path = staging.parent / ".artifacts" / f"{key}.bin"
            make_dirs(path.parent, "static kernel artifact folder")
            artifact.save(path=str(path), format="binary")
        data = path.read_bytes()
        self.counters["compiled"] += 1
        self.new[key] = Artifact({
            "file": f"artifacts/{key}.bin", "partition": name, "graph": graph,
            "inputs": input_signature(example_inputs), "constants": len(constants),
            "num_ops": sum(1 for n in gm.graph.nodes if n.op == "call_function"),
            "compile_seconds": round(time.perf_counter() - start, 3),
        }, data)
        self.counters["rewrites"] += len(rewrites)
        return artifact

    def pending(self, holding: bool) -> bool:
        """Whether there is something new to write (new frames count only for the lock holder)."""
        return bool(self.new) or bool(self.new_native) or bool(self.new_frames and holding)

    def write(self, header: dict[str, Any], graphs: dict[str, dict[str, Any]]) -> tuple[Path, Package]:
        """Write the package (``header``: environment, fingerprint, options); returns its path and the
        in-memory, verified :class:`Package`. What was new is carried from then on."""
        staging = self.staging
        artifacts = {**self.carried, **self.new}
        frames = {**self.carried_frames, **self.new_frames}
        native = {**self.carried_native, **self.new_native}
        if self.carried_from is not None and self.carried_from.verified:
            install_kernels(self.carried_from, str(staging))
        files = {a.entry["file"]: a.data for a in artifacts.values()}
        if files and os.environ.get(ENV_VERIFY, "1") != "0":
            self._load_check(staging, files)
        self._isa_probes(isa_probes.keep, "isa_probes_kept", staging)
        files.update(collect_kernels(staging))
        files.update({f.entry["file"]: f.data for f in frames.values()})
        files.update({n.entry["file"]: n.data for n in native.values()})
        merged = {h: {"names": list(g.get("names", [])), "variants": list(g.get("variants", []))}
                  for h, g in self.carried_graphs.items()}
        for h, g in graphs.items():
            into = merged.setdefault(h, {"names": [], "variants": []})
            into["names"] = sorted(set(into["names"]) | set(g["names"]))
            into["variants"] += [v for v in g["variants"] if v not in into["variants"]]
        from superkernel import __version__

        manifest = {
            "created": now_iso(),
            "created_by": {"pid": os.getpid(), "superkernel": __version__, "records": header.pop("records", None)},
            **header,
            "graphs": merged,
            "artifacts": {k: a.entry for k, a in sorted(artifacts.items())},
            "frames": {k: f.entry for k, f in sorted(frames.items())},
            "native": {k: n.entry for k, n in sorted(native.items())},
        }
        path = write_package(self._run_dir() / package_name(), manifest, files)
        self.counters["packages_written"] += 1
        pkg = read_manifest(path)
        pkg.files = files
        pkg.verified = True
        self.carried, self.carried_frames, self.carried_native = artifacts, frames, native
        self.carried_graphs, self.carried_from = merged, pkg
        self.new, self.new_frames, self.new_native = {}, {}, {}
        return path, pkg

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
                make_dirs(p.parent, "static kernel artifact folder")
                atomic_write(p, data)
            paths.append(str(p))
        env = child_env()
        env["TORCHINDUCTOR_CACHE_DIR"] = str(staging)
        env.pop(ENV_VERIFY, None)
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
                          StaticKernelWarning, stacklevel=5)
            return
        self.counters["load_checked"] += len(paths)

    def _isa_probes(self, use: Callable[[Path], int], counter: str, staging: Path) -> None:
        """Seed the staging cache from, or keep its probes in, this user's ISA probe store (:mod:`isa_probes`)."""
        try:
            self.counters[counter] += use(staging)
        except isa_probes.STORE_ERRORS:
            pass  # (without the store, TorchInductor compiles its probes in each build, as it would anyway)


def collect_kernels(cache_dir: Path) -> dict[str, bytes]:
    """Kernel libraries in an Inductor cache dir, as ``kernels/<xx>/<name>`` -> bytes (valid names only)."""
    out: dict[str, bytes] = {}
    root = Path(cache_dir)
    if not root.is_dir():
        return out
    for sub in sorted(root.iterdir()):
        if not sub.is_dir() or sub.is_symlink():
            continue
        for f in sorted(sub.iterdir()):
            name = f"kernels/{sub.name}/{f.name}"
            if f.is_file() and not f.is_symlink() and valid_member_name(name):
                out[name] = f.read_bytes()
    return out
