"""Every peer is checked on every round, each on a fresh cache with another prompt.

A compiled peer that folds the cache it was compiled with (Inductor freezing did, per
issue 24) is right on its first run and wrong on a user's next cache. The stale peer
below is such a step for real: it keeps reading the cache it was built with, not the
fresh one every other plan gets. The decode benchmark must mark it WRONG on every timed
round and keep it out of the ratios, while eager, plain torch.compile and freezing pass.
"""

from __future__ import annotations


import pytest
import torch

from superkernel.tools.decode import prepare, run_decode
from superkernel.tools.peer_check import PeerCheck, peer_tolerance
from tests._benchmarks import load_benchmark


def _bench_module():
    return load_benchmark("decode_latency")


def test_decode_benchmark_flags_a_peer_wrong_on_a_fresh_cache(llama):
    dl = _bench_module()
    model = llama.model
    session = prepare(model, prompt_len=6, steps=3, warmup=1, seed=0)
    torch._dynamo.reset()
    eager = dl.Plan("eager", lambda fn: fn)
    freezing = dl.inductor_plan("torch.compile freezing", options={"freezing": True})
    stale = dl.Plan("stale cache", lambda fn: fn)
    for i, plan in enumerate((eager, freezing)):
        plan.step = plan.make(dl.own_code(dl.step_for(session, model, plan), f"test{i}"))
        session.restore_cache()
        plan.first = run_decode(session, plan.step)
    stale.step = session.step_fn()          # bound to the cache it started with, whatever the user passes
    stale.first = run_decode(session, stale.step)
    assert torch.equal(stale.first.logits, eager.first.logits)  # right on the first run, like freezing was
    live = [eager, freezing, stale]
    dl.time_rounds(session, live, 2, {}, peer_tolerance(torch.float32), log=lambda line: None)
    torch._dynamo.reset()
    assert stale.check.wrong and stale.check.wrong_rounds == [0, 1]
    assert "WRONG in round(s) 1, 2 of 2" in stale.check.summary()
    assert not eager.check.wrong and eager.check.worst.max_abs == 0
    assert not freezing.check.wrong, freezing.check.summary()  # on torch 2.13 / transformers 5.23 it is right


def test_peer_check_tolerance_and_rounds():
    check = PeerCheck(peer_tolerance(torch.float32))
    ref = torch.tensor([[1.0, 5.0], [2.0, 0.5]])
    assert check.check(ref + 1e-4, ref)                      # rounding: within 1e-3 x 5
    assert not check.check(ref + torch.tensor([[0.0, 0.7], [0.0, 0.0]]), ref)
    assert check.rounds == 2 and check.wrong_rounds == [1]
    assert check.to_dict()["wrong_rounds"] == [2]
    assert peer_tolerance(torch.bfloat16) > peer_tolerance(torch.float16) > peer_tolerance(torch.float32)


@pytest.mark.parametrize("model_type", ["mamba", "recurrent_gemma"])
def test_a_fresh_cache_of_a_recurrent_model_decodes_what_the_session_decodes(model_type):
    """The fresh cache goes under the model's cache keyword (Mamba: ``cache_params``, ``cache`` from transformers 5.24) and its
    prefill sets the state the model keeps on its modules (RecurrentGemma): with the session's
    own prompt, the holder's decode equals the session's; with another prompt it differs."""
    from superkernel.tools.fresh_cache import CacheHolder, fresh_cache, holder_step
    from superkernel.tools.models.registry import build_tiny

    model = build_tiny(model_type)
    session = prepare(model, prompt_len=6, steps=2, warmup=1, seed=0)
    reference = run_decode(session, session.step_fn())
    holder = CacheHolder(fresh_cache(session))
    same = run_decode(session, holder_step(session, holder))
    holder.cache = fresh_cache(session, seed=7)
    other = run_decode(session, holder_step(session, holder))
    assert torch.equal(same.logits, reference.logits)
    assert not torch.equal(other.logits, reference.logits)
