"""A quantized max-autotune package carries superkernel's int8 kernels: a fresh process with an empty native
cache loads the library from the package before the partitions that call it, compiles nothing, and gives the
build's output. (Inductor wants a C++ compiler on PATH to load any CPU max-autotune package, so this child has
one; that it builds nothing is counted.)"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from superkernel.static_kernel.package import find_packages, read_manifest

from .conftest import run_child, seeded_cache

pytest.importorskip("torchao")


def test_a_w8a8_package_carries_the_int8_kernels_and_a_fresh_process_loads_them(tmp_path):
    from superkernel.runtime.cpu import quant_kernels

    if not quant_kernels.fast_path("int8_gemv"):
        pytest.skip(f"no vector int8 kernel on this CPU ({quant_kernels.unavailable_reason() or 'no AVX2'})")
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    # (no fresh-process load check in the build: the loading child below is one, with an empty native cache;
    # the check itself is test_build_and_load.py's)
    built = run_child(tmp_path, build_dir, 2, tmp_path / "build_out.pt", "--quantize", "w8a8",
                      SUPERKERNEL_CACHE_DIR=str(seeded_cache(tmp_path / "build_cache")), SUPERKERNEL_STATIC_VERIFY="0")
    assert built["static"].get("rewrites") == 2, built  # both linears, rewritten in the build as in a normal compile
    assert built["static"].get("native_built") == 1, built  # (as our kernel: the package's module is its library)
    (path,) = find_packages(build_dir)
    pkg = read_manifest(path)  # (not trusted here: another key; only its table of contents is read)
    assert [entry.get("ops") for entry in pkg.native.values()] == [True] and pkg.artifacts

    keys = tmp_path / "empty_cache" / "keys"  # the same user (the key that signed it), an empty native cache
    keys.mkdir(parents=True, mode=0o700)
    os.chmod(keys.parent, 0o700)
    shutil.copy(tmp_path / "build_cache" / "keys" / "trust.key", keys / "trust.key")
    os.chmod(keys / "trust.key", 0o600)
    loaded = run_child(tmp_path, build_dir, 2, tmp_path / "load_out.pt", "--quantize", "w8a8",
                       SUPERKERNEL_CACHE_DIR=str(tmp_path / "empty_cache"))
    assert loaded["static"].get("native_loaded") == 1 and loaded["static"].get("loaded", 0) >= 1, loaded["warnings"]
    assert loaded["static"].get("compiled", 0) == 0 and loaded["cpp_builds"] == 0 and not loaded["warnings"], loaded
    assert not list((tmp_path / "empty_cache").rglob("sk_native_*.so")), "the library was built, not loaded"
    a, b = torch.load(tmp_path / "build_out.pt"), torch.load(tmp_path / "load_out.pt")
    assert torch.equal(a["y"], b["y"]) and torch.equal(b["y"], b["y2"])
