"""Static kernel compilation: record shapes, build every kernel ahead of time, load packages.

See docs/static_kernel.md. The compile pipeline uses :mod:`.compiler` (the one seam); the
command line is ``superkernel static-compile`` (:mod:`superkernel.tools.static_compile`).

Modules, bottom up: ``settings`` (build dir, Inductor options, fingerprint), ``signature``
(keys and shape signatures), ``records`` (shape records), ``environment``, ``package``
(the file format), ``store`` (which package a process uses), ``lock`` (the build lock),
``constants`` (weights lifted out of partitions), ``builder`` (compiling and writing a
package), ``loader`` (loading artifacts), ``frame_keys`` / ``frames`` / ``function``
(precompiled Dynamo frames), ``workspace`` (one build dir in one process), ``compiler``.
"""

from __future__ import annotations

from superkernel.static_kernel.package import Package, PackageError, find_packages, read_manifest
from superkernel.static_kernel.settings import BuildDirError, StaticKernelWarning, resolve_build_dir
from superkernel.static_kernel.signature import graph_structure_hash, partition_key

__all__ = [
    "BuildDirError", "Package", "PackageError", "StaticKernelWarning", "find_packages", "graph_structure_hash",
    "partition_key", "read_manifest", "resolve_build_dir",
]
