"""Static kernels sit behind one seam: what they import from the project, and how the pipeline reaches them."""

from __future__ import annotations

import ast
from pathlib import Path

import superkernel

SRC = Path(superkernel.__file__).resolve().parent

# what static_kernel may use from the rest of the project (all below the pipeline's later stages)
ALLOWED = {"superkernel", "superkernel.ir.graph", "superkernel.util", "superkernel.runtime.inductor.compile",
           "superkernel.scope_apply", "superkernel.runtime.cpu.native.build",  # (build: the seam packages use)
           "superkernel.config", "superkernel.runtime.realizations",  # (settings: the realization row decides)
           "superkernel.userkey",  # (trust: the per-user key and its records, bottom layer)
           "superkernel.cache_dir",  # (isa_probes: the user's private cache, bottom layer)
           "superkernel.runtime.inductor.output",  # (compat: what Inductor prints while building, to the debug log)
           "superkernel.runtime.cpu.quant_kernels"}  # (superkernel's int8 kernels: an operator library packages carry)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m == "superkernel" or m.startswith("superkernel.")}


def test_static_kernel_imports_only_the_bottom_of_the_project():
    for path in sorted((SRC / "static_kernel").glob("*.py")):
        outside = {m for m in _imports(path) if not m.startswith("superkernel.static_kernel")}
        assert outside <= ALLOWED, f"{path.name} imports {sorted(outside - ALLOWED)}"


def test_the_pipeline_reaches_static_kernels_only_through_the_compiler_seam():
    for path in sorted((SRC / "pipeline").glob("*.py")):
        used = {m for m in _imports(path) if m.startswith("superkernel.static_kernel")}
        assert used <= {"superkernel.static_kernel.compiler"}, f"pipeline/{path.name} imports {sorted(used)}"


def test_no_static_kernel_module_holds_more_than_400_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (SRC / "static_kernel").glob("*.py")}
    assert max(sizes.values()) <= 400, sizes
