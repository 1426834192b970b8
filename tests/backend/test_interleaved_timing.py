"""The one interleaved timing helper (``superkernel.timing``), checked on a synthetic clock: which
candidate runs when, what is timed and what is thrown away, and the paired ratio. No real time is read."""

from __future__ import annotations

import pytest

from superkernel.timing import interleave, interleaved_seconds, median_ratio, paired_ratios, rotation, timed


class FakeClock:
    """Time moves only when a fake candidate runs; every run is logged."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[str] = []

    def __call__(self) -> float:
        return self.now

    def candidate(self, name: str, seconds: float):
        def run() -> None:
            self.log.append(name)
            self.now += seconds

        return run


def test_rotation_alternates_two_and_rotates_more():
    assert [rotation(2, r) for r in range(3)] == [[0, 1], [1, 0], [0, 1]]
    assert [rotation(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert rotation(0, 5) == []


def test_every_candidate_leads_equally_often():
    clock = FakeClock()
    fns = [clock.candidate(n, 1.0) for n in "abc"]
    interleaved_seconds(fns, rounds=6, clock=clock)
    leaders = [clock.log[i] for i in range(0, 18, 3)]
    assert leaders == ["a", "b", "c", "a", "b", "c"]


def test_warmup_runs_are_untimed_and_in_order():
    clock = FakeClock()
    a, b = clock.candidate("a", 2.0), clock.candidate("b", 5.0)
    got = interleaved_seconds([a, b], rounds=2, warmup=3, clock=clock)
    assert clock.log[:6] == ["a", "b"] * 3           # the throw-away runs come first
    assert clock.log[6:] == ["a", "b", "b", "a"]     # then the rotating rounds
    assert got == [[2.0, 2.0], [5.0, 5.0]]           # one time per timed round only


def test_calls_per_measure_divide_the_time():
    clock = FakeClock()
    measure = timed(clock.candidate("a", 0.5), calls=4, clock=clock)
    assert measure() == 0.5 and clock.log == ["a"] * 4
    with pytest.raises(ValueError, match="calls must be >= 1"):
        timed(lambda: None, calls=0)


def test_a_drift_between_rounds_cancels_in_the_paired_ratio():
    """The machine slows 10x in the second round: each side's times move, their same-round ratio does not."""
    clock = FakeClock()
    speed = {"factor": 1.0}

    def run(name: str, seconds: float):
        def fn() -> None:
            clock.log.append(name)
            clock.now += seconds * speed["factor"]
            if len(clock.log) == 2:
                speed["factor"] = 10.0

        return fn

    base, cand = interleaved_seconds([run("base", 1.0), run("cand", 0.8)], rounds=3, clock=clock)
    assert base == pytest.approx([1.0, 10.0, 10.0]) and cand == pytest.approx([0.8, 8.0, 8.0])
    assert median_ratio(base, cand) == pytest.approx(0.8)


def test_interleave_passes_through_what_a_measure_returns():
    answers = {"x": iter([3, 4]), "y": iter([7, 8])}
    got = interleave([lambda: next(answers["x"]), lambda: next(answers["y"])], rounds=2)
    assert got == [[3, 4], [7, 8]]


def test_paired_ratios_skip_rounds_that_read_nothing():
    assert paired_ratios([1.0, 0.0, 2.0, 4.0], [2.0, 1.0, -1.0, 2.0]) == [2.0, 0.5]
    with pytest.raises(ValueError, match="no round"):
        median_ratio([0.0], [1.0])
