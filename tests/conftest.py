"""Shared test setup: CUDA tests are skipped where CUDA is absent; Dynamo is reset per test."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_configure(config):
    # pytest-xdist workers get COLUMNS=80/LINES=24; a terminal may export others. The CLI's
    # console follows COLUMNS, so tests that read its output see one layout everywhere.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


#: the files that take longest on a cold run (``--durations`` of 2026-11-27, 2 cores), started first: pytest-xdist
#: hands out whole files in collection order, so a long file collected last keeps one worker busy while the
#: other idles (the tail of a cold run was ~45 s over half the summed test time)
SLOW_FIRST = (
    "static_kernel/test_frames.py", "workflow/test_wf_registry.py", "distributed/test_dist_optimize.py",
    "workflow/test_wf_optimize.py", "static_kernel/test_compiler.py", "workflow/test_wf_analyze.py",
    "static_kernel/test_build_and_load.py", "static_kernel/test_quantized_package.py", "backend/test_scope.py",
    "workflow/test_wf_generate.py", "quant/test_quant_workflow.py", "workflow/test_wf_docs.py",
)


def _slow_rank(item) -> int:
    path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
    return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_slow_rank)  # stable: the order within a file, and of the other files, is kept
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
