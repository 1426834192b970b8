"""The statistics of the profile's timed rounds: which steps count, and what the wrappers cost.

The timed pass runs rounds over the same positions; rounds with the timing wrappers
alternate with rounds without, and pairs of rounds (one of each, adjacent in time, so under
the same load) alternate between *calibration* and *profile*. On a shared machine the
level of a whole round moves with the load (measured: the fastest steps of two rounds of
the same model a few ms apart differ by up to 2x in the thread's CPU time), so rounds are
compared in pairs, never pooled: a pair's wrapped round and bare round saw the same load.

- calibration: the wrappers' cost per marked call *inside this model* is the median, over
  the calibration pairs, of (wrapped level - bare level) / marked calls. Measured on the
  llama, stablelm, gpt2 and olmo2 tiny architectures: 10-11 us per call with the thread-CPU
  clock, 3.5x the 2.8 us the same wrapper costs around an empty ``nn.Identity``; the empty
  module's figure left the profile +5-8 % above the bare step.
- profile: each profile pair's ratio (wrapped level - calibrated cost) / bare level; the
  middle half of the pairs by that ratio (a trimmed mean: a pair that one preemption hit
  is dropped whichever side it hit) gives the profiled steps and the bare step.

A round's *level* is the mean of its fastest quarter of steps (a step the OS preempted says
nothing about the model).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Round:
    """One timed round: its step times and, when wrapped, each step's timing record."""

    hooked: bool
    calibration: bool
    times: list[float] = field(default_factory=list)
    marks: list[Any] = field(default_factory=list)   # _Marks per step (wrapped rounds)

    @property
    def kept(self) -> list[int]:
        return fastest(self.times)

    @property
    def level(self) -> float:
        kept = self.kept
        return sum(self.times[k] for k in kept) / len(kept)

    @property
    def calls(self) -> float:
        """Marked calls per step (the same every step of a decode step)."""
        return sum(m.calls for m in self.marks) / len(self.marks) if self.marks else 0.0


def fastest(times: list[float]) -> list[int]:
    """Indices of the fastest quarter of ``times`` (the faster half of fewer than 8)."""
    keep = (len(times) + 3) // 4 if len(times) >= 8 else (len(times) + 1) // 2
    return sorted(range(len(times)), key=times.__getitem__)[:max(1, keep)]


def pairs(rounds: list[Round], *, calibration: bool) -> list[tuple[Round, Round]]:
    """(wrapped, bare) rounds adjacent in time, of the calibration or of the profile set."""
    out = []
    for first, second in zip(rounds[0::2], rounds[1::2]):
        if first.calibration == calibration and first.hooked != second.hooked:
            out.append((first, second) if first.hooked else (second, first))
    return out


def in_model_cost(rounds: list[Round]) -> float:
    """Seconds one marked call adds to a step of this model (median over the calibration pairs)."""
    costs = [(h.level - b.level) / h.calls for h, b in pairs(rounds, calibration=True) if h.calls]
    return max(0.0, statistics.median(costs)) if costs else 0.0


def profile_pairs(rounds: list[Round], per_call: float) -> list[tuple[Round, Round]]:
    """The middle half of the profile pairs by (wrapped level - wrappers' cost) / bare level."""
    found = pairs(rounds, calibration=False)
    ranked = sorted(found, key=lambda p: (p[0].level - per_call * p[0].calls) / p[1].level)
    cut = len(ranked) // 4
    return ranked[cut:len(ranked) - cut] if cut else ranked


def _spread(values: list[float]) -> float:
    """Standard error of the median of ``values`` (from their interquartile range)."""
    if len(values) < 4:
        return float("inf")
    q = statistics.quantiles(values, n=4)
    return 1.25 * (q[2] - q[0]) / 1.349 / len(values) ** 0.5


def settled(rounds: list[Round], tolerance: float = 0.025) -> bool:
    """Whether the calibration and the profile pairs are each known to ``tolerance`` of the step.

    The error of the calibrated cost (times the marked calls) and of the profile pairs' ratio,
    each the standard error of its median. Under load the pairs scatter more and the pass runs
    more rounds (up to its maximum) instead of reporting a coverage that is noise.
    """
    cal = pairs(rounds, calibration=True)
    prof = pairs(rounds, calibration=False)
    if not cal or not prof:
        return False
    step = statistics.median(b.level for _, b in prof)
    calls = statistics.median(h.calls for h, _ in cal)
    cost_err = _spread([h.level - b.level for h, b in cal]) / step if calls else 0.0
    ratio_err = _spread([h.level / b.level for h, b in prof])
    return cost_err <= tolerance and ratio_err <= tolerance


#: A long step (a real-width model in eager: 0.1-0.3 s) is not noisy the way a 1 ms step is, and 48
#: rounds of 12 steps took 92 s of a 0.5B model's ``optimize`` (27 % of it). Past LONG_MIN_ROUNDS
#: rounds and LONG_TIMED_S seconds timed, the pass stops once settled; past LONG_MAX_TIMED_S, it
#: stops even if not (a bound on the wait; the report's coverage column shows what it reached).
LONG_MIN_ROUNDS, LONG_TIMED_S, LONG_MAX_TIMED_S = 8, 10.0, 25.0


def enough_rounds(done: int, spent: float, rounds: list[Round], *, least: int, enough: float,
                  interleaved: bool, check_settled: bool) -> bool:
    """Whether the wall-clock pass can stop before its next round (``done`` rounds, ``spent`` s timed).

    Compiled steps (not ``interleaved``): after ``least`` rounds and ``enough`` seconds. Eager steps
    stop only at a multiple of 4 rounds (whole calibration and profile pairs): after ``least`` rounds
    and ``enough`` seconds once :func:`settled` (when ``check_settled``); a long step sooner, by time
    (:data:`LONG_MIN_ROUNDS`, :data:`LONG_TIMED_S`, :data:`LONG_MAX_TIMED_S`).
    """
    if not interleaved:
        return done >= least and spent >= enough
    if done % 4:
        return False
    calm = not check_settled or settled(rounds)
    if done >= least and spent >= enough and calm:
        return True
    return done >= LONG_MIN_ROUNDS and (spent >= LONG_MAX_TIMED_S or (spent >= LONG_TIMED_S and calm))
