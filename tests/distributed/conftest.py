"""One-layer dense and MoE checkpoints, written once per test session for every 2-rank job here."""

from __future__ import annotations

import pytest

from ._helpers import checkpoint


@pytest.fixture(scope="session")
def dense_checkpoint(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("dense"), "dense")


@pytest.fixture(scope="session")
def moe_checkpoint(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("moe"), "moe")
