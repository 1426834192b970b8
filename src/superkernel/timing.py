"""Interleaved timing: the one loop every comparison of two or more candidates on this machine uses.

On a shared machine the speed of the machine drifts while candidates are timed; timing one
candidate after the other charges that drift to whichever ran during it. So every
comparison in the project (ONNX sessions, autofusion calibration, frozen vs plain segments,
GEMM choices, the advisor's re-timing of compiled plans, ``generate()`` peers) is timed the
same way:

- **throw-away first runs** (``warmup``): first-call work (lazy loading, allocation, page
  faults, caches) is not timed;
- **interleaved rounds**: every round runs each candidate once, and the order is rotated by
  one each round (:func:`rotation`; with two candidates, who runs first alternates), so no
  candidate always follows the same one and a steady drift touches all alike;
- **paired ratios**: the statistic is the median over rounds of candidate / reference in
  the *same* round (:func:`paired_ratios`, :func:`median_ratio`), so the drift between
  rounds cancels.

``clock`` is a parameter wherever time is read, so that tests pass a synthetic clock and
check the loop without timing anything.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")
#: seconds, monotonic (``time.perf_counter``, ``time.thread_time`` or a test's fake)
Clock = Callable[[], float]


def rotation(n: int, round_: int) -> list[int]:
    """The order of ``n`` candidates in round ``round_``: ``0..n-1`` rotated left by ``round_``."""
    if n <= 0:
        return []
    first = round_ % n
    return [*range(first, n), *range(first)]


def interleave(measures: Sequence[Callable[[], T]], rounds: int) -> list[list[T]]:
    """Call every measure once per round, in :func:`rotation` order; ``out[i]`` holds measure ``i``'s
    answers, one per round. A measure returns what it measured (a time, a decode run's median step)."""
    out: list[list[T]] = [[] for _ in measures]
    for r in range(rounds):
        for i in rotation(len(measures), r):
            out[i].append(measures[i]())
    return out


def timed(fn: Callable[[], Any], *, calls: int = 1, clock: Clock = time.perf_counter) -> Callable[[], float]:
    """A measure: seconds per call of ``calls`` back-to-back calls of ``fn``, read on ``clock``."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")

    def measure() -> float:
        start = clock()
        for _ in range(calls):
            fn()
        return (clock() - start) / calls

    return measure


def interleaved_seconds(fns: Sequence[Callable[[], Any]], rounds: int, *, warmup: int = 0, calls: int = 1,
                        clock: Clock = time.perf_counter) -> list[list[float]]:
    """Seconds per call of each of ``fns``, per round (``out[i][r]``), after ``warmup`` throw-away rounds
    in which each runs once, untimed."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    return interleave([timed(fn, calls=calls, clock=clock) for fn in fns], rounds)


def paired_ratios(reference: Sequence[float], candidate: Sequence[float]) -> list[float]:
    """``candidate / reference`` of the same round, for every round where both read a positive time
    (a side that read nothing, or a failed run reported as 0, is no measurement)."""
    return [c / r for r, c in zip(reference, candidate) if r > 0 and c > 0]


def median_ratio(reference: Sequence[float], candidate: Sequence[float]) -> float:
    """The median of :func:`paired_ratios`; ``ValueError`` when no round paired."""
    ratios = paired_ratios(reference, candidate)
    if not ratios:
        raise ValueError("median_ratio: no round with a positive time on both sides")
    return statistics.median(ratios)
