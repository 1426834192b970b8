"""The layers of the package (README, "Layout"): every import runs down or within a layer, none up.

Layers, bottom first (a module belongs to the layer of the longest prefix listed):

0. records and settings everything shares: ``config``, ``util``, ``cache_dir``, ``hugepages``, ``userkey``, ``scope``,
   ``scope_apply``, ``timing``, ``hf_cache_names``, ``ir`` (the records of graphs, scopes and decisions)
1. ``runtime``: what a partition runs as: the realization table and one folder per technology (``cpu``,
   ``inductor`` with the autofusion planner, ``cuda``)
2. ``static_kernel``: ahead-of-time kernels (implements the runtime's static-compiler seam)
3. ``pipeline``: the torch.compile backend
4. the products: ``tools`` (the ``superkernel`` command), ``onnx`` (graph-autofusion), the
   package facade

Imports only for type checkers count. No module holds more than 600 lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layout.test_imports import PACKAGE_ROOT, project_imports

LAYERS: dict[str, int] = {
    "superkernel.config": 0, "superkernel.util": 0, "superkernel.cache_dir": 0, "superkernel.hugepages": 0,
    "superkernel.userkey": 0, "superkernel.scope": 0, "superkernel.timing": 0, "superkernel.hf_cache_names": 0,
    "superkernel.scope_apply": 0, "superkernel.ir": 0, "superkernel.eager_branch": 0,
    "superkernel.runtime": 1,
    "superkernel.static_kernel": 2,
    "superkernel.pipeline": 3,
    "superkernel.tools": 4, "superkernel.onnx": 4, "superkernel.integrations": 4, "superkernel": 4,
}
NAMES = ["shared records", "runtime", "static_kernel", "pipeline", "products"]


def layer(module: str) -> int:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to README's layout)")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target == "superkernel":  # the lazy facade: `from superkernel import __version__`
                continue
            if layer(target) > layer(module):
                out.append(f"{module} ({NAMES[layer(module)]}) -> {target} ({NAMES[layer(target)]})")
    return out


def test_every_import_runs_down_or_within_a_layer():
    assert upward_imports(project_imports()) == []


def test_the_checker_sees_an_upward_import():
    graph = {"superkernel.runtime.cpu.flat": {"superkernel.pipeline.backend"}, "superkernel.pipeline.backend": set()}
    assert upward_imports(graph) == ["superkernel.runtime.cpu.flat (runtime) -> superkernel.pipeline.backend (pipeline)"]


#: known to be over the limit, each with the work that will split it (strict: fails once it is fixed)
OVER_600: dict[str, str] = {}


def _sources() -> list[object]:
    out: list[object] = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        name = path.relative_to(PACKAGE_ROOT).as_posix()
        marks = [pytest.mark.xfail(strict=True, reason=f"over 600 lines: {OVER_600[name]}")] if name in OVER_600 else []
        out.append(pytest.param(path, id=name, marks=marks))
    return out


@pytest.mark.parametrize("path", _sources())
def test_no_source_file_over_600_lines(path: Path):
    lines = len(path.read_text().splitlines())
    assert lines <= 600, f"{path.relative_to(PACKAGE_ROOT)} has {lines} lines"


def test_no_two_modules_of_one_package_share_a_basename():
    """Inside each top-level package (runtime, tools, onnx, ...) a file name says which module it is."""
    clashes = {}
    for top in sorted(p for p in PACKAGE_ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        names: dict[str, list[str]] = {}
        for path in top.rglob("*.py"):
            if path.name != "__init__.py":
                names.setdefault(path.name, []).append(path.relative_to(PACKAGE_ROOT).as_posix())
        clashes.update({f"{top.name}/{k}": v for k, v in names.items() if len(v) > 1})
    assert clashes == {}
