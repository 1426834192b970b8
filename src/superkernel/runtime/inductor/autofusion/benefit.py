"""The benefit model: what a candidate is predicted to save per call, and whether it fits.

benefit (µs) = bytes of memory traffic saved / bandwidth + calls saved x cost of one call
               - penalties (tiling: split outputs that consumers must copy; weights that are not
                 constants: the concatenation itself, every call)

The capacity limit: the saving of a horizontal fusion is that the shared input is read once
and reused for every output column; that holds only while the input block (and the output
row block) stay in one core's cache. A candidate whose working set is larger than the per-core
cache saves no bytes and is rejected before it is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

#: elements of one vector register row (AVX-512 float32): a split boundary off it is unaligned
VECTOR_ELEMS = 16


@dataclass
class Machine:
    cache_bytes: int        # per core
    cache_source: str
    bandwidth: float        # bytes/s, copy
    call_us: float          # one more GEMM call


@dataclass
class Prediction:
    bytes_saved: int
    calls_saved: int
    penalty_us: float
    working_set: int
    fits: bool
    benefit_us: float


def predict_horizontal(m: int, k: int, ns: list[int], itemsize: int, *, constant_weights: bool,
                       machine: Machine) -> Prediction:
    """``len(ns)`` GEMMs ``[m, k] @ [k, n_i]`` sharing their input, fused into one ``[m, k] @ [k, sum(ns)]``."""
    total_n = sum(ns)
    working_set = (m * k + m * total_n) * itemsize
    fits = working_set <= machine.cache_bytes
    bytes_saved = (len(ns) - 1) * m * k * itemsize if fits else 0
    calls_saved = len(ns) - 1
    penalty = 0.0
    offsets, start = [], 0
    for n in ns[:-1]:
        start += n
        offsets.append(start)
    if m > 1 and any(o % VECTOR_ELEMS for o in offsets):
        penalty += 2 * m * total_n * itemsize / machine.bandwidth * 1e6  # consumers copy the strided splits
    if not constant_weights:
        penalty += 2 * k * total_n * itemsize / machine.bandwidth * 1e6  # concatenating the weights every call
    benefit = bytes_saved / machine.bandwidth * 1e6 + calls_saved * machine.call_us - penalty
    return Prediction(bytes_saved, calls_saved, penalty, working_set, fits, benefit)
