"""The planned segment is kept only when measured faster than the segment without the rewrites."""

from __future__ import annotations

import torch

from superkernel.autofusion import segment_check
from superkernel.autofusion.decision import Decision, record

A = torch.randn(96, 96)


def _work(times: int):
    def run(x):
        for _ in range(times):
            x = A @ x
        return x
    return run


def test_the_faster_side_is_kept():
    fast, slow = _work(1), _work(30)
    kept, got = segment_check.check(fast, lambda: slow, [A])
    assert kept is fast and got["kept"] == "with the rewrites" and got["ratio"] < 0.5
    kept, got = segment_check.check(slow, lambda: fast, [A])
    assert kept is fast and got["kept"] == "without the rewrites" and got["ratio"] > 2


def test_a_lost_check_turns_the_applied_decisions_into_rejected():
    decisions = [Decision("horizontal_gemm", "applied", "mm+mm_1", "one GEMM of 2"),
                 Decision("horizontal_gemm", "rejected", "mm_2+mm_3", "measured not faster")]
    check = {"unfused_us": 10.0, "fused_us": 11.0, "ratio": 1.1, "ratio_q3": 1.2, "kept": "without the rewrites"}
    out = record(decisions, frozen_kept=True, timings_ms={}, rewrite_check=check)
    assert [d["status"] for d in out[:2]] == ["rejected", "rejected"]
    assert "segment with the rewrites was not faster" in out[0]["reason"]
    assert out[2]["rule"] == "segment_check" and out[2]["status"] == "rejected"
    assert out[2]["measured"]["ratio"] == 1.1 and out[-1]["rule"] == "variant"
