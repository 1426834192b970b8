"""benchmarks/gpu_decode_kernels.py, prepared for the next lent GPU: what of it can run on the CPU does (its
``--check`` and ``--dry-run`` under Triton's interpreter, the m2 chain kernel with PDL compiled for sm_90a, its
tables), and it refuses to time anything without CUDA."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_decode_kernels.py"
has_triton = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not has_triton, reason="Triton is not installed here: make test-triton")


def load():
    spec = importlib.util.spec_from_file_location("gpu_decode_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_cuda_it_times_nothing_and_says_to_use_check():
    bench = load()
    with pytest.raises(SystemExit, match="--check"):
        bench.main(["--parts", "m2"])
    with pytest.raises(SystemExit):
        bench.main(["--parts", "m9"])  # unknown part: argparse's error


def test_the_tables_of_each_part():
    bench = load()
    meta = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11", "triton": "3.6.0", "date": "d", "copy_gbps": 3000.0,
            "rounds": 5}
    m1 = {"rows": [{"problem": "o_proj", "plans": {
        "cuBLAS F.linear (the GEMV alone)": {"us": 5.0, "check": None, "pct_of_copy_rate": 55.9},
        "ours block_n=8": {"us": 4.0, "check": {"out": 2.5e-3}, "pct_of_copy_rate": 69.9},
        "ours block_n=4": {"us": None, "check": "AssertionError: beyond", "pct_of_copy_rate": None}}}]}
    text = bench.markdown("m1", m1, meta)
    assert "| o_proj | ours block_n=8 | 4.00 | 70 | out 2.5e-03 |" in text
    assert "| o_proj | ours block_n=4 | - | - | AssertionError: beyond |" in text
    m2 = {"rows": [{"programs": 1, "kernels": 230, "us_per_kernel": {"PDL off": 2.0, "PDL on": 1.2}}]}
    assert "| 1 | 230 | 2.000 | 1.200 |" in bench.markdown("m2", m2, meta)
    m4 = {"weight_gb": 2.47, "roofline_us_at_copy_rate": 600.0, "inductor_compile_s": 40.0, "checks": {},
          "step_us": {"ours (kernel set)": 800.0, "Inductor max-autotune (the same work)": 1000.0}}
    assert "| ours (kernel set) | 800.0 | 0.80 | 0.75 |" in bench.markdown("m4", m4, meta)


@needs_triton
def test_the_m4_step_of_the_kernel_set_matches_the_eager_step_under_the_interpreter():
    """m4's two steps (2 layers at odd widths here) on the same weights and caches give the same greedy token and
    logits within bfloat16 of each other; it is the same code the GPU runs at the 1B shapes."""
    code = f"""
import sys, torch
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
from superkernel.runtime.cuda.decode_kernels.interpret import fix_bf16
fix_bf16()
from superkernel.runtime.cuda.decode_kernels.configs import DecodeShape
import gpu_decode_kernels_step as m4
odd = DecodeShape(hidden=300, n_q_heads=6, n_kv_heads=2, head_dim=40, intermediate=333, vocab=1001, kv_len=77)
step = m4.Step(odd, 2, "cpu")
token, pos = torch.tensor([7]), torch.tensor([50])
c = m4.compare(step.ours(token, pos), step.eager(token, pos))
print(c["top1_agrees"], c["max_diff_over_max"] < 2e-2, step.weight_bytes())
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    per_layer = 2 * (2 * 300 + (6 + 2 * 2) * 40 * 300 + 300 * 6 * 40 + 3 * 300 * 333)  # bf16: norms, qkv, o, mlp
    assert proc.stdout.split() == ["True", "True", str(2 * per_layer + 1001 * 300 * 2 + 600)], proc.stdout


@needs_triton
def test_check_runs_every_kernel_at_llama_1b_shapes_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert sum("max error" in line for line in lines) == 6, proc.stdout
    assert "m2 chain, 6 launches, 3 programs, no PDL: right" in lines and lines[-1] == "check passed"


@needs_triton
def test_the_m2_chain_kernel_with_pdl_compiles_for_sm90a():
    """PDL's griddepcontrol instructions (inline PTX the interpreter cannot run) assemble for Hopper."""
    code = f"""
import importlib.util, torch
from superkernel.runtime.cuda.decode_kernels import aot
spec = importlib.util.spec_from_file_location("b", {str(SCRIPT)!r}); b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
a = torch.empty(132 * 256, device="meta"); c = torch.empty_like(a)
for pdl in (False, True):
    (launch,) = aot.record(b.run_chain, b.chain_kernel(), a, c, 1, 132, pdl)
    from triton.compiler import ASTSource
    src, options = aot.source(launch)
    import triton
    from triton.backends.compiler import GPUTarget
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    print(pdl, k.metadata.launch_pdl, "griddepcontrol.wait" in k.asm["ptx"], aot.ptxas_usage(k.asm["ptx"])["spill_stores"])
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["False False False 0", "True True True 0"], proc.stdout


def test_gpu_run_sh_runs_the_four_parts_and_generate_within_one_lease():
    """decodekernels (m1-m4) and dkgenerate: 480 s of limits, two device calls of under 10 minutes each, leaving
    ~5 of a 15-minute lease for the machine's start and one part rerun (docs/gpu.md)."""
    import re

    text = (ROOT / "benchmarks" / "gpu_run.sh").read_text()
    block = text[text.index("if part decodekernels"):text.index("if part dkgenerate")]
    limits = {m.group(1): int(m.group(2)) for m in re.finditer(r"(m\d)\) limit=\$\{DK_M\d_LIMIT:-(\d+)\}", block)}
    assert set(limits) == {"m1", "m2", "m3", "m4"} and sum(limits.values()) <= 300, limits
    assert "for p in m1 m2 m3 m4" in block and "benchmarks/gpu_decode_kernels.py --parts $p" in block
    generate = text[text.index("if part dkgenerate"):]
    generate = generate[:generate.index("\n    fi")]
    (limit,) = [int(x) for x in re.findall(r"DK_GEN_LIMIT:-(\d+)", generate)]
    assert limit <= 180 and sum(limits.values()) + limit <= 480
    assert "benchmarks/gpu_generate.py --model llama-1b" in generate and "--tag dk" in generate
    plans = re.search(r"DK_GEN_PLANS:-([^}]+)\}", generate).group(1).split(",")
    assert plans[0] == "all_layers:max-autotune:decode-kernels" and plans[1] == "hf:reduce-overhead"
    assert plans[-1] == "hf:max-autotune"  # the slowest compile last: it cannot starve the rows before it


