"""CUDA realization: one CUDA graph per segment, bit-exact, replayed; new shapes recapture.

Marked ``cuda``: skipped where no NVIDIA GPU is present (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
from superkernel.hf_cache_names import cache_keyword

pytestmark = pytest.mark.cuda


def scoped(x, w, cache, pos):
    with sk.super_kernel("seg"):
        h = torch.nn.functional.silu(x @ w) * 2
        cache.index_copy_(0, pos, h[:1])  # in-place write into a persistent buffer (like a KV cache)
        y = h + cache.sum(0)
    return y.softmax(-1)


def make_inputs(rows=4, dim=64):
    g = torch.Generator(device="cuda").manual_seed(0)
    return (torch.randn(rows, dim, device="cuda", generator=g), torch.randn(dim, dim, device="cuda", generator=g))


def compile_plan(fn, mode, run_eagerly=False):
    cfg = sk.CompilerConfig.from_dict({"mode": mode, "debug": {"run_eagerly": run_eagerly}})
    return sk.compile(fn, cfg)


def test_cuda_graph_segments_bit_exact_repeated_and_new_shapes():
    x, w = make_inputs()
    ro, ref = compile_plan(scoped, "reduce-overhead"), compile_plan(scoped, "reduce-overhead", run_eagerly=True)
    cache_a, cache_b = torch.zeros(8, 64, device="cuda"), torch.zeros(8, 64, device="cuda")
    outputs = []
    for step in range(5):  # first call warms up and captures; later calls replay
        pos = torch.tensor([step], device="cuda")
        a, b = ro(x + step, w, cache_a, pos), ref(x + step, w, cache_b, pos)
        assert torch.equal(a, b)
        assert torch.equal(cache_a, cache_b)  # the in-place write reached the caller's buffer
        outputs.append(a)
    # outputs stay valid after later calls (they are not the graph's static buffers)
    for step, out in enumerate(outputs):
        assert not torch.equal(out, outputs[(step + 1) % len(outputs)])
    x2, _ = make_inputs(rows=6)
    assert torch.equal(ro(x2, w, cache_a, torch.tensor([1], device="cuda")),
                       ref(x2, w, cache_b, torch.tensor([1], device="cuda")))
    ex = sk.explain(ro)
    assert {s.realization for s in ex.segments} == {"cuda-graph"} and not ex.fallbacks
    backend = sk.backend.find_backend(ro)
    assert backend.counters["segments_cuda_graph"] >= 2


def test_cuda_graph_replays_without_relaunching_kernels():
    x, w = make_inputs()
    ro = compile_plan(scoped, "reduce-overhead")
    cache = torch.zeros(8, 64, device="cuda")
    pos = torch.tensor([0], device="cuda")
    ro(x, w, cache, pos)
    ro(x, w, cache, pos)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ro(x, w, cache, pos)
    names = {e.name for e in prof.events()}
    assert "aten::mm" not in names  # the segment's kernels come from the graph replay


def test_max_autotune_on_cuda_within_tolerance():
    x, w = make_inputs()
    ma = compile_plan(scoped, "max-autotune")
    ref = compile_plan(scoped, "reduce-overhead", run_eagerly=True)
    ca, cb = torch.zeros(8, 64, device="cuda"), torch.zeros(8, 64, device="cuda")
    for step in range(3):
        pos = torch.tensor([step], device="cuda")
        torch.testing.assert_close(ma(x, w, ca, pos), ref(x, w, cb, pos), rtol=1e-3, atol=1e-4)
    assert {s.realization for s in sk.explain(ma).segments} == {"inductor-triton+cuda-graph"}


def test_hf_llama_decode_on_cuda_bit_exact():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval().cuda()
    sk.apply_scopes(model, {"decode_layers": "model.layers.*"})

    def step(ids, pos, cache):
        return model(input_ids=ids, cache_position=pos, use_cache=True, **{cache_keyword(model): cache}).logits

    def run(fn):
        cache = transformers.StaticCache(config=config, max_cache_len=16, device="cuda")
        out = []
        with torch.no_grad():
            model(input_ids=torch.arange(4, device="cuda")[None], cache_position=torch.arange(4, device="cuda"),
                  use_cache=True, **{cache_keyword(model): cache})
            for i in range(4):
                out.append(fn(torch.tensor([[5 + i]], device="cuda"), torch.tensor([4 + i], device="cuda"), cache))
        return out

    ref = run(compile_plan(step, "reduce-overhead", run_eagerly=True))
    torch._dynamo.reset()
    ro_fn = compile_plan(step, "reduce-overhead")
    ro = run(ro_fn)
    assert all(torch.equal(a, b) for a, b in zip(ro, ref))
    assert [s.realization for s in sk.explain(ro_fn).segments] == ["cuda-graph"]


def host_synced(x):
    with sk.super_kernel("seg"):
        h = torch.histc(x, bins=4)  # min = max = 0: the range is read from the data on the host (a sync)
        return h * 2 + x.sum()


def test_failed_capture_falls_back_alone_and_the_next_capture_works():
    x, w = make_inputs()
    bad = compile_plan(host_synced, "reduce-overhead")
    ref = compile_plan(host_synced, "reduce-overhead", run_eagerly=True)
    for _ in range(3):  # the failed capture's call and the later ones all give the reference's result
        assert torch.equal(bad(x), ref(x))
    ex = sk.explain(bad)
    assert ex.fallbacks, "the capture should have failed (histc reads its range on the host)"
    # the process and a new graph are healthy after the failed capture
    good, good_ref = compile_plan(scoped, "reduce-overhead"), compile_plan(scoped, "reduce-overhead", run_eagerly=True)
    ca, cb = torch.zeros(8, 64, device="cuda"), torch.zeros(8, 64, device="cuda")
    for step in range(3):
        pos = torch.tensor([step], device="cuda")
        assert torch.equal(good(x, w, ca, pos), good_ref(x, w, cb, pos))
    assert {s.realization for s in sk.explain(good).segments} == {"cuda-graph"}
    torch.cuda.synchronize()
