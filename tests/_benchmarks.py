"""One way for tests to import a script of benchmarks/ (not a package) as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` (``name`` may be ``studies/<study>``) executed as a fresh module named
    ``<basename>_under_test``."""
    spec = importlib.util.spec_from_file_location(f"{Path(name).name}_under_test", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
