"""Reduce-overhead packages carry the precompiled step: its frame and its native module.

A fresh process without a C++ compiler loads both: Dynamo traces nothing, AOTAutograd
captures nothing, nothing is compiled, the output is the build's and the exactness
reference's bit for bit, and the second call runs on the state watch (no guard tree).
"""

from __future__ import annotations

import os
import shutil
import sys

import torch

from superkernel.static_kernel.package import find_packages, read_manifest

from .conftest import run_child, seeded_cache


def test_reduce_overhead_package_carries_frame_and_native_module(tmp_path):
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    built = run_child(tmp_path, build_dir, 2, tmp_path / "build_out.pt", "--function", "--reduce-overhead",
                      SUPERKERNEL_CACHE_DIR=str(seeded_cache(tmp_path / "build_cache")))
    assert built["static"]["frames_built"] == 1 and built["static"]["native_built"] == 1, built
    assert built["guard_path"] == "precompiled" and built["frame_counters"]["guard_checks"] == 1
    (path,) = find_packages(build_dir)
    pkg = read_manifest(path)  # (not trusted here: another key; only its table of contents is read)
    assert len(pkg.frames) == 1 and len(pkg.native) == 1 and not pkg.artifacts
    assert next(iter(pkg.frames.values()))["level"] == "aten"

    no_tools = tmp_path / "bin"
    no_tools.mkdir()
    keys = tmp_path / "empty_cache" / "keys"  # the same user (the key that signed it), an empty native cache
    keys.mkdir(parents=True, mode=0o700)
    os.chmod(keys.parent, 0o700)
    shutil.copy(tmp_path / "build_cache" / "keys" / "trust.key", keys / "trust.key")
    os.chmod(keys / "trust.key", 0o600)
    before = _files(build_dir)
    loaded = run_child(tmp_path, build_dir, 2, tmp_path / "load_out.pt", "--function", "--reduce-overhead",
                       CXX=str(tmp_path / "missing" / "g++"),
                       PATH=f"{no_tools}{os.pathsep}{os.path.dirname(sys.executable)}",
                       SUPERKERNEL_CACHE_DIR=str(tmp_path / "empty_cache"))
    assert loaded["compiler_available"] is False
    assert _files(build_dir) == before, "a process loading the package wrote into the build dir"
    assert loaded["static"].get("records", 0) == 0, loaded
    assert loaded["compile_stack_imported"] == [], loaded  # AOTAutograd and torch.compile's wrapper are not needed
    assert loaded["static"].get("frames_loaded") == 1 and loaded["static"].get("native_loaded") == 1, loaded
    assert (loaded["dynamo_traces"], loaded["aot_captures"], loaded["cpp_builds"]) == (0, 0, 0), loaded
    assert loaded["realizations"] == ["cpu-native"] and loaded["packages"] == [] and not loaded["warnings"]
    assert loaded["guard_path"] == "precompiled" and loaded["frame_counters"]["guard_checks"] == 1
    a, b = torch.load(tmp_path / "build_out.pt"), torch.load(tmp_path / "load_out.pt")
    assert torch.equal(a["y"], b["y"]) and torch.equal(b["y"], b["y2"]) and torch.equal(b["y"], b["ref"])


def _files(root) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time (what a writer would change)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
