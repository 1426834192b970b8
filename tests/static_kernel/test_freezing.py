"""Static kernels with CPU max-autotune keep the plain-vs-frozen choice: the build compiles a partition
both ways and keeps its choice; the package records it but carries the plain kernel only (a frozen
kernel's weights are constants, see docs/static_kernel.md), so a loading process runs plain and says so."""

from __future__ import annotations

import torch

import superkernel
from superkernel import CompilerConfig
from superkernel.static_kernel import find_packages, read_manifest
from superkernel.static_kernel.workspace import reset_workspaces
from tests._env import environ
from tests.static_kernel._child import Tiny


def _compile(build_dir):
    torch.manual_seed(0)
    model = Tiny().eval()
    cfg = CompilerConfig.from_dict({"mode": "max-autotune", "inductor": {"freezing": True, "gemm_templates": False}})
    cfg.experimental_config.static_kernel.enable = True
    cfg.experimental_config.static_kernel.build_dir = str(build_dir)
    compiled = superkernel.compile(model, cfg)
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y, eager = compiled(x), model(x)
    backend = superkernel.pipeline.backend.find_backend(compiled)
    realizations = [s.realization for g in superkernel.explain(compiled).graphs for s in g.segments]
    counters = dict(backend.counters)
    torch._dynamo.reset()  # (forgets the backend's explanation and counters too)
    return y, eager, realizations, counters, backend.static_kernels


def test_the_frozen_choice_is_recorded_and_a_loading_process_runs_the_plain_kernel(tmp_path):
    with environ(SUPERKERNEL_STATIC_VERIFY="0"):  # (the fresh-process load check is covered elsewhere)
        reset_workspaces()
        torch._dynamo.reset()
        y, eager, realizations, counters, static = _compile(tmp_path)
        assert realizations == ["inductor-cpp+frozen"] and static.counters["compiled"] >= 1
        assert counters["partitions_frozen"] == 1
        torch.testing.assert_close(y, eager, rtol=1e-4, atol=1e-5)
        (path,) = find_packages(tmp_path)
        records = [a.get("freezing") for a in read_manifest(path).artifacts.values()]
        assert {"chosen": "frozen", "timings_ms": {}} in records  # (freezing=True: chosen without timing)

        reset_workspaces()  # as a new process would: the partitions come from the package
        y2, eager2, realizations2, counters2, static2 = _compile(tmp_path)
    assert static2.counters["loaded"] >= 1 and not static2.counters["compiled"]
    assert not counters2.get("partitions_frozen")  # no frozen variant compiled at load
    assert realizations2 == ["inductor-cpp+plain-from-package"]
    (notice,) = [n for n in static2.notices if "frozen" in n]
    assert "the package carries the plain kernel only" in notice and "\n" not in notice
    torch.testing.assert_close(y2, eager2, rtol=1e-4, atol=1e-5)
