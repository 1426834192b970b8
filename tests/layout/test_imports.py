"""The package's structure holds: no import cycles among project modules, and the
library (scopes, backend, static kernels) imports neither the tools' nor the ONNX
product's dependencies."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import superkernel

PACKAGE_ROOT = Path(superkernel.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_imports() -> dict[str, set[str]]:
    """module -> project modules it imports (at module level, inside functions, or only for type
    checkers under ``if TYPE_CHECKING:``: a type-only import is an arrow of the structure too)."""
    modules = {_module_name(p): p for p in PACKAGE_ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        edges: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                # the longest project module the import names
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            # a package's __init__ re-exporting its own submodules is not an arrow back
            if state.get(nxt) == 1 and not nxt.startswith(node + ".") :
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles() -> None:
    graph = project_imports()
    # Edges from a package to its own submodules (``__init__`` re-exports) are part of
    # the package; edges from submodules back to the package's ``__init__`` are what count.
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    graph["superkernel"] = set()  # the top-level facade re-exports lazily; nothing imports it for code
    for name in graph:
        graph[name].discard("superkernel")
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_library_imports_no_tool_or_onnx_dependency() -> None:
    code = (
        "import sys, superkernel, superkernel.pipeline.backend, superkernel.static_kernel\n"
        "bad = sorted(m for m in ('transformers', 'onnx', 'onnxruntime', 'onnxscript', 'matplotlib', 'rich', 'yaml')"
        " if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "", f"importing the library pulled in: {out.stdout.strip()}"


def test_graph_autofusion_starts_without_torch() -> None:
    code = "import sys, superkernel.onnx.cli\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", "graph-autofusion imports torch at start-up (seconds per call)"
