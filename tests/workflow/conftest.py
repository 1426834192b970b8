"""Shared fixtures of the workflow tests: each tiny model is built once per session.

The expensive things (model builds, one end-to-end ``superkernel optimize`` run) are
session-scoped; tests that apply scopes must remove them again (``remove_scopes``).
"""

from __future__ import annotations

import json

import pytest
import torch

from superkernel.tools.models import load_model

from .wf_helpers import E2E_SHAPES, ZOO_NAMES, run_cli


@pytest.fixture(scope="package", autouse=True)
def _threads():
    """One thread, as the CLI picks for the tiny zoo on CPU (it sets it in-process); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def zoo():
    """Zoo name -> LoadedModel, built once (do not change weights; remove scopes you apply)."""
    return {name: load_model(name) for name in ZOO_NAMES}


@pytest.fixture(scope="session")
def llama(zoo):
    return zoo["llama-tiny"]


@pytest.fixture(scope="session")
def llama_session(llama):
    from superkernel.tools.decode import prepare

    return prepare(llama.model, prompt_len=8, steps=3, warmup=1, seed=0)  # = E2E_SHAPES


@pytest.fixture(scope="session")
def e2e(tmp_path_factory):
    """One real ``superkernel optimize`` run on llama-tiny: attention strategy, both modes, few steps.

    At ``E2E_SHAPES`` (prompt 8, 1 warm-up + 3 steps), as ``llama_session`` and the other llama-tiny CLI runs.
    """
    out = tmp_path_factory.mktemp("optimize_out")
    result = run_cli("optimize", "--model", "llama-tiny", "--strategy", "attention", *E2E_SHAPES, "--output", str(out),
                     "--quiet")
    data = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
    return result, out, data
