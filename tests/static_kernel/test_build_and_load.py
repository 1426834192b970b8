"""End to end through the backend, in fresh processes with empty TorchInductor caches."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import torch

from superkernel.static_kernel.package import find_packages, read_manifest, sha256

from .conftest import run_child

RECORD_NAME = re.compile(r"^[A-Za-z0-9._-]+_[a-z0-9]+_(ND|NHWC|STRIDED|[A-Z_]+)_[0-9x_a-z]+_\d+\.json$")


def test_build_writes_records_and_one_package(built):
    result = built["result"]
    assert result["static"]["compiled"] >= 2  # the scope segment and the unscoped rest
    assert result["static"].get("loaded", 0) == 0
    packages = find_packages(built["build_dir"])
    assert len(packages) == 1 and [str(packages[0])] == result["packages"]
    run_dir = packages[0].parent
    assert re.match(r"^\d{14,}_\d+_outputs$", run_dir.name)
    pid = run_dir.name.split("_")[1]
    records, debug = run_dir / pid, run_dir / f"{pid}_debug"
    names = sorted(p.name for p in records.glob("*.json"))
    assert names and names == sorted(p.name for p in debug.glob("*.json"))
    assert all(RECORD_NAME.match(n) for n in names), names
    # the two identical linears share one record (deduplicated by content), seen twice
    addmm = [n for n in names if n.startswith("addmm_float32_ND_32_2x32_32x32_")]
    assert addmm == ["addmm_float32_ND_32_2x32_32x32_0.json"]
    full = json.loads((debug / addmm[0]).read_text())
    assert full["count"] == 2 and {o["scope"] for o in full["occurrences"]} == {"blk"}
    rec = json.loads((records / addmm[0]).read_text())
    assert rec["op"] == "addmm" and "occurrences" not in rec
    shapes = [a["tensor"]["shape"] for a in rec["args"] if isinstance(a, dict)]
    assert shapes == [[32], [2, 32], [32, 32]]
    assert {a["tensor"]["dtype"] for a in rec["args"] if isinstance(a, dict)} == {"float32"}
    contents = [(records / n).read_text() for n in names]
    assert len(set(contents)) == len(contents)  # no two files hold the same record


def test_the_build_keeps_the_isa_probes_it_packages_or_started_from_kept_ones(built):
    """This run's builds share one cache: the first to write a package keeps TorchInductor's ISA probes, the
    others start from them; either way the package carries them and the store holds what it carries."""
    from superkernel.cache_dir import private_cache_dir
    from superkernel.static_kernel import isa_probes

    static = built["result"]["static"]
    assert static.get("isa_probes_kept", 0) + static.get("isa_probes_seeded", 0) >= 2, static
    kept = {name.split("/")[1] for name in isa_probes.probes(private_cache_dir() / "isa_probes")}
    (package,) = find_packages(built["build_dir"])
    carried = {Path(name).name for name in read_manifest(package).kernels}
    assert {name for name in kept if name.endswith(".so")} <= carried


def test_manifest_is_complete(built):
    pkg = read_manifest(find_packages(built["build_dir"])[0])
    m = pkg.manifest
    env = m["environment"]
    assert env["torch"] == torch.__version__ and "python" in env and "triton" in env
    assert env["device_kind"] == "cpu" and env["device_capability"]
    assert m["config_fingerprint"] and m["inductor_options"]["cpp_wrapper"] is True
    assert len(m["graphs"]) == 1
    (graph,) = m["graphs"].values()
    assert graph["names"] == ["graph_0"] and len(graph["variants"]) == 1
    assert [2, 32] in [v["tensor"]["shape"] for v in graph["variants"][0] if isinstance(v, dict)]
    assert len(m["artifacts"]) >= 2
    for key, art in m["artifacts"].items():
        assert art["file"] == f"artifacts/{key}.bin" and art["inputs"]
        assert art["graph"] in m["graphs"]
    with zipfile.ZipFile(pkg.path) as zf:
        names = set(zf.namelist()) - {"manifest.json", "signature"}
        assert names == set(m["files"])
        for name, meta in m["files"].items():
            data = zf.read(name)
            assert sha256(data) == meta["sha256"] and len(data) == meta["size"]
    assert any(n.startswith("kernels/") and n.endswith(".so") for n in m["files"])


def test_fresh_process_loads_without_compiling_and_matches(built):
    tmp = built["tmp"]
    result = run_child(tmp, built["build_dir"], 2, tmp / "load_out.pt")
    assert result["static"]["loaded"] >= 2
    assert result["static"].get("compiled", 0) == 0 and result["static"].get("fallback", 0) == 0
    assert result["cpp_builds"] == 0, "loading a package must not start any C++ compilation"
    assert result["packages"] == [] and len(find_packages(built["build_dir"])) == 1
    built_out, loaded_out = torch.load(built["out"]), torch.load(tmp / "load_out.pt")
    assert torch.equal(built_out["y"], loaded_out["y"])  # the very same kernels
    assert torch.equal(loaded_out["y"], loaded_out["y2"])
    torch.testing.assert_close(loaded_out["y"], loaded_out["eager"], rtol=1e-4, atol=1e-5)
    # the package's kernels give what the normal compile path gives (static kernels off); compiled here, in
    # this process, rather than in a third child with an empty cache: the fresh process is the loading one
    normal_y, backend = _normal_compile(batch=2)
    assert not backend.static_kernels.enabled and backend.counters["graphs"] >= 1
    torch.testing.assert_close(loaded_out["y"], normal_y, rtol=1e-5, atol=1e-6)


def _normal_compile(batch: int):
    """The child's model and input (``_child.py``: same seeds) through ``superkernel.compile`` without static
    kernels, in this process."""
    import superkernel
    from superkernel.pipeline.backend import find_backend

    from ._child import Tiny

    torch.manual_seed(0)
    model = Tiny().eval()
    cfg = superkernel.CompilerConfig()
    cfg.inductor.freezing = False  # as the child compiles it
    compiled = superkernel.compile(model, cfg)
    x = torch.randn(batch, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = compiled(x)
    return y, find_backend(compiled)


def test_shape_not_in_package_falls_back_with_notice(built):
    tmp = built["tmp"]
    result = run_child(tmp, built["build_dir"], 3, tmp / "other_out.pt")
    assert result["static"]["fallback"] >= 1 and result["static"].get("compiled", 0) == 0
    assert len(result["notices"]) == 1 and "\n" not in result["notices"][0]  # one line per graph
    assert "shapes not in package" in result["notices"][0]
    assert [line for line in result["stderr"].splitlines() if "shapes not in package" in line] == result["notices"]
    assert len(find_packages(built["build_dir"])) == 1  # a normal run does not rewrite the package
    out = torch.load(tmp / "other_out.pt")
    torch.testing.assert_close(out["y"], out["eager"], rtol=1e-4, atol=1e-5)


# (test_two_processes_one_build_dir is in test_frames.py: its build is the package the frame tests load)
