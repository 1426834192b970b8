"""Inductor's GEMM autotuning, timed the way a decode step runs: weights read from memory, not from cache.

With max-autotune and frozen weights, Inductor times each GEMM's choices (its C++ template on the packed
weight, MKL's packed GEMM) by calling each one over and over on the same weight
(``Benchmarker.benchmark_cpu``). A decoder layer's weights (a 4864 x 896 f32 projection is 17 MB) then sit
in the last-level cache from the second call on, while a decode step reads every weight once per step from
memory: the choices are ranked in a regime the step never runs in. Measured on Qwen2-0.5B's shapes (AMD
EPYC, 32 MiB L3, 1 thread): cache-hot, the template and MKL timed 0.624 vs 0.657 ms for ``down_proj`` and
0.437 vs 0.439 ms for ``gate_proj`` (coin tosses); read from memory they differ by much more
(benchmarks/results/real_width_breakdown.md).

:func:`weights_from_memory` makes Inductor's CPU benchmark read other data before every timed call (a
streaming read outside the clock) and report the median of those calls. How much is what the rest of a decode
step reads between two calls of one GEMM: the bytes of the graph's real inputs (its weights and cache,
:func:`step_bytes`), at most twice the last-level cache (enough to evict it; twice the cache where the step is
not known). A step larger than the cache reads each weight from memory, and so does the timing; a small model's
step that stays in a large cache reads its weights from the cache, and so does the timing — and its compile does
not stream a buffer of twice a 480 MiB cache (a 2-core slice of a large Xeon reports one) before each of the ~60
timed calls of every GEMM (7.7 s a GEMM for llama-tiny there; 1.4-2.0 s reading its 16 MB step, 16 MiB).
Each GEMM's choices are timed in three passes, the order rotated from pass to pass, each
choice's median kept (:func:`interleaved_choices`: Inductor times one choice after the other, so on a shared
machine a busy moment would otherwise decide the pick). Those timings are kept in a local autotune cache file of their own (beside Inductor's, keyed the
same way), so identical GEMMs (the next decoder layer) are timed once and cache-hot timings from other
compiles are never mixed with them. Only the ranking changes: every choice Inductor offers computes the same GEMM, so results stay
within the max-autotune tolerance; reduce-overhead never autotunes.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import unittest.mock
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from superkernel.timing import rotation

#: ``inductor.gemm_timing`` values
GEMM_TIMINGS = ("memory", "cache")

_MIN_CALLS, _MAX_CALLS = 5, 10
_PASSES = 3
_MIB = 2**20


def last_level_cache_bytes(default: int = 32 * 2**20) -> int:
    """The largest CPU cache of cpu0 (Linux sysfs), ``default`` where it cannot be read."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
        try:
            best = max(best, int(text.rstrip("KMGkmg")) * scale)
        except ValueError:
            continue
    return best or default


def step_bytes(reals: Sequence[Any] | None) -> int | None:
    """The bytes a call of the graph reads at most: its real input tensors (weights, cache, inputs), each
    storage once (tied weights). ``None`` when the real inputs are not known. A step that graph breaks split
    into several graphs counts one graph's inputs: where the cache holds more than that graph reads, its GEMMs
    are timed as partly cache-resident although the whole step streams more (a known limit)."""
    if reals is None:
        return None
    seen: dict[Any, int] = {}
    for t in reals:
        if isinstance(t, torch.Tensor) and not isinstance(t, torch._subclasses.FakeTensor) and t.device.type == "cpu":
            try:
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
            except (RuntimeError, NotImplementedError):  # a tensor subclass without one storage: its own size
                seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def eviction_bytes(step: int | None) -> int:
    """How much other data a timed call reads first (see the module doc): ``step`` rounded up to a power of two
    MiB (the timing store is kept per size, so near sizes share it), at most twice the last-level cache."""
    cap = 2 * last_level_cache_bytes()
    if step is None:
        return cap
    return min(cap, 1 << max(20, (max(step, 1) - 1).bit_length()))


def cold_benchmark(buffer: torch.Tensor) -> Callable[..., float]:
    """A ``benchmark_cpu(fn, warmup, rep)`` that reads ``buffer`` (evicting the caches) before every timed
    call: median ms of 5 to 10 cold calls, until ``rep`` ms of calls were timed."""

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def benchmark_cpu(_callable: Callable[[], Any], warmup: int = 20, rep: int = 100, **_: Any) -> float:
        with unset_fake_temporarily():
            _callable()  # first-call work (lazy loading, allocations) stays out of the samples
            samples: list[float] = []
            while len(samples) < _MIN_CALLS or (sum(samples) < rep and len(samples) < _MAX_CALLS):
                buffer.sum()
                start = time.perf_counter()
                _callable()
                samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)

    return benchmark_cpu


@contextlib.contextmanager
def weights_from_memory(enabled: bool = True, step: int | None = None) -> Iterator[None]:
    """Inside: Inductor's CPU autotuning times every choice after reading :func:`eviction_bytes` of other data
    (``step``: :func:`step_bytes` of the graph; see the module doc)."""
    if not enabled:
        yield
        return
    try:
        from torch._inductor.runtime.benchmarking import benchmarker
    except ImportError:
        yield
        return
    if not hasattr(benchmarker, "benchmark_cpu"):
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        evict = eviction_bytes(step)
        buffer = torch.ones(evict // 4, dtype=torch.float32)
    with unittest.mock.patch.object(benchmarker, "benchmark_cpu", cold_benchmark(buffer)), own_timing_store(evict), \
            interleaved_choices():
        yield


@contextlib.contextmanager
def interleaved_choices(passes: int = _PASSES) -> Iterator[None]:
    """Inside: Inductor times a GEMM's choices in ``passes`` passes over all of them (the order rotated each
    pass, :func:`superkernel.timing.rotation`) and keeps each choice's median."""
    try:
        from torch._inductor.select_algorithm import AlgorithmSelectorCache
    except ImportError:
        yield
        return
    original = getattr(AlgorithmSelectorCache, "benchmark_choices", None)
    if original is None:
        yield
        return

    def benchmark_choices(cls: Any, choices: Any, autotune_args: Any, *args: Any, **kwargs: Any) -> dict[Any, float]:
        listed = list(choices)
        runs = [original([listed[j] for j in rotation(len(listed), i)], autotune_args, *args, **kwargs)
                for i in range(passes)]
        return {c: statistics.median(run[c] for run in runs) for c in runs[0] if all(c in run for run in runs)}

    with unittest.mock.patch.object(AlgorithmSelectorCache, "benchmark_choices", classmethod(benchmark_choices)):
        yield


@contextlib.contextmanager
def own_timing_store(evict: int) -> Iterator[None]:
    """Inside: Inductor's local autotune cache (timings per GEMM and choice) is a file of its own per eviction
    size, ``<Inductor cache>/cache/<system hash>.weights-from-memory-<MiB>``."""
    try:
        from torch._inductor.codecache import CacheBase
    except ImportError:
        yield
        return
    original = getattr(CacheBase, "get_local_cache_path", None)
    if original is None:
        yield
        return
    path = original()
    own = path.with_name(f"{path.name}.weights-from-memory-{-(-evict // _MIB)}")
    with unittest.mock.patch.object(CacheBase, "get_local_cache_path", staticmethod(lambda: own)):
        yield
