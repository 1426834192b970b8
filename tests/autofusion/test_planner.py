"""The planner's decisions: capacity limit, measurement, the calibration cache; applied rewrites compute
what the original graph does."""

from __future__ import annotations

import json

import pytest
import torch

from superkernel.runtime.inductor.autofusion import calibrate, machine
from superkernel.runtime.inductor.autofusion.planner import Planner, calibration_env
from superkernel.runtime.inductor.autofusion.store import Store
from tests.autofusion.graphs import aten_graph, qkv, weights

SHAPE = (1, 32, [32, 16, 16])


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    s = Store(tmp_path / "cache" / "calibration.json")
    # the machine constants as measured once per environment (kept out of the tests' time)
    s.put(f"machine|{machine.environment()}", {"bandwidth": 1e10, "call_us": 2.0})
    return s


def _graph():
    x, ws = torch.randn(1, 1, 32), weights(32, [32, 16, 16])
    gm = aten_graph(qkv, x, *ws)
    return gm, (x, *ws)


def _weights_constant(gm):
    names = [n for n in gm.graph.nodes if n.op == "placeholder"][1:]
    return lambda n: n in names


def _record(store: Store, ratio: float) -> None:
    m, k, ns = SHAPE
    key = calibrate.key("horizontal_gemm", m, k, ns, torch.float32, False, calibration_env("injected"))
    store.put(key, {"unfused_us": 10.0, "fused_us": 10.0 * ratio, "ratio": ratio, "ratio_q3": ratio})


def _never_measure(*args):
    raise AssertionError("measured although the decision needs no measurement")


def _mms(gm) -> int:
    return sum(n.target is torch.ops.aten.mm.default for n in gm.graph.nodes)


def test_rejected_by_the_capacity_limit(store, monkeypatch):
    monkeypatch.setattr(machine, "per_core_cache_bytes", lambda: (64, "test: a 64-byte cache"))
    gm, _ = _graph()
    decisions = Planner(store, measure=_never_measure).plan(gm, _weights_constant(gm))
    (d,) = [d for d in decisions if d.rule == "horizontal_gemm"]
    assert d.status == "rejected" and d.reason.startswith("capacity")
    assert d.capacity["working_set"] > 64 and d.capacity["cache"] == 64 and d.measured == {}
    assert _mms(gm) == 3


def test_rejected_by_measurement_from_the_calibration_cache(store):
    _record(store, 1.10)
    gm, _ = _graph()
    decisions = Planner(store, measure=_never_measure).plan(gm, _weights_constant(gm))
    (d,) = [d for d in decisions if d.rule == "horizontal_gemm"]
    assert d.status == "rejected" and "measured not faster" in d.reason
    assert d.predicted_us > 0 and d.measured["cached"] is True and d.measured["ratio"] == pytest.approx(1.10)
    assert _mms(gm) == 3


def test_applied_when_measured_faster_and_the_output_is_the_same(store):
    _record(store, 0.5)
    gm, args = _graph()
    expected = gm(*args)
    decisions = Planner(store, measure=_never_measure).plan(gm, _weights_constant(gm))
    (d,) = [d for d in decisions if d.rule == "horizontal_gemm"]
    assert d.status == "applied" and d.shapes.startswith("[1x32] @ [32x32+16+16]")
    assert _mms(gm) == 1
    for a, b in zip(gm(*args), expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_weights_that_are_not_constants_are_rejected_before_measuring(store):
    gm, _ = _graph()
    (d,) = [d for d in Planner(store, measure=_never_measure).plan(gm, lambda n: False) if d.rule == "horizontal_gemm"]
    assert d.status == "rejected" and "not constants" in d.reason and _mms(gm) == 3
    _record(store, 1.10)
    gm, _ = _graph()
    (c,) = [d for d in Planner(store, measure=_never_measure).plan(gm, _weights_constant(gm)) if d.rule == "horizontal_gemm"]
    assert d.predicted_us < c.predicted_us  # the model charges the concatenation every call


def test_a_real_measurement_is_taken_once_cached_and_decides(store):
    calls = []

    def measure(*args):
        calls.append(args)
        return calibrate.time_horizontal(*args, rounds=5, calls=5)

    first = [d for d in Planner(store, measure=measure).plan(_graph()[0], lambda n: n.op == "placeholder"
                                                             and n.name != "arg0_1") if d.rule == "horizontal_gemm"]
    second = [d for d in Planner(store, measure=measure).plan(_graph()[0], lambda n: n.op == "placeholder"
                                                              and n.name != "arg0_1") if d.rule == "horizontal_gemm"]
    assert len(calls) == 1  # the second planner found the measurement in the cache
    (a,), (b,) = first, second
    assert a.measured["cached"] is False and b.measured["cached"] is True
    assert a.status == b.status == ("applied" if calibrate.faster(a.measured) else "rejected")


def test_the_store_is_signed_and_a_changed_file_is_ignored(store):
    _record(store, 0.5)
    store.save()
    assert Store(store.path).get(next(iter(store.entries)))
    data = json.loads(store.path.read_text())
    key = next(k for k in data["entries"] if not k.startswith("machine"))
    data["entries"][key]["ratio"] = 0.1
    store.path.write_text(json.dumps(data))
    fresh = Store(store.path)
    assert fresh.get(key) is None and "not signed" in fresh.note


def test_the_per_core_cache_is_read_from_the_machine():
    size, source = machine.per_core_cache_bytes()
    assert size > 0 and source


def test_a_candidate_that_cannot_be_measured_is_rejected_and_the_graph_kept(store):
    def failing(*args):
        raise RuntimeError("compiled calibration failed (exit 1): no compiler")

    gm, _ = _graph()
    before = _mms(gm)
    (d,) = [d for d in Planner(store, measure=failing).plan(gm, _weights_constant(gm)) if d.rule == "horizontal_gemm"]
    assert d.status == "rejected" and "not measured" in d.reason and "no compiler" in d.reason
    assert _mms(gm) == before
