"""Loading compiled partitions from a package: kernel libraries first, then the artifact.

TorchInductor's artifact (``CompiledArtifact.save``) holds the FX graph and AOTAutograd
cache entries but, on CPU, not the compiled C++ libraries; the package carries those, and
they are installed where Inductor's loader looks before it would compile. Also here:
TorchInductor's CPU-ISA probe, started early on another thread.
"""

from __future__ import annotations

import os
import platform
import tempfile
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from superkernel.static_kernel import compat
from superkernel.static_kernel.package import Package, install_kernels
from superkernel.static_kernel.settings import StaticKernelWarning
from superkernel.util import exception_summary


class ArtifactLoader:
    """Loads artifacts of one build directory's packages in this process (kernels installed once per package)."""

    def __init__(self, counters: Counter[str], device_kind: str) -> None:
        self.counters = counters
        self.device_kind = device_kind
        self.installed_from: Path | None = None
        self._probe: threading.Thread | None = None

    def install(self, pkg: Package) -> None:
        """Copy ``pkg``'s kernel libraries where TorchInductor's loader finds them (once per package)."""
        if self.installed_from != pkg.path:
            self.counters["kernels_installed"] += install_kernels(pkg, compat.inductor_cache_dir())
            self.installed_from = pkg.path

    def forget_install(self) -> None:
        self.installed_from = None

    def start_probe(self) -> None:
        """Run TorchInductor's CPU-ISA probe on another thread (CPU only, once)."""
        if self.device_kind == "cpu" and self._probe is None:
            self._probe = threading.Thread(target=probe_vec_isa, name="superkernel-isa-probe", daemon=True)
            self._probe.start()

    def load(self, key: str, data: bytes, pkg: Package | None) -> Callable[..., Any] | None:
        """The compiled partition of artifact ``data`` (from ``pkg``); None (with a warning) if it does not load."""
        if self._probe is not None:
            self._probe.join(timeout=120)  # started early: don't probe twice
        try:
            if pkg is not None:
                self.install(pkg)
            with tempfile.TemporaryDirectory(prefix="sk_artifact_") as tmp:
                path = os.path.join(tmp, f"{key}.bin")
                with open(path, "wb") as f:
                    f.write(data)
                fn = compat.load_artifact(path)
        except Exception as exc:  # noqa: BLE001 - a package never crashes the run
            self.counters["load_failed"] += 1
            where = pkg.path.name if pkg is not None else "package"
            warnings.warn(f"superkernel static kernels: could not load {key[:12]} from {where} "
                          f"({exception_summary(exc)}); building it again", StaticKernelWarning, stacklevel=5)
            return None
        self.counters["loaded"] += 1
        return fn


def probe_vec_isa() -> None:
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
