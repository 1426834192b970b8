"""The planner inside CPU max-autotune: a real Inductor compile of a planned segment (frozen weights),
its output against the unplanned one and eager, and its decisions in explain()."""

from __future__ import annotations

import pytest
import torch

import superkernel as sk
from superkernel.runtime.inductor.autofusion import calibrate, machine
from superkernel.runtime.inductor.autofusion.planner import calibration_env, compiled_how
from superkernel.runtime.inductor.autofusion.store import Store, default_path
from tests.autofusion.graphs import Layer

H = 32


def _config(autofusion) -> sk.CompilerConfig:
    # freezing True (no plain-vs-frozen timing), no GEMM template autotuning, the Python wrapper: the fastest compile
    return sk.CompilerConfig.from_dict({"mode": "max-autotune", "inductor": {
        "autofusion": autofusion, "freezing": True, "gemm_templates": False, "cpp_wrapper": False}})


@pytest.fixture
def calibration(tmp_path, monkeypatch):
    """A private cache with the machine constants and one injected measurement: q/k/v fused is faster,
    gate/up fused is slower (so one candidate is applied and one rejected, whatever this box measures)."""
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    store = Store(default_path())
    env = machine.environment()
    store.put(f"machine|{env}", {"bandwidth": 1e10, "call_us": 2.0})
    for ns, ratio in (([H, H // 2, H // 2], 0.5), ([2 * H, 2 * H], 1.2)):
        store.put(calibrate.key("horizontal_gemm", 1, H, ns, torch.float32, False,
                                calibration_env(compiled_how(gemm_templates=False, cpp_wrapper=False))),
                  {"unfused_us": 10.0, "fused_us": 10.0 * ratio, "ratio": ratio, "ratio_q3": ratio})
    store.save()
    return store


def test_planned_segment_matches_unplanned_and_explains_each_decision(calibration):
    model = Layer(H).eval().requires_grad_(False)
    x = torch.randn(1, 1, H)
    planned, plain = sk.compile(model, _config("on")), sk.compile(model, _config(False))
    with torch.no_grad():
        want, got, unplanned = model(x), planned(x), plain(x)
    torch.testing.assert_close(got, unplanned, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    (seg,) = sk.explain(planned).segments
    assert seg.realization.endswith("+frozen")
    by_status = {(d["rule"], d["status"]) for d in seg.autofusion}
    assert ("horizontal_gemm", "applied") in by_status and ("horizontal_gemm", "rejected") in by_status
    applied = next(d for d in seg.autofusion if d["status"] == "applied")
    assert applied["predicted_us"] > 0 and applied["measured"]["cached"] is True
    assert seg.autofusion[-1]["status"] == "kept" and seg.autofusion[-1]["where"].startswith("frozen")
    text = str(sk.explain(planned))
    assert "autofusion horizontal_gemm: applied" in text and "measured not faster" in text
    assert "autofusion rotary_attention: not matched" in text and "autofusion moe_experts: not matched" in text
    assert "gemm_epilogue_prologue: not built" in text
    assert sk.explain(plain).segments[0].autofusion == []


def test_the_switch_accepts_on_off_and_refuses_others():
    cfg = sk.CompilerConfig()
    assert cfg.inductor.autofusion is False
    for value in (True, False, "on", "off"):
        cfg.inductor.autofusion = value
    with pytest.raises(ValueError, match="inductor.autofusion.*allowed values"):
        cfg.inductor.autofusion = "yes"
    assert sk.CompilerConfig.from_dict({"inductor": {"autofusion": "on"}}).fingerprint() != cfg.fingerprint()
