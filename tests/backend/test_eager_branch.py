"""transformers' one-token GQA attention branch: eager's while a reduce-overhead compile or an exactness reference
traces, untouched for every other compile (pipeline/tracing.py)."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk

sdpa = pytest.importorskip("transformers.integrations.sdpa_attention")


def _branch_test(x):
    return x + (1.0 if sdpa.is_torchdynamo_compiling() else 0.0)


def _sk(mode, run_eagerly=False):
    cfg = sk.CompilerConfig.from_dict({"mode": mode, "debug": {"run_eagerly": run_eagerly}})
    return sk.compile(_branch_test, cfg)


@pytest.mark.skipif(not hasattr(sdpa, "pack_gqa"), reason="this transformers has no pack_gqa branch")
def test_only_compiles_that_must_match_eager_read_not_compiling():
    x = torch.zeros(2)
    torch._dynamo.reset()
    assert torch.equal(_sk("reduce-overhead")(x), x)  # (its first call installs the test)
    assert torch.equal(_sk("max-autotune", run_eagerly=True)(x), x)  # an exactness reference
    assert torch.equal(_sk("max-autotune")(x), x + 1)
    assert torch.equal(torch.compile(_branch_test, backend="eager")(x), x + 1)
    assert sdpa.is_torchdynamo_compiling() is False  # outside a compile: what it always answered
    ro = sk.CompilerConfig.from_dict({"mode": "reduce-overhead"})
    assert torch.equal(sk.precompile_step(_branch_test, (x,), ro)(x), x)  # an AOT precompile traces as well
    torch._dynamo.reset()
