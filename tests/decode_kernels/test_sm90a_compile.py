"""The decode kernel set compiles for sm_90a on the CPU (no GPU) without spills: benchmarks/triton_decode_kernels_sm90a.py
run in a child process (Triton's interpreter, which the other tests of this folder use, replaces the compiler)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed here (torch's CPU build has none): make test-triton")

ROOT = Path(__file__).resolve().parents[2]


def test_attention_and_a_split_k_gemv_compile_for_sm90a_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # a cold compile, not a cached binary
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "triton_decode_kernels_sm90a.py"),
                           "--names", "attention,o_proj", "--out", str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "triton_decode_kernels_sm90a.json").read_text())
    kernels = {(r["problem"], r["launch"], r["kernel"]): r for r in data["kernels"]}
    names = {k[2] for k in kernels}
    assert names == {"attn_split_kernel", "attn_reduce_kernel", "gemv_kernel", "splitk_reduce_kernel"}
    # the int8 weight-only GEMV (split-K candidates included) compiles too, every candidate of o_proj
    int8 = {(k[1], k[2]) for k in kernels if k[0] == "o_proj int8"}
    assert {launch for launch, _ in int8} == {launch for p, launch, _ in kernels if p == "o_proj"}
    assert ("block_n=4,block_k=512,num_warps=4,split_k=2", "splitk_reduce_kernel") in int8
    for key, row in kernels.items():
        assert 0 < row["registers"] <= 255, key
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, (key, row)
    # the attention's two tl.dot products stage K and V through shared memory: a sign it compiled as written
    assert all(r["shared_bytes"] > 0 for k, r in kernels.items() if k[2] == "attn_split_kernel")
    assert "| attention |" in (tmp_path / "triton_decode_kernels_sm90a.md").read_text()


def test_the_recorder_puts_triton_launches_back():
    from triton.runtime.jit import JITFunction

    from superkernel.runtime.cuda.decode_kernels import aot

    before = JITFunction.run
    with aot.recording() as launches:
        assert JITFunction.run is not before
    assert JITFunction.run is before and launches == []
