"""The precompiled step: bit-exact, no guard tree in steady state, and every broken assumption caught.

A small decode-like step (two scoped linears writing a "KV cache" tensor in place, like a
StaticCache) compiled once with ``superkernel.precompile_step`` in reduce-overhead. Each
test breaks one thing the frame assumes and checks that the result is still right (torch's
guards accepted the change, or the guarded path ran) or that the call raised.
"""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
from superkernel.static_kernel.watch import StateWatch


class Cache:
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.k = torch.zeros(8, 16, dtype=dtype)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: Cache) -> torch.Tensor:
        with sk.super_kernel("step"):
            h = torch.relu(self.a(x))
            cache.k.index_copy_(0, pos, h)
            return self.b(h) + cache.k.sum(0)


def make_step(model: Net, cache: Cache):
    def step(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return model(x, pos, cache)
    return step


def ro(**debug) -> sk.CompilerConfig:
    return sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "debug": debug})


def inputs(i: int, dtype: torch.dtype = torch.float32, rows: int = 1):
    gen = torch.Generator().manual_seed(i)
    return torch.randn(rows, 16, generator=gen, dtype=dtype), torch.arange(i % 8, i % 8 + rows) % 8


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model, cache = Net().eval(), Cache()
    with torch.no_grad():
        step = sk.precompile_step(make_step(model, cache), inputs(0), ro())
    return model, cache, step


def expected(model: Net, cache: Cache, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The eager result on a copy of the cache (the step under test updates the real one)."""
    shadow = Cache(cache.k.dtype)
    shadow.k = cache.k.clone()
    return model(x, pos, shadow)


def test_bit_exact_to_the_reference_and_no_guard_tree_in_steady_state(setup):
    model, cache, step = setup
    ref_cache = Cache()
    reference = torch.compile(make_step(model, ref_cache), backend=sk.get_backend(ro(run_eagerly=True)),
                              dynamic=False)
    with torch.no_grad():
        for i in range(6):
            assert torch.equal(step(*inputs(i)), reference(*inputs(i)))
    assert torch.equal(cache.k, ref_cache.k)
    assert step.guard_path == "precompiled"
    assert step.counters["guard_checks"] == 1  # the first call only; then the state watch
    assert step.counters["fallback_calls"] == 0
    assert "cpu-native" in {s.realization for s in sk.explain(step).segments}


def test_weights_changed_in_place_are_read_live(setup):
    model, cache, step = setup
    with torch.no_grad():
        step(*inputs(0))
        model.a.weight.mul_(2)  # same tensor, new values: a graph input, no guard involved
        want = expected(model, cache, *inputs(1))
        assert torch.equal(step(*inputs(1)), want)
    assert step.counters["guard_checks"] == 1


def test_new_weights_by_identity_are_checked_again(setup):
    model, cache, step = setup
    with torch.no_grad():
        old = step(*inputs(0))
        model.b.weight = torch.nn.Parameter(torch.randn(16, 16))  # another object, same shape
        want = expected(model, cache, *inputs(0))
        got = step(*inputs(0))
    assert torch.allclose(got, want, atol=1e-6) and not torch.allclose(got, old)
    assert step.counters["guard_checks"] == 2  # the watch saw the new parameter; torch's guards decided


def test_new_cache_tensor_same_layout_and_other_layout(setup):
    model, cache, step = setup
    with torch.no_grad():
        step(*inputs(0))
        cache.k = torch.ones(8, 16)  # a new cache tensor of the same layout
        want = expected(model, cache, *inputs(1))
        assert torch.equal(step(*inputs(1)), want)
        assert torch.equal(cache.k[1], torch.relu(model.a(inputs(1)[0]))[0])  # written in place, the new one
        cache.k = torch.zeros(4, 16)  # another cache length: the frame does not apply
        want = expected(model, cache, *inputs(2))
        assert torch.allclose(step(*inputs(2)), want, atol=1e-6)
    assert step.counters["fallback_calls"] == 1 and "k" in (step.last_violation or "")


def test_other_input_shape_falls_back_or_raises(setup):
    model, cache, step = setup
    with torch.no_grad():
        step(*inputs(0))
        x, pos = inputs(3, rows=2)
        want = expected(model, cache, x, pos)
        assert torch.allclose(step(x, pos), want, atol=1e-6)
    assert step.counters["fallback_calls"] == 1
    with torch.no_grad():
        strict = sk.precompile_step(make_step(model, cache), inputs(0), ro(), on_violation="error")
        strict(*inputs(0))
    with torch.no_grad(), pytest.raises(sk.PrecompiledStepError, match="breaks an assumption"):
        strict(*inputs(3, rows=2))


def test_other_dtype_weights_and_cache_fall_back(setup):
    model, cache, step = setup
    with torch.no_grad():
        step(*inputs(0))
        model.to(torch.float64)  # parameters keep their identity: only .data changes
        cache.k = cache.k.double()
        x, pos = inputs(4, dtype=torch.float64)
        want = expected(model, cache, x, pos)
        got = step(x, pos)
    assert got.dtype == torch.float64 and torch.allclose(got, want)
    assert step.counters["fallback_calls"] == 1


def test_grad_mode_is_part_of_the_assumptions(setup):
    model, cache, step = setup
    with torch.no_grad():
        step(*inputs(0))
    want = expected(model, cache, *inputs(1))
    got = step(*inputs(1))  # grad enabled now: not what the frame was built under
    assert torch.allclose(got, want, atol=1e-6)
    assert step.counters["fallback_calls"] == 1


def test_bad_on_violation_is_refused():
    with pytest.raises(ValueError, match="allowed values are fallback, error"):
        sk.precompile_step(make_step(Net(), Cache()), inputs(0), ro(), on_violation="ignore")


def test_state_watch_sees_each_kind_of_change():
    model, cache = Net(), Cache()
    watch = StateWatch([model, cache], args=inputs(0))
    assert watch.unchanged(inputs(0))
    changes = [
        lambda: setattr(model, "training", not model.training),
        lambda: model.a.register_forward_hook(lambda *a: None),
        lambda: setattr(model.a.weight, "data", model.a.weight.data.double()),
        lambda: setattr(model.b.bias, "data", torch.zeros(3)),
        lambda: setattr(cache, "k", cache.k.clone()),
        lambda: setattr(model, "__class__", type("Other", (Net,), {})),
    ]
    for change in changes:
        change()
        assert not watch.unchanged(inputs(0))
        watch.refresh(inputs(0))
        assert watch.unchanged(inputs(0))
    assert not watch.unchanged(inputs(0, rows=2))
    assert not watch.unchanged(inputs(0, dtype=torch.float64))
    with torch.no_grad():  # the snapshot was taken with grad enabled
        assert not watch.unchanged(inputs(0))


def test_explain_shows_the_guard_path(setup):
    model, cache, step = setup
    with torch.no_grad():
        step(*inputs(0))
    ex = sk.explain(step)
    assert ex.guard_path == "precompiled" and ex.guard_cost_us["frame_guards_last_check"] > 0
    assert "guard path: precompiled (frame_guards_last_check" in str(ex)
    assert ex.to_dict()["guard_path"] == "precompiled"
    plain = sk.compile(make_step(model, cache), ro())
    assert sk.explain(plain).guard_path == "full-guards"
    with torch.no_grad():
        costs = step.guard_cost_us(*inputs(0))
    assert set(costs) == {"frame_guards", "watch"} and min(costs.values()) > 0