def test_the_m4_eager_step_compiles_as_one_graph():
    """m4 compiles Step.eager with Inductor on the GPU; here (Inductor's CPU backend, 2 layers at odd widths) Dynamo
    traces it whole, cache writes included, and the compiled step computes the eager one's logits."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_decode_kernels_step as m4
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from superkernel.runtime.cuda.decode_kernels.configs import DecodeShape

    odd = DecodeShape(hidden=300, n_q_heads=6, n_kv_heads=2, head_dim=40, intermediate=333, vocab=1001, kv_len=77)
    step = m4.Step(odd, 2, "cpu")
    token, pos = torch.tensor([7]), torch.tensor([50])
    want = step.eager(token, pos)
    got = torch.compile(step.eager, dynamic=False, fullgraph=True)(token, pos)
    c = m4.compare(got, want)
    assert c["top1_agrees"] and c["max_diff_over_max"] < 2e-2, c


@needs_triton
def test_the_dry_run_goes_through_every_part_on_the_cpu(tmp_path):
    """--dry-run: the four parts' code (checks, Inductor compiles, graphs replaced by a wall clock, tables) at small
    odd shapes under the interpreter, as the GPU will run them at the 1B shapes (about 2 minutes on 2 cores)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--rounds", "1", "--replays", "1", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tables = {p: (tmp_path / f"gpu_decode_kernels_{p}_dry-run-cpu.md").read_text() for p in ("m1", "m2", "m3", "m4")}
    m1 = tables["m1"].splitlines()
    assert sum("| ours " in line for line in m1) == sum(len(v) for k, v in bench_candidates().items()
                                                        if k != "attention")
    assert not any("FAILED" in line or "Error" in line for t in tables.values() for line in t.splitlines())
    assert sum("Inductor max-autotune" in line for line in m1) == 5
    assert "| 1 | 230 |" in tables["m2"] and "| 3 | 230 |" in tables["m2"]
    assert sum("| attention L=30 of 37 | ours" in line for line in tables["m3"].splitlines()) == 4
    m4 = json.loads((tmp_path / "gpu_decode_kernels_m4_dry-run-cpu.json").read_text())
    assert m4["checks"]["ours vs eager PyTorch"]["top1_agrees"] and m4["checks"]["Inductor vs eager PyTorch"][
        "top1_agrees"] and isinstance(m4["checks"]["layer 0 of ours vs float64"], float)
    # the int8 weight-only step of the set: layer 0 within the gate of float64 (int8 * scale), half the bytes
    assert isinstance(m4["checks"]["layer 0 of ours int8 vs float64 of int8 * scale"], float)
    assert m4["int8_weight_gb"] < 0.6 * m4["weight_gb"] and m4["int8_vs_ours"] > 0
    assert "ours int8 weight-only (kernel set)" in tables["m4"]


@needs_triton
def test_the_generate_dry_run_hooks_the_kernel_set_up_and_writes_every_row(tmp_path):
    """benchmarks/gpu_generate.py --dry-run (dkgenerate's code on the CPU under the interpreter): the plan with the
    kernel set installs the hookup on both layers with nothing declined, its tokens are compared with eager's, the
    HF recipes are skipped by name, and the tables are written."""
    pytest.importorskip("transformers")
    script = ROOT / "benchmarks" / "gpu_generate.py"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    plans = "all_layers:max-autotune:decode-kernels,hf:reduce-overhead,all_layers:max-autotune,hf:max-autotune"
    proc = subprocess.run([sys.executable, str(script), "--dry-run", "--tag", "dk", "--plans", plans, "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_generate_dry-run-llama_dk_dry-run.json").read_text())
    rows = {r["plan"]: r for r in result["rows"]}
    assert list(rows) == ["eager", "superkernel all_layers:max-autotune:decode-kernels", "hf-static-compile",
                          "superkernel all_layers:max-autotune", "hf-static-compile-max-autotune"]
    dk = rows["superkernel all_layers:max-autotune:decode-kernels"]
    assert "error" not in dk, dk
    assert dk["decode_kernels"].startswith("decode kernel set: 2 decoder layers hooked (bfloat16)")
    assert "left to Inductor" not in dk["decode_kernels"]
    assert isinstance(dk["tokens_equal_eager"], bool) and 0 <= dk["agreement"] <= 1
    assert "decode_kernels" not in rows["superkernel all_layers:max-autotune"]
    assert rows["hf-static-compile"]["skipped"].endswith("on GPUs only")
    assert result["dry_run"] is True
    table = (tmp_path / "gpu_generate_dry-run-llama_dk_dry-run.md").read_text()
    assert "dry run" in table.lower() and "| superkernel all_layers:max-autotune:decode-kernels |" in table


def bench_candidates():
    from superkernel.runtime.cuda.decode_kernels.configs import CANDIDATES

    return CANDIDATES
