"""Shared test setup: CUDA tests are skipped where CUDA is absent; Dynamo is reset per test; the slowest
test files are collected first."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_configure(config):
    # pytest-xdist workers get COLUMNS=80/LINES=24; a terminal may export others. The CLI's
    # console follows COLUMNS, so tests that read its output see one layout everywhere.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
    if config.pluginmanager.hasplugin("xdist"):
        # xdist's --dist loadfile otherwise hands files out by their number of tests, ignoring SLOW_FIRST
        # (what its --no-loadscope-reorder sets; here so that every -n run keeps the order)
        config.option.loadscopereorder = False


#: Test files in the order of their cold summed time (a suite run of 2026-12-02, 2 workers, empty caches;
#: the heaviest first). ``--dist loadfile`` hands files to workers in collection order, so starting with the
#: longest keeps the last minutes from being one long file on one worker while the other waits (largest
#: first: simulated on that run's times, 882 s -> 870 s of the busier worker). Only an order: a file not
#: listed runs after these in its usual place; tests/layout/test_suite_order.py checks every name still exists.
#: xdist follows it only with its reorder off (pytest_configure turns it off): by default it hands files out
#: by their number of tests, and this order had no effect until 2026-12-06 (a cold run on EPYC-Z4 with it in
#: effect: 674 s of pytest against 716 s without, the same day, the workers ending 1.5 s apart).
SLOW_FIRST = (
    "workflow/test_wf_quality.py", "workflow/test_wf_quantize_auto.py", "workflow/test_wf_optimize.py", "workflow/test_wf_registry.py", "static_kernel/test_frames.py",
    "workflow/test_wf_docs.py", "distributed/test_dist_optimize.py", "workflow/test_wf_analyze.py",
    "static_kernel/test_build_and_load.py", "static_kernel/test_compiler.py", "quant/test_quant_workflow.py",
    "backend/test_realize_cpu.py", "quant/test_quantize.py", "workflow/test_wf_generate.py",
    "distributed/test_dist_static.py", "static_kernel/test_quantized_package.py", "backend/test_native_cpu.py",
    "backend/test_frozen_code.py", "static_kernel/test_docs_example.py", "static_kernel/test_precompiled_step.py",
    "backend/test_hf_llama.py", "backend/test_autotune_builds.py", "workflow/test_wf_gguf.py",
)
TESTS = os.path.dirname(os.path.abspath(__file__))


def _slow_first(items) -> None:
    """Reorder ``items`` in place: files of :data:`SLOW_FIRST` in its order, then the rest as collected; the
    tests of one file keep their order."""
    rank = {os.path.join(TESTS, name): i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))  # (a stable sort)


def pytest_collection_modifyitems(config, items):
    _slow_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (no NVIDIA GPU on this machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
