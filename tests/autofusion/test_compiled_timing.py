"""Calibration as Inductor compiles it: the child process compiles the separate GEMMs and the rule's
rewrite of them (frozen weights), checks they agree, and times both."""

from __future__ import annotations

import torch

from superkernel.runtime.inductor.autofusion.compiled_timing import compiled_pair, time_compiled


def test_the_pair_is_compiled_frozen_and_computes_the_same():
    unfused, fused = compiled_pair(1, 16, [16, 8], torch.float32, True, gemm_templates=False, cpp_wrapper=False)
    with torch.no_grad():
        a, b = unfused(), fused()
    assert len(a) == len(b) == 2 and [t.shape[1] for t in b] == [16, 8]
    for x, y in zip(a, b):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-5)


def test_a_child_process_measures_both_sides(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    got = time_compiled(1, 16, [16, 8], torch.float32, False, gemm_templates=False, cpp_wrapper=False,
                        rounds=3, calls=3)
    assert got["compiled"] is True and got["rounds"] == 3
    assert got["unfused_us"] > 0 and got["fused_us"] > 0
    assert 0 < got["ratio"] <= got["ratio_q3"]
