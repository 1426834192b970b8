"""Fusion benefit model: is fusing these operators worth it?

Pure functions over tensor shapes, dtype names and byte counts, so both the ONNX
``graph-autofusion`` command and the torch-side planner can use it. No ONNX or torch
types appear in the interface; dtypes are numpy-style names (``"float32"``,
``"float16"``, ``"bfloat16"``, ``"int64"``, ...).

The model follows the graph-autofusion benefit estimate (docs/graph_autofusion.md)::

    net = memory_time_saved + scheduling_saved - penalties

- **memory_time_saved**: every intermediate tensor the fusion removes is no longer
  written once and read by each of its consumers; the bytes are converted to time with
  the memory bandwidth of the :class:`CostModel`. Tensors that the fused form has to
  create *in addition* (helper tensors such as a rotary cache or an attention bias) are
  subtracted the same way.
- **scheduling_saved**: operators removed minus operators added, times the per-operator
  dispatch overhead.
- **penalties** (the "tiling loss" of the seed), each documented in
  docs/graph_autofusion.md:

  * ``dynamic_shape``: the fused kernel's shapes are symbolic, so its tiling is chosen at
    run time: ``dynamic_shape_penalty`` (10 %) of the fused operator's own memory time.
  * ``cache_overflow``: the working set of one parallel unit of the fused kernel (one
    row, one head) exceeds ``cache_fill_limit`` (80 %) of the per-core cache, so the
    fused kernel spills what the unfused kernels kept in cache: ``cache_overflow_penalty``
    (40 %) of the fused operator's memory time.
  * rule-specific penalties passed in by the caller (``extra_penalties_us``), e.g. an
    operator the fused form needs that the original graph did not.

Only candidates with ``net_us > 0`` are applied; the others are reported as skipped with
these numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Sequence

DTYPE_BYTES: dict[str, float] = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "int64": 8, "uint64": 8, "int32": 4, "uint32": 4, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1,
    "bool": 1, "float8e4m3fn": 1, "float8e5m2": 1, "int4": 0.5, "uint4": 0.5,
    "complex64": 8, "complex128": 16,
}


def dtype_nbytes(dtype: str) -> float:
    """Bytes per element of a numpy-style dtype name (KeyError for an unknown name)."""
    return DTYPE_BYTES[dtype.lower()]


def tensor_nbytes(shape: Sequence[int], dtype: str) -> int:
    """Bytes of a dense tensor (``shape`` of concrete ints, ``()`` for a scalar)."""
    n = math.prod(int(d) for d in shape)
    return int(math.ceil(n * dtype_nbytes(dtype)))


@dataclass(frozen=True)
class TensorTraffic:
    """One tensor and how often it goes through memory: written once, read ``reads`` times."""

    shape: tuple[int, ...]
    dtype: str
    reads: int = 1

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.dtype)

    @property
    def traffic_bytes(self) -> int:
        return self.nbytes * (1 + self.reads)


@dataclass(frozen=True)
class CostModel:
    """Machine constants of the estimate. The defaults describe a small x86 CPU server
    running ONNX Runtime's sequential executor; they only need to be right in
    proportion, because the model decides on the sign of the net benefit."""

    name: str = "cpu-default"
    memory_bandwidth_gbps: float = 20.0   # sustained bandwidth seen by one inference thread
    dispatch_overhead_us: float = 1.0     # cost of scheduling one operator (kernel launch)
    cache_bytes: int = 2 * 1024 * 1024    # per-core cache the fused kernel tiles into (L2)
    cache_fill_limit: float = 0.8         # seed: constraint L1_usage < 0.8 * capacity
    dynamic_shape_penalty: float = 0.10   # seed pitfall 1: runtime tiling costs ~10 %
    cache_overflow_penalty: float = 0.40  # seed pitfall 2: cache overflow costs ~40 %

    def bytes_to_us(self, nbytes: float) -> float:
        return nbytes / (self.memory_bandwidth_gbps * 1e3)  # GB/s == 1e3 bytes/us


CPU_DEFAULT = CostModel()


@dataclass
class Benefit:
    """The estimate for one candidate. Times in microseconds per call."""

    bytes_saved: int
    ops_removed: int
    ops_added: int
    memory_saved_us: float
    scheduling_saved_us: float
    penalties_us: dict[str, float] = field(default_factory=dict)

    @property
    def launches_saved(self) -> int:
        return self.ops_removed - self.ops_added

    @property
    def penalty_us(self) -> float:
        return sum(self.penalties_us.values())

    @property
    def net_us(self) -> float:
        return self.memory_saved_us + self.scheduling_saved_us - self.penalty_us

    @property
    def positive(self) -> bool:
        return self.net_us > 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(launches_saved=self.launches_saved, penalty_us=self.penalty_us, net_us=self.net_us,
                 positive=self.positive)
        return d

    def describe(self) -> str:
        pen = ", ".join(f"{k} {v:.3f}" for k, v in self.penalties_us.items()) or "none"
        return (f"net {self.net_us:+.3f} us = memory {self.memory_saved_us:.3f} us ({self.bytes_saved} B) "
                f"+ scheduling {self.scheduling_saved_us:.3f} us ({self.launches_saved:+d} ops) "
                f"- penalties {self.penalty_us:.3f} us ({pen})")


def traffic_bytes(tensors: Iterable[TensorTraffic]) -> int:
    return sum(t.traffic_bytes for t in tensors)


def estimate_benefit(
    removed: Sequence[TensorTraffic],
    ops_removed: int,
    ops_added: int = 1,
    *,
    added: Sequence[TensorTraffic] = (),
    fused_io: Sequence[TensorTraffic] = (),
    row_bytes: int = 0,
    dynamic_shapes: bool = False,
    extra_penalties_us: Mapping[str, float] | None = None,
    model: CostModel = CPU_DEFAULT,
) -> Benefit:
    """Estimate the net benefit of replacing ``ops_removed`` operators by ``ops_added``.

    removed: intermediate tensors that disappear (each with its number of readers).
    added: helper tensors the fused form creates in addition.
    fused_io: the fused operator's inputs and outputs (its own memory time is the base of
        the dynamic-shape and cache-overflow penalties).
    row_bytes: working set of one parallel unit of the fused kernel (one normalized row,
        one attention head); compared with the cache.
    dynamic_shapes: the fused operator's shapes are symbolic in the model.
    """
    saved = traffic_bytes(removed) - traffic_bytes(added)
    fused_us = model.bytes_to_us(sum(t.nbytes for t in fused_io))
    penalties: dict[str, float] = {}
    if dynamic_shapes:
        penalties["dynamic_shape"] = model.dynamic_shape_penalty * fused_us
    if row_bytes > model.cache_fill_limit * model.cache_bytes:
        penalties["cache_overflow"] = model.cache_overflow_penalty * fused_us
    for k, v in (extra_penalties_us or {}).items():
        penalties[k] = penalties.get(k, 0.0) + float(v)
    return Benefit(
        bytes_saved=int(saved),
        ops_removed=int(ops_removed),
        ops_added=int(ops_added),
        memory_saved_us=model.bytes_to_us(saved),
        scheduling_saved_us=(ops_removed - ops_added) * model.dispatch_overhead_us,
        penalties_us=penalties,
    )
