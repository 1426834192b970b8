"""The CUDA rows' bookkeeping, on the CPU, through a recording FAKE of torch.cuda (tests/backend/fake_cuda.py).

These check superkernel's own logic — one graph per step, which inputs are copied and which are used in
place, recapture and its bound, copy-out, a part that syncs or fails its capture falling back alone — not
the driver: the same behaviour on a real GPU is tested in test_cuda.py (marked ``cuda``).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import superkernel as sk
from superkernel.ir.graph import CaptureInfo
from superkernel.pipeline.realize import SuperKernelFallbackWarning
from superkernel.runtime.cuda.driver import use_driver
from superkernel.runtime.cuda.graph_runner import GraphRunner
from superkernel.runtime.realizations import CudaGraphReplay, InductorCudaGraph, register, unregister
from tests.backend.fake_cuda import FakeCudaDriver

CPU = torch.device("cpu")


def layer(x, w, cache, pos):
    h = torch.nn.functional.silu(x @ w)
    cache.index_copy_(0, pos, h[:1])
    return (h + cache.sum(0),)


def runner(fn=layer, driver=None, **kw):
    driver = driver or FakeCudaDriver()
    problems: list[str] = []
    kw.setdefault("in_place", [1, 2])
    r = GraphRunner(fn, CaptureInfo("g", ["seg"]), device=CPU, pool=driver.new_pool(CPU), driver=driver,
                    on_problem=problems.append, **kw)
    return r, driver, problems


def test_first_call_warms_up_and_captures_later_calls_replay_with_private_input_buffers():
    r, driver, _ = runner()
    w, cache, ref_cache = torch.randn(8, 8), torch.zeros(4, 8), torch.zeros(4, 8)
    for step in range(4):
        x, pos = torch.randn(3, 8), torch.tensor([step])
        x_before = x.clone()
        (out,) = r(x, w, cache, pos)
        (expected,) = layer(x, w, ref_cache, pos)
        assert torch.equal(out, expected) and torch.equal(cache, ref_cache)  # the cache is written in place
        assert torch.equal(x, x_before)  # the caller's tensor is never written
    assert driver.events == ["warm-up", "capture", "replay", "replay", "replay"]
    assert r.info.captures == 1 and r.info.replays == 3 and r.info.recaptures == 0
    assert r.info.copies_per_replay == 2 and r.info.copied_bytes_per_replay == 3 * 8 * 4 + 8


def test_a_view_with_another_offset_replays_a_new_shape_or_in_place_address_recaptures():
    r, driver, _ = runner()
    w, cache = torch.randn(8, 8), torch.zeros(4, 8)
    r(torch.randn(3, 8), w, cache, torch.tensor([0]))
    big = torch.randn(10, 8)
    (out,) = r(big[5:8], w, cache, torch.tensor([1]))  # same shape, another storage offset: replay
    assert r.info.captures == 1 and driver.events[-1] == "replay"
    assert torch.equal(out, layer(big[5:8], w, cache.clone(), torch.tensor([1]))[0])
    r(torch.randn(5, 8), w, cache, torch.tensor([2]))  # new shape
    r(torch.randn(5, 8), w, torch.zeros(4, 8), torch.tensor([2]))  # the written cache moved
    assert r.info.captures == 3 and r.info.recaptures == 2
    assert any("shape" in n for n in r.info.notes) and any("address" in n for n in r.info.notes)


def test_captures_are_bounded_counted_and_warned_once():
    r, _, problems = runner(max_captures=2)
    w, cache = torch.randn(8, 8), torch.zeros(4, 8)
    for rows in (1, 2, 3, 4, 3):
        (out,) = r(torch.randn(rows, 8), w, cache, torch.tensor([0]))
        assert out.shape == (rows, 8)
    assert r.info.captures == 2 and r.info.uncaptured_calls == 3
    assert len(problems) == 1 and "2 input signatures are captured already" in problems[0]
    assert "input 0: shape/dtype" in problems[0]


def test_outputs_are_the_graphs_buffers_and_their_storages_are_owned():
    owned: set[int] = set()
    r, _, _ = runner(owned=owned)
    w, cache = torch.randn(8, 8), torch.zeros(4, 8)
    r(torch.randn(3, 8), w, cache, torch.tensor([0]))
    (a,) = r(torch.randn(3, 8), w, cache, torch.tensor([1]))
    (b,) = r(torch.randn(3, 8), w, cache, torch.tensor([2]))
    assert a is b  # the same buffer, overwritten: the step copies it out (CopyOut)
    assert a.untyped_storage().data_ptr() in owned
    assert w.untyped_storage().data_ptr() not in owned and cache.untyped_storage().data_ptr() not in owned


def test_a_part_that_synchronizes_runs_uncaptured_and_says_where():
    driver = FakeCudaDriver()

    def syncing(x, w, cache, pos):
        driver.host_sync("model.py:12")
        return layer(x, w, cache, pos)

    r, _, problems = runner(syncing, driver)
    w, cache, ref = torch.randn(8, 8), torch.zeros(4, 8), torch.zeros(4, 8)
    for step in range(3):
        x, pos = torch.randn(3, 8), torch.tensor([step])
        assert torch.equal(r(x, w, cache, pos)[0], layer(x, w, ref, pos)[0])
    assert "capture" not in driver.events and r.info.status.startswith("uncaptured: it synchronizes")
    assert r.info.uncaptured_calls == 2 and "model.py:12" in problems[0]


def test_a_failed_capture_is_repaired_falls_back_alone_and_the_next_graph_captures():
    driver = FakeCudaDriver(fail_capture=lambda args: args[0].shape[0] == 3)
    bad, _, problems = runner(driver=driver)
    good, _, _ = runner(driver=driver)
    w, cache = torch.randn(8, 8), torch.zeros(4, 8)
    for step in range(3):
        x, pos = torch.randn(3, 8), torch.tensor([step])
        assert torch.equal(bad(x, w, cache, pos)[0], layer(x, w, cache.clone(), pos)[0])
    assert driver.recovered == 1 and bad.info.failed_captures == 1 and "capture failed" in problems[0]
    good(torch.randn(2, 8), w, cache, torch.tensor([0]))
    good(torch.randn(2, 8), w, cache, torch.tensor([1]))
    assert good.info.status == "captured" and good.info.replays == 1


# -- the whole backend on the CUDA rows, run on the CPU through the fake --------------------------------------

class _FakeCudaRO(CudaGraphReplay):
    @classmethod
    def cut_reason(cls, node):  # on the CPU every tensor is a CPU tensor: the CPU-work rule would cut all
        return None


class _FakeCudaMA(InductorCudaGraph):
    @classmethod
    def cut_reason(cls, node):
        return None


@pytest.fixture
def fake_cuda_rows():
    driver = FakeCudaDriver()
    register("reduce-overhead", "cpu", _FakeCudaRO)
    register("max-autotune", "cpu", _FakeCudaMA)
    try:
        with use_driver(driver):
            yield driver
    finally:
        unregister("reduce-overhead", "cpu")
        unregister("max-autotune", "cpu")


def scoped_step(x, w, cache, pos):
    h = x * 2  # unscoped glue before
    with sk.super_kernel("a"):
        h = torch.nn.functional.silu(h @ w)
        cache.index_copy_(0, pos, h[:1])
    h = h + 1  # glue between
    with sk.super_kernel("b"):
        h = (h + cache.sum(0)).softmax(-1)
    return h


def compiled(fn, mode, run_eagerly=False):
    return sk.compile(fn, sk.CompilerConfig.from_dict({"mode": mode, "debug": {"run_eagerly": run_eagerly}}))


def test_the_step_is_one_graph_glue_included_bit_exact_and_outputs_survive_the_next_call(fake_cuda_rows):
    w = torch.randn(8, 8)
    torch._dynamo.mark_static_address(w)  # a static input (as parameters are): used in place, not copied
    ro, ref = compiled(scoped_step, "reduce-overhead"), compiled(scoped_step, "reduce-overhead", run_eagerly=True)
    ca, cb = torch.zeros(4, 8), torch.zeros(4, 8)
    outs = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", SuperKernelFallbackWarning)
        for step in range(4):
            x, pos = torch.randn(3, 8), torch.tensor([step])
            a, b = ro(x, w, ca, pos), ref(x, w, cb, pos)
            assert torch.equal(a, b) and torch.equal(ca, cb)
            outs.append((a, b))
    assert all(torch.equal(a, b) for a, b in outs)  # copied out: later replays did not overwrite them
    (graph,) = sk.explain(ro).graphs
    (cg,) = graph.cuda_graphs
    assert cg.status == "captured" and cg.replays == 3 and cg.partitions[0].startswith("unscoped")
    assert {"a", "b"} <= set(cg.partitions) and cg.copies_per_replay == 2  # x and pos; w (static) and the cache (written) in place
    assert {s.realization for s in graph.segments} == {"cuda-graph"}
    assert "CUDA graphs per call: 1" in str(sk.explain(ro))
    assert fake_cuda_rows.events.count("capture") == 1


def cut_step(x, w):
    with sk.super_kernel("a"):
        h = (x @ w).cos()  # cos: registered unfusable below, so it is cut out of the scope
        h = h * 2
    return h.relu()


def test_a_cut_splits_the_step_into_two_graphs_with_the_cut_between(fake_cuda_rows):
    from superkernel.pipeline.segments import register_unfusable, unregister_unfusable

    w = torch.randn(8, 8)
    register_unfusable(torch.ops.aten.cos, "stands for an operator a CUDA graph cannot hold")
    try:
        ro, ref = compiled(cut_step, "reduce-overhead"), compiled(cut_step, "reduce-overhead", run_eagerly=True)
        outs = []
        for _ in range(3):
            x = torch.randn(3, 8)
            a, b = ro(x, w), ref(x, w)
            assert torch.equal(a, b)
            outs.append((a, b))
    finally:
        unregister_unfusable(torch.ops.aten.cos)
    assert all(torch.equal(a, b) for a, b in outs)
    (graph,) = sk.explain(ro).graphs
    first, second = graph.cuda_graphs
    assert first.status == second.status == "captured" and first.replays == second.replays == 2
    assert graph.cuts[0].op.startswith("aten::cos") and "a_cut_" not in " ".join(first.partitions + second.partitions)
    assert second.copies_per_replay == 1  # the cut's output is a new tensor each call; the rest of the step
    # reads the first graph's buffers in place


def test_hf_llama_decode_one_graph_per_step_weights_and_cache_in_place(fake_cuda_rows):
    transformers = pytest.importorskip("transformers")
    from superkernel.hf_cache_names import cache_keyword

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config).eval()
    sk.apply_scopes(model, {"decode_layers": "model.layers.*"})

    def step(ids, pos, cache):
        return model(input_ids=ids, cache_position=pos, use_cache=True, **{cache_keyword(model): cache}).logits

    def run(fn):
        cache = transformers.StaticCache(config=config, max_cache_len=12)
        with torch.no_grad():
            model(input_ids=torch.arange(4)[None], cache_position=torch.arange(4), use_cache=True,
                  **{cache_keyword(model): cache})
            return [fn(torch.tensor([[5 + i]]), torch.tensor([4 + i]), cache) for i in range(4)]

    ref = run(compiled(step, "reduce-overhead", run_eagerly=True))
    torch._dynamo.reset()
    ro_fn = compiled(step, "reduce-overhead")
    assert all(torch.equal(a, b) for a, b in zip(run(ro_fn), ref))
    (graph,) = sk.explain(ro_fn).graphs
    (cg,) = graph.cuda_graphs
    # copied per replay: the token id, the position and what the step builds from them outside Dynamo's
    # static inputs — never a weight or the cache (those would be hundreds of bytes here, gigabytes in a 1B model)
    assert cg.status == "captured" and cg.copied_bytes_per_replay < 64, cg.describe()


def test_a_constant_cpu_scalar_stays_in_the_graph_a_changing_one_cuts_it():
    """``x * torch.tensor(0.5)``: a pointwise CUDA kernel takes a 0-dim CPU operand by value, and a constant
    has the same value at every replay; a 0-dim CPU *input* may change between calls, so it cuts."""
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from superkernel.runtime.realizations.cuda_rows import cpu_in_cuda_reason

    mode = FakeTensorMode()

    def fake(shape, device):  # a fake tensor that says it is on a GPU: no GPU needed to label one
        return FakeTensor(mode, torch.empty(shape, device="meta"), torch.device(device))

    aten = torch.ops.aten
    g = fx.Graph()
    x, s = g.placeholder("x"), g.placeholder("s")
    x.meta["val"], s.meta["val"] = fake((3,), "cuda:0"), fake((), "cpu")
    c = g.get_attr("_tensor_constant0")
    c.meta["val"] = fake((), "cpu")
    lift = g.call_function(aten.lift_fresh_copy.default, (c,))
    lift.meta["val"] = fake((), "cpu")
    by_constant = g.call_function(aten.mul.Tensor, (x, lift))
    by_input = g.call_function(aten.mul.Tensor, (x, s))
    by_constant.meta["val"] = by_input.meta["val"] = fake((3,), "cuda:0")
    copy_in = g.call_function(aten._to_copy.default, (lift,), {"device": torch.device("cuda", 0)})
    copy_in.meta["val"] = fake((), "cuda:0")
    g.output((by_constant, by_input, copy_in))
    assert cpu_in_cuda_reason(by_constant) is None
    assert "reads the CPU scalar s, which a capture would bake in" in cpu_in_cuda_reason(by_input)
    assert "(host-to-device transfer)" in cpu_in_cuda_reason(copy_in)  # not pointwise: a real copy
    assert "computes on the CPU" in cpu_in_cuda_reason(lift)  # its users include the copy
