"""Issue 25 (decode at real width): a session of a ~1 GB model keeps its speed for its lifetime,
so the real-width harness times several looks with fresh sessions and treats the look as the
unit (timing.time_looks / looks_estimate). Synthetic sessions and a fake clock: no real timing
is asserted."""

from __future__ import annotations

import random

import pytest

from superkernel.onnx import timing as T


class Lottery:
    """Fake sessions: model i truly takes ``truth[i]`` ms; every session draws a speed factor
    that lasts its lifetime (``spread``), rounds add small noise; the clock is fake."""

    def __init__(self, truth, spread=0.08, noise=0.005, seed=0):
        self.truth, self.spread, self.noise = truth, spread, noise
        self.rng = random.Random(seed)
        self.now = 0.0
        self.created: list[int] = []
        self.alive = 0

    def maker(self, i):
        outer = self

        class Sess:
            def __init__(self):
                self.factor = 1 + outer.spread * outer.rng.uniform(-1, 1)
                outer.created.append(i)
                outer.alive += 1

            def run(self, _o, _f):
                outer.now += outer.truth[i] * self.factor * (1 + outer.noise * outer.rng.gauss(0, 1)) / 1e3

            def __del__(self):
                outer.alive -= 1

        return Sess


@pytest.fixture
def lottery():
    return Lottery([50.0, 50.0, 49.0])


def test_time_looks_draws_fresh_sessions_every_look(lottery):
    make = [lottery.maker(i) for i in range(3)]
    per = T.time_looks(make, {}, looks=5, rounds=4, warmup=1, seed=1, clock=lambda: lottery.now)
    assert len(per) == 5 and all(len(look) == 3 and all(len(x) == 4 for x in look) for look in per)
    # one throw-away session of model 0, then 3 fresh sessions per look
    assert len(lottery.created) == 1 + 5 * 3 and lottery.created[0] == 0
    orders = {tuple(lottery.created[1 + 3 * k: 4 + 3 * k]) for k in range(5)}
    assert all(sorted(o) == [0, 1, 2] for o in orders) and len(orders) > 1  # a new random order per look
    assert lottery.alive == 0  # every look's sessions were dropped


def test_time_looks_stops_after_max_seconds_but_keeps_min_looks(lottery):
    make = [lottery.maker(i) for i in range(2)]
    per = T.time_looks(make, {}, looks=10, rounds=3, seed=0, max_seconds=1e-9, min_looks=3, clock=lambda: lottery.now)
    assert len(per) == 3


def test_looks_estimate_takes_the_look_as_unit():
    # inside each look the rounds agree tightly; the looks disagree (session draws)
    looks_ratio = [0.90, 1.10, 1.00, 0.95, 1.05, 1.00]
    per = [[[10.0] * 30, [10.0 * r * (1 + 1e-4 * j) for j in range(30)]] for r in looks_ratio]
    e = T.looks_estimate(per, 0, 1)
    assert e.ratio == pytest.approx(1.0, abs=2e-3) and e.rounds == 180
    assert e.lo == pytest.approx(0.90, abs=1e-2) and e.hi == pytest.approx(1.10, abs=1e-2)  # 6 looks: the range
    pooled = T.ratio_estimate([(a, b) for look in per for a, b in zip(*look)])
    assert pooled.hi - pooled.lo < e.hi - e.lo  # pooling rounds would claim a precision the sessions do not have


def test_looks_cover_the_true_ratio_where_one_look_does_not():
    """Model 1 is truly 2 % faster; sessions draw +-8 %. One look's round interval is tight and
    mostly misses the truth; the interval over 9 looks mostly covers it."""
    one_hits = looks_hits = 0
    trials = 30
    for seed in range(trials):
        lot = Lottery([50.0, 49.0], spread=0.08, noise=0.005, seed=seed)
        make = [lot.maker(0), lot.maker(1)]
        per = T.time_looks(make, {}, looks=9, rounds=20, warmup=0, seed=seed, clock=lambda: lot.now)
        truth = 49.0 / 50.0
        first = T.ratio_estimate(list(zip(per[0][0], per[0][1])))
        one_hits += first.lo <= truth <= first.hi
        e = T.looks_estimate(per, 0, 1)
        looks_hits += e.lo <= truth <= e.hi
    assert looks_hits >= 0.8 * trials and one_hits <= 0.5 * trials
