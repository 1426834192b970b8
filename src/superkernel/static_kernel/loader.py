"""Loading compiled partitions from a package: kernel libraries first, then the artifact.

TorchInductor's artifact (``CompiledArtifact.save``) holds the FX graph and AOTAutograd
cache entries but, on CPU, not the compiled C++ libraries; the package carries those. They
are written into a private TorchInductor cache directory per package and process (a new
0700 temporary directory, removed at exit) — never into the shared Inductor cache, so
nothing from a package reaches a later process or another compile — and artifacts load
with that directory as Inductor's cache, where Inductor's loader finds the libraries
before it would compile. Only a verified package signed by this user is installed or
loaded (:meth:`~.package.Package.require_loadable`). TorchInductor's CPU-ISA probe (once
per process) runs against that private cache too: the package carries its libraries.
"""

from __future__ import annotations

import atexit
import os
import platform
import shutil
import tempfile
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from superkernel.static_kernel import compat
from superkernel.static_kernel.manifest import PackageError, valid_member_name
from superkernel.static_kernel.package import Package
from superkernel.static_kernel.settings import StaticKernelWarning
from superkernel.util import atomic_target, exception_summary


class ArtifactLoader:
    """Loads artifacts of one build directory's packages in this process (kernels installed once per package)."""

    def __init__(self, counters: Counter[str], device_kind: str) -> None:
        self.counters = counters
        self.device_kind = device_kind
        self.installed_from: Path | None = None
        self.cache_dir: Path | None = None  # the private Inductor cache of the installed package

    def install(self, pkg: Package) -> None:
        """Write ``pkg``'s kernel libraries into a new private cache dir (once per package); on CPU,
        run TorchInductor's ISA probe there (the package holds its probe libraries: nothing compiles)."""
        if self.installed_from != pkg.path:
            pkg.require_loadable()
            self.cache_dir = private_kernel_dir()
            self.counters["kernels_installed"] += install_kernels(pkg, self.cache_dir)
            self.installed_from = pkg.path
            if self.device_kind == "cpu" and pkg.artifacts:  # (a package of native modules only: no Inductor)
                with compat.inductor_cache_dir_at(str(self.cache_dir)):
                    probe_vec_isa()

    def install_native(self, pkg: Package, key: str) -> Path:
        """Write native module ``key`` of ``pkg`` (verified and trusted) into the private cache dir as
        ``native/<key>.so`` (0700); its path, from which it is loaded."""
        self.install(pkg)
        name = f"native/{key}.so"
        if not valid_member_name(name) or self.cache_dir is None:  # (checked when read; never trust a name twice)
            raise PackageError(f"unsafe native module name {name!r}")
        dest = self.cache_dir / name
        if not dest.exists():
            dest.parent.mkdir(mode=0o700, exist_ok=True)
            with atomic_target(dest) as tmp:
                tmp.write_bytes(pkg.native_bytes(key))
            dest.chmod(0o700)
        return dest

    def forget_install(self) -> None:
        self.installed_from = None

    def load(self, key: str, data: bytes, pkg: Package | None) -> Callable[..., Any] | None:
        """The compiled partition of artifact ``data`` (from ``pkg``); None (with a warning) if it does not load."""
        try:
            if pkg is not None:
                self.install(pkg)
            if self.cache_dir is None:
                self.cache_dir = private_kernel_dir()
            with tempfile.TemporaryDirectory(prefix="sk_artifact_") as tmp:
                path = os.path.join(tmp, f"{key}.bin")
                with open(path, "wb") as f:
                    f.write(data)
                with compat.inductor_cache_dir_at(str(self.cache_dir)):
                    fn = compat.load_artifact(path)
        except Exception as exc:  # noqa: BLE001 - a package never crashes the run
            self.counters["load_failed"] += 1
            where = pkg.path.name if pkg is not None else "package"
            warnings.warn(f"superkernel static kernels: could not load {key[:12]} from {where} "
                          f"({exception_summary(exc)}); building it again", StaticKernelWarning, stacklevel=5)
            return None
        self.counters["loaded"] += 1
        return fn


def install_kernels(package: Package, cache_dir: str | Path) -> int:
    """Write the package's kernel libraries into ``cache_dir`` (a private Inductor cache) under their own names.

    Only for a verified, trusted package. Returns how many files were written (files already
    present are left alone: the name is a content hash of source and compile command).
    """
    package.require_loadable()
    root = Path(cache_dir)
    written = 0
    for name in package.kernels:
        if not valid_member_name(name):  # (checked when read; never trust a name twice removed)
            raise PackageError(f"unsafe kernel path {name!r}")
        dest = root / name[len("kernels/"):]
        if dest.exists() or dest.is_symlink():
            continue
        dest.parent.mkdir(mode=0o700, exist_ok=True)
        with atomic_target(dest) as tmp:
            tmp.write_bytes(package.files[name])
        dest.chmod(0o700)
        written += 1
    return written


_PRIVATE_DIRS: list[Path] = []


def private_kernel_dir() -> Path:
    """A new TorchInductor cache directory only this user can read or write (removed at exit)."""
    path = Path(tempfile.mkdtemp(prefix="superkernel-kernels-"))
    _PRIVATE_DIRS.append(path)
    return path


@atexit.register
def _remove_private_dirs() -> None:
    for path in _PRIVATE_DIRS:
        shutil.rmtree(path, ignore_errors=True)


_PROBED = False


def probe_vec_isa() -> None:
    """TorchInductor's CPU vector-ISA probe (once per process), the candidate ISAs side by side.

    Each candidate costs a few short subprocesses (build, then dlopen, a test library);
    Inductor runs them one after another. Probing the candidates in parallel threads fills
    its cache of results first, so its own ``pick_vec_isa`` then only reads it.
    """
    global _PROBED
    if _PROBED:
        return
    _PROBED = True
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
