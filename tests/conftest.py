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


def pytest_collection_modifyitems(config, items):
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
