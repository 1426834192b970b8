"""Static kernel compilation: record shapes, build every kernel ahead of time, load packages.

See docs/static_kernel.md. The backend uses :func:`open_session`; the command line is
``superkernel static-compile`` (:mod:`superkernel.tools.static_compile`).
"""

from __future__ import annotations

from superkernel.static_kernel.package import Package, PackageError, find_packages, read_manifest
from superkernel.static_kernel.session import (
    BuildDirError, StaticKernelSession, StaticKernelWarning, open_session, resolve_build_dir,
)
from superkernel.static_kernel.signature import graph_structure_hash, partition_key

__all__ = [
    "BuildDirError", "Package", "PackageError", "StaticKernelSession", "StaticKernelWarning",
    "find_packages", "graph_structure_hash", "open_session", "partition_key", "read_manifest", "resolve_build_dir",
]
