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


def test_the_step_replays_as_one_graph_bit_exact_outputs_copied_out_new_shapes_recapture():
    x, w = make_inputs()
    ro, ref = compile_plan(scoped, "reduce-overhead"), compile_plan(scoped, "reduce-overhead", run_eagerly=True)
    cache_a, cache_b = torch.zeros(8, 64, device="cuda"), torch.zeros(8, 64, device="cuda")
    outputs = []
    for step in range(5):  # first call warms up and captures; later calls replay
        pos = torch.tensor([step], device="cuda")
        x_in = x + step
        before = x_in.clone()
        a, b = ro(x_in, w, cache_a, pos), ref(x_in, w, cache_b, pos)
        assert torch.equal(a, b)
        assert torch.equal(cache_a, cache_b)  # the in-place write reached the caller's buffer
        assert torch.equal(x_in, before)  # the caller's input is never written (private static buffers)
        outputs.append(a)
    # outputs stay valid after later calls (copied out of the graph's buffers once)
    for step, out in enumerate(outputs):
        assert not torch.equal(out, outputs[(step + 1) % len(outputs)])
    x2, _ = make_inputs(rows=6)
    assert torch.equal(ro(x2, w, cache_a, torch.tensor([1], device="cuda")),
                       ref(x2, w, cache_b, torch.tensor([1], device="cuda")))
    ex = sk.explain(ro)
    assert {s.realization for s in ex.segments} == {"cuda-graph"} and not ex.fallbacks
    first, second = ex.graphs  # static shapes: Dynamo compiles the new shape as a graph of its own
    (cg,) = first.cuda_graphs
    assert cg.status == "captured" and cg.captures == 1 and cg.recaptures == 0 and cg.replays == 4, cg.describe()
    (cg2,) = second.cuda_graphs
    assert cg2.status == "captured" and cg2.captures == 1


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
    ex = sk.explain(ro_fn)
    assert [s.realization for s in ex.segments] == ["cuda-graph"]
    (cg,) = ex.graphs[0].cuda_graphs  # embedding, rotary, mask, layers, norm and head: one graph
    assert cg.status == "captured" and cg.copied_bytes_per_replay < 1024, cg.describe()


def host_synced(x):
    with sk.super_kernel("seg"):
        h = torch.histc(x, bins=4)  # min = max = 0: the range is read from the data on the host (a sync)
        return h * 2 + x.sum()


def test_an_operator_that_syncs_is_cut_and_the_step_splits_around_it():
    x, _ = make_inputs()
    ro = compile_plan(host_synced, "reduce-overhead")
    ref = compile_plan(host_synced, "reduce-overhead", run_eagerly=True)
    for _ in range(3):
        assert torch.equal(ro(x), ref(x))
    ex = sk.explain(ro)
    assert any("histc" in c.op for c in ex.cuts) and not ex.fallbacks


def _runner(fn, check_syncs):
    from superkernel.ir.graph import CaptureInfo
    from superkernel.runtime.cuda.driver import CudaDriver
    from superkernel.runtime.cuda.graph_runner import GraphRunner

    driver, problems = CudaDriver(), []
    device = torch.device("cuda")
    runner = GraphRunner(fn, CaptureInfo("deliberate", ["seg"]), device=device, pool=driver.new_pool(device),
                         driver=driver, on_problem=problems.append, check_syncs=check_syncs)
    return runner, driver, problems


def syncs(x):
    return (x * float(x.sum().item()),)  # .item(): a host sync, which a capture cannot hold


def test_the_sync_check_hears_a_host_sync_and_leaves_the_part_uncaptured():
    runner, _, problems = _runner(syncs, check_syncs=True)
    x, _ = make_inputs()
    for _ in range(3):
        assert torch.equal(runner(x)[0], syncs(x)[0])
    assert runner.info.status.startswith("uncaptured: it synchronizes") and runner.info.failed_captures == 0
    assert problems and "synchronizes" in problems[0]


def test_a_deliberate_failed_capture_leaves_the_process_and_the_next_capture_healthy():
    bad, driver, problems = _runner(syncs, check_syncs=False)  # no sync check: the capture itself fails
    x, w = make_inputs()
    for _ in range(3):
        assert torch.equal(bad(x)[0], syncs(x)[0])
    assert bad.info.failed_captures == 1 and "capture failed" in problems[0], problems
    print("after the failed capture:", problems[0])
    assert driver.health_problem(torch.device("cuda")) is None
    torch.randn(16, device="cuda")  # the CUDA generators are out of capture mode
    # a new graph captures and replays correctly after it
    good, good_ref = compile_plan(scoped, "reduce-overhead"), compile_plan(scoped, "reduce-overhead", run_eagerly=True)
    ca, cb = torch.zeros(8, 64, device="cuda"), torch.zeros(8, 64, device="cuda")
    for step in range(3):
        pos = torch.tensor([step], device="cuda")
        assert torch.equal(good(x, w, ca, pos), good_ref(x, w, cb, pos))
    (cg,) = sk.explain(good).graphs[0].cuda_graphs
    assert cg.status == "captured" and cg.replays == 2
    torch.cuda.synchronize()
