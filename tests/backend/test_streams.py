"""stream-fusion=1: stream assignment (checked on CPU graphs) and multi-stream capture (CUDA)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import superkernel as sk
from superkernel.runtime.cuda.streams import assign_streams, num_streams


def qkv(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv  # three independent branches
    return (q.relu() + k.sigmoid()) * v.tanh()


def test_independent_branches_get_their_own_streams_and_chains_stay_together():
    gm = make_fx(qkv)(*[torch.randn(4, 4) for _ in range(4)])
    assignment = assign_streams(gm)
    by_name = {n.name: s for n, s in assignment.items()}
    mms = [by_name[n] for n in ("mm", "mm_1", "mm_2")]
    assert len(set(mms)) == 3
    assert by_name["relu"] == by_name["mm"] and by_name["sigmoid"] == by_name["mm_1"] and by_name["tanh"] == by_name["mm_2"]
    assert num_streams(assignment) == 3


def test_a_chain_uses_one_stream():
    gm = make_fx(lambda x: x.sin().cos().exp())(torch.randn(3))
    assert num_streams(assign_streams(gm)) == 1


def test_stream_count_is_bounded():
    def wide(x):
        return sum(x * float(i) for i in range(10))

    gm = make_fx(wide)(torch.randn(3))
    assert num_streams(assign_streams(gm, max_streams=2)) <= 2


@pytest.mark.cuda
def test_stream_fusion_segment_is_bit_exact_on_cuda():
    def f(x, wq, wk, wv):
        with sk.super_kernel("attn", "stream-fusion=1"):
            return qkv(x, wq, wk, wv)

    args = [torch.randn(64, 64, device="cuda") for _ in range(4)]
    ro = sk.compile(f, sk.CompilerConfig.from_dict({"mode": "reduce-overhead"}))
    ref = sk.compile(f, sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "debug": {"run_eagerly": True}}))
    for _ in range(3):
        assert torch.equal(ro(*args), ref(*args))
    (segment,) = sk.explain(ro).segments
    assert segment.realization == "cuda-graph+3streams" and segment.fallback is None
