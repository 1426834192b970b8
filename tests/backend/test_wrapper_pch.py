"""C++-wrapper builds precompile Inductor's kernel header with its wrapper header: the header chosen, where it
applies, and a partition built both ways is the same source, key and machine code."""

from __future__ import annotations

import shutil

import pytest
import torch

from superkernel.runtime.inductor import autotune_builds, wrapper_pch
from superkernel.runtime.inductor.compile import compile_partition

from tests.backend.test_autotune_builds import _disassembly


def test_the_combined_header_includes_inductors_two_headers_in_order():
    text = wrapper_pch.COMBINED_HEADER.read_text()
    includes = [line.split("<", 1)[1].rstrip(">") for line in text.splitlines() if line.startswith("#include")]
    assert includes == [wrapper_pch.WRAPPER_HEADER, wrapper_pch.KERNEL_HEADER]


def test_the_combined_header_is_chosen_only_for_the_cpu_wrapper_header():
    from torch._inductor import codecache

    kernels_of = codecache._get_cpp_prefix_header
    choose = wrapper_pch.header_chooser(codecache._get_cpp_wrapper_header, kernels_of)
    assert choose("cpu") == str(wrapper_pch.COMBINED_HEADER)
    assert choose("cuda") == codecache._get_cpp_wrapper_header("cuda")  # no kernel header of Inductor's there
    array_ref = wrapper_pch.header_chooser(lambda _d: "torch/csrc/inductor/cpp_wrapper/array_ref.h", kernels_of)
    assert array_ref("cpu") == "torch/csrc/inductor/cpp_wrapper/array_ref.h"  # another wrapper header: Inductor's


def test_the_header_is_patched_only_inside_and_only_when_enabled(monkeypatch):
    from torch._inductor.codecache import CppWrapperCodeCache

    inductors = CppWrapperCodeCache._get_uncompiled_header("cpu")
    assert inductors == wrapper_pch.WRAPPER_HEADER
    with wrapper_pch.wrapper_header_holds_kernel_header():
        assert CppWrapperCodeCache._get_uncompiled_header("cpu") == str(wrapper_pch.COMBINED_HEADER)
    assert CppWrapperCodeCache._get_uncompiled_header("cpu") == inductors
    monkeypatch.setenv(autotune_builds.SWITCH, "before")
    with wrapper_pch.wrapper_header_holds_kernel_header():
        assert CppWrapperCodeCache._get_uncompiled_header("cpu") == inductors


def _graph() -> torch.fx.GraphModule:
    def fn(x, w):
        return (torch.relu(x @ w) * 0.5 + x,)

    return torch.fx.experimental.proxy_tensor.make_fx(fn)(torch.zeros(2, 16), torch.zeros(16, 16))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is needed to compare the code")
def test_a_partition_built_with_the_combined_header_is_the_same_code(monkeypatch):
    from torch._inductor import cpp_builder
    from torch._inductor.utils import fresh_cache

    builds: list[tuple[str, str]] = []  # (command line, output) of each module build
    build = cpp_builder.CppBuilder.build

    def recording_build(self):
        builds.append((self.get_command_line(), self.get_target_file_path()))
        return build(self)

    monkeypatch.setattr(cpp_builder.CppBuilder, "build", recording_build)
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 16, generator=gen), torch.randn(16, 16, generator=gen)
    built = {}
    for path in ("before", "after"):
        monkeypatch.setenv(autotune_builds.SWITCH, path)
        builds.clear()
        with fresh_cache(), torch.no_grad():  # each builds its own module from the same source
            fn = compile_partition(_graph(), [x, w], device="cpu", cpp_wrapper=True)
            assert torch.equal(fn(x, w)[0], _graph()(x, w)[0])
            (command, so), = [(c, o) for c, o in builds if o.endswith(".main.so")]
            header = command.split("-include ", 1)[1].split()[0]
            built[path] = (fn.source_key, open(header).read(), _disassembly(so))
    assert built["before"][0] is not None and built["before"][0] == built["after"][0]  # the same source and key
    assert wrapper_pch.WRAPPER_HEADER in built["before"][1]
    assert str(wrapper_pch.COMBINED_HEADER) in built["after"][1]
    assert built["before"][2] == built["after"][2]
