"""The compile path's speedups for max-autotune: the GEMM template modules Inductor builds to time them use its
precompiled header, the templates' index expressions are parsed once per text; same code either way."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

import superkernel.runtime.inductor.cpu_freezing as inductor_cpu
from superkernel.runtime.inductor import autotune_builds

from tests.backend.test_frozen_code import _layer_graph


def test_the_template_code_cache_is_patched_only_inside_and_only_when_enabled(monkeypatch):
    from torch._inductor import autotune_process
    from torch._inductor.codecache import CppCodeCache

    with autotune_builds.template_builds_use_pch(False):
        assert autotune_process.CppCodeCache is CppCodeCache
    monkeypatch.setenv(autotune_builds.SWITCH, "before")
    with autotune_builds.template_builds_use_pch():
        assert autotune_process.CppCodeCache is CppCodeCache
    monkeypatch.delenv(autotune_builds.SWITCH)
    with autotune_builds.template_builds_use_pch():
        patched = autotune_process.CppCodeCache
        assert patched is not CppCodeCache and issubclass(patched, CppCodeCache)
        assert patched.cache is CppCodeCache.cache  # a module loaded either way is loaded once
        assert patched._get_uncompiled_header("cpu").endswith("cpp_prefix.h")
        assert CppCodeCache._get_uncompiled_header("cpu") is None  # Inductor's own class is untouched
    assert autotune_process.CppCodeCache is CppCodeCache


def _template_source() -> str:
    """A small module in the shape of a GEMM template's benchmark module (cpp_prefix.h, vectorized code)."""
    return """
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C" void sk_axpy(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    using Vec = at::vec::Vectorized<float>;
    int64_t i = 0;
    for (; i + Vec::size() <= n; i += Vec::size()) {
        (Vec::loadu(x + i) * Vec(2.0f) + Vec::loadu(y + i)).store(y + i);
    }
    for (; i < n; ++i) y[i] += 2.0f * x[i];
}
"""


def _disassembly(path: str) -> list[str]:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True, check=True).stdout
    return [line.split("\t", 1)[-1] for line in out.splitlines()[3:] if "\t" in line]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is needed to compare the code")
def test_a_module_built_with_the_precompiled_header_is_the_same_machine_code():
    from torch._inductor.codecache import CppCodeCache
    from torch._inductor.utils import fresh_cache

    pch_cache = autotune_builds.template_code_cache()
    assert pch_cache is not None
    source = _template_source()
    with fresh_cache():
        plain = CppCodeCache.load(source + "// built as Inductor does\n", device_type="cpu")
        with_pch = pch_cache.load(source + "// built with the precompiled header\n", device_type="cpu")
        assert plain._name != with_pch._name  # two builds (the comment makes two keys)
        assert _disassembly(plain._name) == _disassembly(with_pch._name)
        x, y = torch.arange(37, dtype=torch.float32), torch.ones(37)
        with_pch.sk_axpy.argtypes = None
        import ctypes

        with_pch.sk_axpy(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(37))
        assert torch.equal(y, 1 + 2 * torch.arange(37, dtype=torch.float32))


def test_index_expressions_are_parsed_once_per_text_and_equal_inductors():
    from superkernel.runtime.inductor.frozen_code import _PARSED_INDEX_EXPRESSIONS, parsed_index_expressions_reused

    with parsed_index_expressions_reused(False):  # imports Inductor's template modules (in an order without a cycle)
        from torch._inductor.codegen import cpp_template_kernel

    parse = cpp_template_kernel.parse_expr_with_index_symbols
    texts = ["m_end - m_start", "n_start + 16*k_size", 3]
    want = [parse(t) for t in texts]
    with parsed_index_expressions_reused(False):
        assert cpp_template_kernel.parse_expr_with_index_symbols is parse
    with parsed_index_expressions_reused(True):
        reuse = cpp_template_kernel.parse_expr_with_index_symbols
        assert reuse is not parse
        first, second = reuse(texts), reuse(list(texts))
        assert first == want and second == want and first is not second  # a list of its own per call
        assert all(a is b for a, b in zip(first, second))  # one parse per text
        assert all(a.free_symbols == b.free_symbols for a, b in zip(first, want))  # the same (integer) symbols
        assert "m_end - m_start" in _PARSED_INDEX_EXPRESSIONS
        expr = want[0]
        assert reuse(expr) is expr  # a sympy expression comes back as it is
    assert cpp_template_kernel.parse_expr_with_index_symbols is parse


@pytest.mark.slow
def test_a_frozen_compile_builds_its_template_module_with_the_header_and_matches_eager(monkeypatch):
    from torch._inductor import cpp_builder
    from torch._inductor.utils import fresh_cache

    builds: list[tuple[str, str]] = []  # (command line, source text)
    build = cpp_builder.CppBuilder.build

    def recording_build(self):
        command = self.get_command_line()
        sources = [a for a in command.split() if a.endswith(".cpp")]
        builds.append((command, "".join(open(s).read() for s in sources)))
        return build(self)

    monkeypatch.setattr(cpp_builder.CppBuilder, "build", recording_build)
    gm, gen = _layer_graph(), torch.Generator().manual_seed(2)
    x = torch.randn(1, 32, generator=gen)
    weights = [torch.randn(s, generator=gen) for s in [(64, 32), (64,), (32, 64)]]
    keys = {}
    with fresh_cache(), torch.no_grad():
        for path in ("after", "before"):  # the second finds the GEMM timings of the first: the same picks
            monkeypatch.setenv(autotune_builds.SWITCH, path)
            fn = inductor_cpu.compile_frozen(gm, [x, *weights], {1: weights[0], 2: weights[1], 3: weights[2]},
                                             cpp_wrapper=True, autotune=True, gemm_templates=True,
                                             gemm_timing="memory")
            torch.testing.assert_close(fn(x, *weights)[0], gm(x, *weights)[0], rtol=1e-4, atol=1e-4)
            keys[path] = fn.source_key
            if path == "after":
                # the modules built only to time a GEMM template: its micro-kernel, no compiled graph's entry point
                templates = [c for c, text in builds if "CppMicroGemm" in text and "inductor_entry" not in text]
                assert templates, "Inductor timed no C++ GEMM template"
                assert all("precompiled_headers" in c for c in templates)
    assert keys["after"] is not None and keys["after"] == keys["before"]  # the same generated source
