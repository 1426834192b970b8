"""CI subset of the architecture sweep (benchmarks/hf_sweep.py runs all of them).

One family per recompile cause the sweep found: a sliding window whose Python int grew every
step (mistral), a mask and position ids growing with the position (OPT). For each: the superkernel reduce-overhead plan is
bit-identical to its exactness reference, and Dynamo compiles the step once — 0
recompiles during the timed steps, measured from Dynamo's own records.
"""

from __future__ import annotations

import pytest
import torch

import superkernel
from superkernel.tools.advisor.compiling import compile_superkernel
from superkernel.tools.advisor.strategies import plan_for
from superkernel.tools.advisor.structure import analyze_structure
from superkernel.tools.decode import prepare, run_decode
from superkernel.tools.models.archs import ARCHS, CI_SUBSET, build


def test_the_sweep_covers_at_least_twenty_architectures_of_every_kind():
    assert len(ARCHS) >= 20
    tags = {t for a in ARCHS.values() for t in a.tags}
    assert {"sliding", "hybrid", "moe", "mla", "parallel", "chunked", "linear"} <= tags
    for name in ("mistral", "gemma2", "gemma3_text", "mixtral", "qwen2_moe", "deepseek_v3", "gpt_neox", "phi",
                 "opt", "gpt2", "llama", "qwen3"):
        assert name in ARCHS


@pytest.mark.parametrize("arch", CI_SUBSET)
def test_reduce_overhead_is_bit_exact_and_compiles_once(arch):
    model = build(arch)
    session = prepare(model, prompt_len=20, steps=3, warmup=2, seed=0)  # window 16 < 20: it rolls
    eager = run_decode(session, session.step_fn())
    assert torch.equal(run_decode(session, session.step_fn()).logits, eager.logits)
    scopes = plan_for("all_layers", analyze_structure(model)).scopes  # model.layers.* / model.decoder.layers.*
    superkernel.apply_scopes(model, scopes)
    try:
        ref_step, _ = compile_superkernel(session, "reduce-overhead", run_eagerly=True)
        reference = run_decode(session, ref_step)
        step, backend = compile_superkernel(session, "reduce-overhead")
        plan = run_decode(session, step)
        ex = superkernel.explain(backend)  # before torch._dynamo.reset(), which resets the backend too
    finally:
        superkernel.remove_scopes(model)
        torch._dynamo.reset()
    assert torch.equal(plan.logits, reference.logits)
    for run in (reference, plan):
        assert run.dynamo.recompiles_warmup == run.dynamo.recompiles_timed == 0, run.dynamo.reasons
        assert not run.dynamo.limit_hit and run.dynamo.graph_breaks_first == 0, run.dynamo.break_reasons
    assert len(ex.graphs) == 1 and ex.segments and all(s.scope == "all_layers" for s in ex.segments)
    torch.testing.assert_close(plan.logits, eager.logits, rtol=0, atol=1e-4)


def test_analyze_lists_the_guard_that_would_recompile():
    from superkernel.tools.advisor.analysis import recompile_guards

    session = prepare(build("mistral"), prompt_len=8, steps=3, warmup=1, seed=0)
    guards, with_harness, _ = recompile_guards(session)
    assert guards and "cumulative_length_int" in guards[0] and "dynamic source" in guards[0]
    assert with_harness == 0
