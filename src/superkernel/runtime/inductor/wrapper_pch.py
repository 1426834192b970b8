"""Inductor's C++-wrapper modules are built with one precompiled header that also holds its CPU kernel header.

On the CPU with ``cpp_wrapper`` (superkernel's default), every compiled partition is one C++ file: the
wrapper and its kernels. Inductor precompiles the wrapper's header (``cpp_wrapper/cpu.h``) for it, but the
kernels' header (``cpp_prefix.h``: ATen's vectorized types and their headers) is included by the file
itself and parsed again by every build: 0.7 s of a one-kernel partition's 2.7 s build, 0.4 s of a 1,800-line
frozen llama-tiny partition's 5.4 s (medians of alternating builds on a 2-core Xeon), in every max-autotune
partition a user compiles and in ~150 builds of the test suite.

:func:`wrapper_header_holds_kernel_header` makes ``CppWrapperCodeCache`` precompile a header of superkernel's
(``cpp_wrapper_cpu_with_prefix.h``, installed beside this module) that includes both: Inductor's wrapper
header, then ``cpp_prefix.h``. The file's own ``#include <.../cpp_prefix.h>`` then finds the header already included
(it is ``#pragma once``). The source text, its cache key and the machine code do not change (checked by
disassembling a module built both ways: tests/backend/test_wrapper_pch.py); only the build is shorter.
Inductor keys the precompiled header by the text it precompiles, the compile command and the compiler,
so it is built once per flags and reused by every later build (as its own is).

``SUPERKERNEL_COMPILE_PATH=before`` turns it off with the other compile-path speedups
(:mod:`superkernel.runtime.inductor.autotune_builds`).
"""

from __future__ import annotations

import contextlib
import unittest.mock
from pathlib import Path
from typing import Callable, Iterator

#: Inductor's header for CPU C++-wrapper modules, and its header for CPU kernels
WRAPPER_HEADER = "torch/csrc/inductor/cpp_wrapper/cpu.h"
KERNEL_HEADER = "torch/csrc/inductor/cpp_prefix.h"
#: the header of superkernel's that includes both, in that order (installed with the package)
COMBINED_HEADER = Path(__file__).with_name("cpp_wrapper_cpu_with_prefix.h")


def header_chooser(original: Callable[[str], str | None], kernels_of: Callable[[str], str | None]
                   ) -> Callable[[str], str | None]:
    """``_get_uncompiled_header`` for C++-wrapper builds: the combined header where Inductor would precompile
    its CPU wrapper header and its CPU kernels have ``cpp_prefix.h``; Inductor's own choice otherwise (other
    devices, the stack-allocation header of AOT builds, a torch whose headers are named otherwise)."""

    def choose(device: str) -> str | None:
        wrapper = original(device)
        if wrapper != WRAPPER_HEADER or kernels_of(device) != KERNEL_HEADER or not COMBINED_HEADER.is_file():
            return wrapper
        return str(COMBINED_HEADER)

    return choose


@contextlib.contextmanager
def wrapper_header_holds_kernel_header() -> Iterator[None]:
    """Inside: C++-wrapper modules are built with the precompiled header that also holds ``cpp_prefix.h``
    (entered through :data:`superkernel.runtime.inductor.tweaks.TWEAKS`, which skips it where this torch lacks
    the names it touches)."""
    from torch._inductor import codecache

    from superkernel.runtime.inductor.autotune_builds import enabled

    if not enabled():
        yield
        return
    cache = codecache.CppWrapperCodeCache
    choose = header_chooser(cache._get_uncompiled_header, codecache._get_cpp_prefix_header)
    with unittest.mock.patch.object(cache, "_get_uncompiled_header", classmethod(lambda _cls, device: choose(device))):
        yield
