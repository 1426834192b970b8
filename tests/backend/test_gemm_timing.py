"""max-autotune on CPU: Inductor's GEMM choices timed with the weights read from memory (``inductor.gemm_timing``),
and the plain variant's C++ built in the background while the frozen one is lowered."""

from __future__ import annotations

import json

import pytest
import torch

import superkernel as sk
import superkernel.runtime.inductor.cpu_freezing as inductor_cpu
from superkernel.runtime.inductor import gemm_timing

from tests.backend.test_frozen_code import _layer_graph


def test_cold_benchmark_evicts_before_every_timed_call_and_takes_the_median():
    events: list[str] = []

    class Buffer:
        def sum(self):
            events.append("evict")

    def fn():
        events.append("call")

    ms = gemm_timing.cold_benchmark(Buffer())(fn, warmup=20, rep=10_000)
    assert isinstance(ms, float) and ms >= 0.0
    assert events[0] == "call"  # one untimed first call
    timed = events[1:]
    assert timed == ["evict", "call"] * (len(timed) // 2)  # every timed call right after an eviction
    assert len(timed) // 2 == 10  # rep never reached by a no-op: capped


def test_weights_from_memory_patches_the_benchmark_and_the_timing_store_only_inside():
    from torch._inductor.codecache import CacheBase
    from torch._inductor.runtime.benchmarking import benchmarker

    before_bench, before_path = benchmarker.benchmark_cpu, CacheBase.get_local_cache_path()
    with gemm_timing.weights_from_memory(enabled=False):
        assert benchmarker.benchmark_cpu == before_bench
    with gemm_timing.weights_from_memory():
        assert benchmarker.benchmark_cpu != before_bench
        path = CacheBase.get_local_cache_path()
        evict = gemm_timing.eviction_bytes(None)
        assert path.name == f"{before_path.name}.weights-from-memory-{-(-evict // 2**20)}"
    assert benchmarker.benchmark_cpu == before_bench and CacheBase.get_local_cache_path() == before_path


def test_last_level_cache_is_read_or_defaulted():
    assert gemm_timing.last_level_cache_bytes() >= 2**20


def test_a_timed_call_reads_what_the_rest_of_the_step_reads_at_most_twice_the_cache(monkeypatch):
    monkeypatch.setattr(gemm_timing, "last_level_cache_bytes", lambda: 32 * 2**20)
    weight, cache = torch.zeros(1000, 1000), torch.zeros(2, 250_000)
    tied = weight[:10]  # a view of one storage counts once
    assert gemm_timing.step_bytes([weight, cache, tied, 3, None]) == 4_000_000 + 2_000_000
    assert gemm_timing.step_bytes(None) is None
    assert gemm_timing.eviction_bytes(6_000_000) == 8 * 2**20    # rounded up to a power of two MiB
    assert gemm_timing.eviction_bytes(10) == 2**20                # at least 1 MiB
    assert gemm_timing.eviction_bytes(10**9) == 64 * 2**20        # a step past the cache: twice the cache
    assert gemm_timing.eviction_bytes(None) == 64 * 2**20         # the step unknown: twice the cache


def test_config_names_the_allowed_values():
    assert sk.CompilerConfig().inductor.gemm_timing == "memory"
    with pytest.raises(ValueError, match="gemm_timing.*'memory', 'cache'"):
        sk.CompilerConfig.from_dict({"inductor": {"gemm_timing": "hot"}})


@pytest.mark.slow
def test_both_timings_compute_the_layer_and_keep_their_timings_apart():
    from torch._inductor.codecache import CacheBase
    from torch._inductor.utils import fresh_cache

    gm, gen = _layer_graph(), torch.Generator().manual_seed(0)
    x = torch.randn(1, 32, generator=gen)
    weights = [torch.randn(s, generator=gen) for s in [(64, 32), (64,), (32, 64)]]
    want = gm(x, *weights)[0]
    stores = {}
    with fresh_cache():
        for timing in ("memory", "cache"):
            with torch.no_grad():
                fn = inductor_cpu.compile_frozen(gm, [x, *weights], {1: weights[0], 2: weights[1], 3: weights[2]},
                                                 cpp_wrapper=True, autotune=True, gemm_templates=True,
                                                 gemm_timing=timing, step=gemm_timing.step_bytes([x, *weights]))
                torch.testing.assert_close(fn(x, *weights)[0], want, rtol=1e-4, atol=1e-4)
            path = CacheBase.get_local_cache_path()
            own = f"{path.name}.weights-from-memory-1"  # the layer's 17 KB read before each timed call: 1 MiB
            stores[timing] = path.with_name(own) if timing == "memory" else path
            assert stores[timing].is_file()  # Inductor timed the GEMM choices and kept the timings there
        timed = {t: json.loads(p.read_text())["cache"] for t, p in stores.items()}
    assert stores["memory"] != stores["cache"]
    assert timed["memory"] and timed["cache"]  # each compile timed its GEMMs itself (no hot timing reused)


def test_choices_are_timed_in_alternating_passes_and_the_median_kept(monkeypatch):
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    orders, times = [], iter([{"a": 1.0, "b": 5.0}, {"a": 9.0, "b": 4.0}, {"a": 2.0, "b": 6.0}])

    def stub(cls, choices, autotune_args, is_collective=False):
        orders.append(list(choices))
        return next(times)

    monkeypatch.setattr(AlgorithmSelectorCache, "benchmark_choices", classmethod(stub))
    with gemm_timing.interleaved_choices(passes=3):
        got = AlgorithmSelectorCache.benchmark_choices(["a", "b"], None)
    assert orders == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert got == {"a": 2.0, "b": 5.0}


@pytest.mark.slow
def test_a_plain_build_in_the_background_gives_the_same_function():
    from torch._inductor.utils import fresh_cache

    from superkernel.runtime.inductor.background_build import builds_in_background, wait_all
    from superkernel.runtime.inductor.compile import compile_partition

    gm, gen = _layer_graph(), torch.Generator().manual_seed(1)
    args = [torch.randn(s, generator=gen) for s in [(1, 32), (64, 32), (64,), (32, 64)]]
    with fresh_cache():  # an empty code cache: g++ really runs
        with builds_in_background() as pending:
            fn = compile_partition(gm, args, device="cpu", cpp_wrapper=True)
        assert len(pending) == 1  # the module's build was handed to the worker
        wait_all(pending)
        with torch.no_grad():
            torch.testing.assert_close(fn(*args)[0], gm(*args)[0], rtol=1e-5, atol=1e-5)
