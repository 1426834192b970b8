"""The C++ GEMM template modules Inductor builds only to time them are built with its precompiled header.

With max-autotune and frozen weights, Inductor times each GEMM's C++ template against MKL: it renders
the template into a small C++ module (the micro-kernel and ``extern "C"`` entry, ~9 KB) and builds it
with g++ (``CppBenchmarkRequest`` -> ``CppCodeCache.load``) before the first timed call. That module
includes ``cpp_prefix.h`` (ATen's vectorized types and their headers), and ``CppCodeCache`` is the one
C++ code cache of Inductor's that never uses the precompiled header Inductor keeps for that header
(``config.cpp_cache_precompile_headers``; plain ``torch.compile``'s CPU kernels use it, the C++-wrapper
modules one of their own). Parsing the header is most of the build: measured 4-9 s per template module
without it, 1.1-1.4 s with it on a quiet core and 1.5-2 s under load (Qwen2-0.5B width and tiny models
alike, AMD EPYC, 2 cores; benchmarks/results/max_autotune_compile_summary.md), one build per distinct
GEMM shape in a cold compile.

:func:`template_builds_use_pch` makes those builds use the precompiled ``cpp_prefix.h``. The header is
the same text either way (g++ reads the ``.gch`` only when it was built with the same flags, and falls
back to the header otherwise), so the module is the same machine code: checked by disassembling one
built both ways (tests/backend/test_autotune_builds.py). The module key, its path and the timings do not
change; only its build is shorter.

``SUPERKERNEL_COMPILE_PATH=before`` turns this off, and the parsed index expressions of
:func:`superkernel.runtime.inductor.frozen_code.parsed_index_expressions_reused` and the combined precompiled
header of :mod:`superkernel.runtime.inductor.wrapper_pch` too: the compile path before all three, which
``benchmarks/max_autotune_compile.py`` compares with.
"""

from __future__ import annotations

import contextlib
import os
import unittest.mock
from typing import Iterator

#: environment switch: ``before`` compiles as before these speedups (template modules built without the
#: precompiled header, index expressions parsed on every render), for A/B benchmarks
SWITCH = "SUPERKERNEL_COMPILE_PATH"


def enabled() -> bool:
    """False where ``SUPERKERNEL_COMPILE_PATH=before`` asks for the compile path before these speedups."""
    return os.environ.get(SWITCH, "").strip().lower() != "before"


def template_code_cache() -> type | None:
    """A ``CppCodeCache`` that builds with Inductor's precompiled ``cpp_prefix.h`` and shares the
    loaded modules of ``CppCodeCache`` itself; None where this torch's Inductor has no such hooks."""
    try:
        from torch._inductor import codecache
    except ImportError:
        return None
    base = getattr(codecache, "CppCodeCache", None)
    header_of = getattr(codecache, "_get_cpp_prefix_header", None)
    if base is None or header_of is None or not hasattr(base, "_get_uncompiled_header"):
        return None

    class TemplateCodeCache(base):  # type: ignore[misc, valid-type]
        cache = base.cache  # one table of loaded modules: the same key is never built twice

        @classmethod
        def _get_uncompiled_header(cls, device: str) -> str | None:
            return header_of(device)

    return TemplateCodeCache


@contextlib.contextmanager
def template_builds_use_pch(enabled_: bool | None = None) -> Iterator[None]:
    """Inside: the GEMM template modules built for autotuning use the precompiled ``cpp_prefix.h``."""
    if enabled_ is None:
        enabled_ = enabled()
    try:
        from torch._inductor import autotune_process
    except ImportError:
        enabled_ = False
    cache = template_code_cache() if enabled_ else None
    if cache is None or not hasattr(autotune_process, "CppCodeCache"):
        yield
        return
    with unittest.mock.patch.object(autotune_process, "CppCodeCache", cache):
        yield
