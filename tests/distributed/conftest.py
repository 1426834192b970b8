"""A one-layer dense and a two-layer dense + MoE checkpoint, written once per test session for the 2-rank jobs here."""

from __future__ import annotations

import pytest

from ._helpers import checkpoint


@pytest.fixture(scope="session")
def dense_checkpoint(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("dense"), "dense")


@pytest.fixture(scope="session")
def hybrid_checkpoint(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("hybrid"), "hybrid")
