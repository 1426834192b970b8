"""The packages of one build directory: which one this process may use, and retiring old ones.

A package is usable when it is well formed, for this device kind, signed by this user
(:mod:`.trust`), its environment and compiler config match this process, and every file
passes its check. Packages that are not are ignored with one :class:`StaticKernelWarning`
each, saying why. Nothing is ever deleted that this process did not replace itself: a
malformed or corrupted package is renamed aside (``NAME.refused-<time>``) when a new
package replaces it; an untrusted one is left where it is.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from superkernel.static_kernel.environment import layout_only_mismatch
from superkernel.static_kernel.package import Package, PackageError, find_packages, read_manifest, refuse
from superkernel.static_kernel.settings import RankLayoutError, StaticKernelWarning, rebuild_other_layout


class PackageStore:
    """Finds the package a process of one build directory uses (for one device kind and config)."""

    def __init__(self, build_dir: Path, device_kind: str, env: dict[str, Any], fingerprint: str,
                 counters: Counter[str]) -> None:
        self.build_dir = build_dir
        self.device_kind = device_kind
        self.env = env
        self.fingerprint = fingerprint
        self.counters = counters
        self.rejected: dict[Path, str] = {}
        self.superseded: set[Path] = set()  # replaced by the next package this process writes (removed)
        self.refused: set[Path] = set()  # malformed or corrupted: renamed aside when a new package replaces them
        self.other_layout: dict[Path, str] = {}  # fit but for the rank layout (world size): an error if none fits

    def paths(self) -> list[Path]:
        return find_packages(self.build_dir)

    def usable(self, current: Package | None = None, *, need_graph: str | None = None,
               need_key: str | None = None) -> Package | None:
        """The newest package that matches here and passes its checks (``current``: one already read)."""
        for path in self.paths():
            if path in self.rejected:
                continue
            if current is not None and path == current.path:
                pkg = current
            else:
                try:
                    pkg = read_manifest(path)
                except PackageError as exc:
                    self.reject(path, str(exc), corrupt=True)
                    continue
                if pkg.manifest["environment"].get("device_kind") != self.device_kind:
                    continue  # a package for another device kind (CPU vs CUDA): not ours, not wrong
                if not pkg.trusted:
                    self.reject(path, f"not trusted: {pkg.untrusted}; if you trust it, run: "
                                      f"superkernel static-compile --trust {path}", rebuild=False)
                    continue
                reason = pkg.mismatch(self.env, self.fingerprint)
                if reason is not None and self._layout_only(pkg) and not rebuild_other_layout():
                    self.other_layout[path] = reason  # (an error if no package fits: layout_error)
                    continue
                if reason is not None:
                    self.reject(path, reason)
                    continue
            if need_graph is not None and need_graph not in pkg.graphs:
                continue
            if need_key is not None and need_key not in pkg.artifacts:
                continue
            if not pkg.verified:
                try:
                    pkg.verify()
                except PackageError as exc:
                    self.reject(path, str(exc), corrupt=True)
                    continue
            return pkg
        return None

    def _layout_only(self, pkg: Package) -> bool:
        return (pkg.manifest["config_fingerprint"] == self.fingerprint
                and layout_only_mismatch(pkg.manifest["environment"], self.env))

    def layout_error(self) -> RankLayoutError | None:
        """When no package fits and one would but for the rank layout: the error saying so (one line)."""
        if not self.other_layout:
            return None
        path, reason = next(iter(self.other_layout.items()))
        world = self.env.get("world_size") or "1"
        command = "superkernel static-compile" + (f" --nproc {world}" if world != "1" else "") + " --rebuild"
        return RankLayoutError(f"static kernel package {path}: {reason}; build one for this job with {command} "
                               "(or use another build directory)")

    def reject(self, path: Path, reason: str, *, corrupt: bool = False, rebuild: bool = True) -> None:
        if path in self.rejected:
            return
        self.rejected[path] = reason
        self.counters["packages_ignored"] += 1
        if corrupt:
            self.refused.add(path)
        then = "; a fresh build replaces it" if rebuild else ""
        warnings.warn(f"superkernel static kernels: ignoring package {path}: {reason}{then}", StaticKernelWarning,
                      stacklevel=5)

    def retire(self, replaced: set[Path], keep: Path) -> None:
        """After ``keep`` was written: remove the packages it replaces, rename refused ones aside."""
        for old in sorted(self.superseded | replaced):
            if old != keep and old not in self.refused:
                try:
                    old.unlink()
                except OSError:
                    pass
        for old in sorted(self.refused):
            if old != keep and old.exists() and refuse(old) is not None:
                self.counters["packages_refused"] += 1
        self.superseded.clear()
        self.refused.clear()


def check_layout(compiler_config: Any, build_dir: Path, device_kind: str = "cpu") -> None:
    """Raise :class:`RankLayoutError` when ``build_dir`` holds a package for this process except its rank layout
    (world size) and none for this layout (unless rebuilding is asked for): before anything is loaded or built."""
    from superkernel.static_kernel.environment import environment
    from superkernel.static_kernel.settings import config_fingerprint

    store = PackageStore(build_dir, device_kind, environment(device_kind),
                         config_fingerprint(compiler_config, device_kind), Counter())
    with warnings.catch_warnings():  # (the build says why it ignores a package, once)
        warnings.simplefilter("ignore")
        found = store.usable()
    error = store.layout_error() if found is None else None
    if error is not None:
        raise error
