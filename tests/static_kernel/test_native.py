"""Static packages carry the native CPU modules of reduce-overhead graphs: a fresh process without a C++
compiler runs them (cpu-native, bit-identical); a module built for another ABI is never loaded."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import warnings
import zipfile

import pytest
import torch

import superkernel
from superkernel import CompilerConfig
from superkernel.runtime.cpu import native as native_cpu
from superkernel.static_kernel import find_packages, read_manifest, trust
from superkernel.static_kernel.workspace import reset_workspaces
from superkernel.cache_dir import cache_root as private_cache_root
from tests._env import environ
from tests.static_kernel._child import Tiny
from tests.static_kernel.conftest import run_child

pytestmark = pytest.mark.skipif(not native_cpu.compiler_available(), reason="no C++ compiler to build the package")

# The native-module cache the backend tests use (read at collection, before the session fixture points
# XDG_CACHE_HOME at a private trust key): its precompiled torch headers save a build here.
USER_NATIVE_CACHE = str(private_cache_root())


def _compile(build_dir, *, static: bool = True, run_eagerly: bool = False):
    torch.manual_seed(0)
    model = Tiny().eval()
    cfg = CompilerConfig.from_dict({"mode": "reduce-overhead", "debug": {"run_eagerly": run_eagerly}})
    if static:
        cfg.experimental_config.static_kernel.enable = True
        cfg.experimental_config.static_kernel.build_dir = str(build_dir)
    compiled = superkernel.compile(model, cfg)
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = compiled(x)
    return compiled, y


def _realizations(compiled):
    return [s.realization for g in superkernel.explain(compiled).graphs for s in g.segments]


@pytest.fixture(scope="module")
def native_pkg(tmp_path_factory):
    """A package built in this process by a reduce-overhead CPU compile (one graph, one native module)."""
    tmp = tmp_path_factory.mktemp("native")
    build_dir = tmp / "build"
    build_dir.mkdir()
    reset_workspaces()
    torch._dynamo.reset()
    cache_root = os.environ.get("SUPERKERNEL_CACHE_DIR", USER_NATIVE_CACHE)
    with environ(SUPERKERNEL_CACHE_DIR=cache_root):
        compiled, y = _compile(build_dir)
        key = trust.key_path()  # the key follows the cache root (docs/security.md)
    counters = dict(superkernel.pipeline.backend.find_backend(compiled).static_kernels.counters)
    realizations = _realizations(compiled)
    torch._dynamo.reset()
    _, ref = _compile(build_dir, static=False, run_eagerly=True)  # the exactness reference
    torch._dynamo.reset()
    torch.save({"y": y}, tmp / "built.pt")
    return {"tmp": tmp, "build_dir": build_dir, "y": y, "ref": ref, "counters": counters,
            "realizations": realizations, "key": key, "cache_root": cache_root}


def test_package_carries_the_native_module(native_pkg):
    assert native_pkg["counters"]["native_built"] == 1 and native_pkg["counters"]["packages_written"] == 1
    assert native_pkg["realizations"] == ["cpu-native"]
    assert torch.equal(native_pkg["y"], native_pkg["ref"])
    (path,) = find_packages(native_pkg["build_dir"])
    with environ(SUPERKERNEL_CACHE_DIR=native_pkg["cache_root"]):  # the key that signed it
        pkg = read_manifest(path)
    assert pkg.trusted and not pkg.artifacts and not pkg.kernels
    ((key, entry),) = pkg.native.items()
    assert re.fullmatch(r"[0-9a-f]{32}", key) and entry["file"] == f"native/{key}.so" in pkg.manifest["files"]
    assert re.fullmatch(r"sk_native_[0-9a-f]{32}", entry["module"])
    assert entry["abi"] == native_cpu.build.abi_fingerprint() and entry["entries"][0].startswith("seg_0_blk")


def test_fresh_process_without_a_compiler_runs_the_packaged_module(native_pkg, tmp_path):
    """No g++ (CXX names a missing compiler, PATH has none) and an empty native cache: the module comes from
    the package; explain says cpu-native and the outputs equal the build's and the exactness reference's."""
    tmp = native_pkg["tmp"]
    no_tools = tmp_path / "bin"
    no_tools.mkdir()
    keys = tmp_path / "empty_cache" / "keys"  # the same user (same key), an empty native cache
    keys.mkdir(parents=True, mode=0o700)
    os.chmod(keys.parent, 0o700)
    shutil.copy(native_pkg["key"], keys / "trust.key")
    os.chmod(keys / "trust.key", 0o600)
    result = run_child(tmp, native_pkg["build_dir"], 2, tmp / "fresh.pt", "--reduce-overhead",
                       CXX=str(tmp_path / "missing" / "g++"), PATH=f"{no_tools}{os.pathsep}{os.path.dirname(sys.executable)}",
                       SUPERKERNEL_CACHE_DIR=str(tmp_path / "empty_cache"))
    assert result["compiler_available"] is False
    assert result["static"]["native_loaded"] == 1 and not result["static"].get("native_built")
    assert result["realizations"] == ["cpu-native"], result["stderr"][-2000:]
    assert result["packages"] == [] and not result["notices"] and not result["warnings"]
    assert not (tmp_path / "empty_cache" / "native_cpu").exists()  # nothing was built or cached here
    out = torch.load(tmp / "fresh.pt")
    assert torch.equal(out["y"], native_pkg["y"]) and torch.equal(out["y"], out["ref"])
    assert torch.equal(out["y"], out["y2"])


def test_a_module_built_for_another_abi_is_not_loaded(native_pkg, tmp_path):
    """A (signed) package whose module was built for another torch is used for nothing but the notice."""
    import shutil

    build_dir = tmp_path / "build"
    shutil.copytree(native_pkg["build_dir"], build_dir)
    (path,) = find_packages(build_dir)
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    manifest = json.loads(members["manifest.json"])
    for entry in manifest["native"].values():
        entry["abi"]["torch"] = "0.0.0-other"
    members["manifest.json"] = json.dumps(manifest).encode()
    members["signature"] = trust.sign(members["manifest.json"]).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    reset_workspaces()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: a notice
        compiled, y = _compile(build_dir)
    realizations = _realizations(compiled)
    torch._dynamo.reset()
    static = superkernel.pipeline.backend.find_backend(compiled).static_kernels
    assert static.counters["native_abi_mismatch"] == 1 and not static.counters["native_loaded"]
    (notice,) = static.notices
    assert "built for another torch/Python ABI (torch differs (package: '0.0.0-other'" in notice and "\n" not in notice
    assert realizations == ["cpu-native"]  # the module this process built (it has a compiler), not the package's
    assert torch.equal(y, native_pkg["ref"])
    assert find_packages(build_dir) == [path]  # a normal run does not rewrite the package
