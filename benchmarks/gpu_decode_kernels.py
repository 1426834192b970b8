"""The decode kernel set (issue 61, ``runtime/cuda/decode_kernels``) on a GPU: is it worth hooking into max-autotune?

    python benchmarks/gpu_decode_kernels.py --parts m1,m2,m3,m4 [--out DIR]  # on a CUDA machine (gpu_run.sh part)
    python benchmarks/gpu_decode_kernels.py --check                          # CPU: Triton's interpreter, no timing
    python benchmarks/gpu_decode_kernels.py --dry-run [--skip-inductor]     # CPU: every part at small odd shapes

Prepared on the CPU and not yet run on a GPU. Parts (each writes ``gpu_decode_kernels_<part>_<card>.{json,md}``, so
a part that times out leaves the others' files):

* **m1** every kernel of the set at Llama-3.2-1B's shapes (batch 1, bfloat16): the GEMV alone by ``F.linear``
  (cuBLAS), the same fused work in PyTorch (``decode_kernels/eager.py``) compiled by Inductor as superkernel's CUDA
  max-autotune compiles it (``max-autotune-no-cudagraphs``, coordinate descent tuning on while tracing), and ours with
  each launch candidate (``configs.CANDIDATES``). Weights rotate over copies that together exceed 3x the L2 cache.
* **m2** a CUDA graph of 230 dependent tiny Triton kernels (a step's count), with and without programmatic
  dependent launch (``launch_pdl`` + ``gdc_wait``), at 1 and at 132 programs: the cost of one kernel boundary.
* **m3** decode attention of one layer at the step's KV length (161 of a 162-position cache) and at 1024 / 4096 of
  a 4096 cache: SDPA over the static cache with a mask (what the step runs) against ours per candidate.
* **m4** a Llama-3.2-1B-shaped step (16 layers, random weights, ``gpu_decode_kernels_step.py``) by the kernel set
  against the same work in PyTorch compiled by Inductor as above, same weights and caches, each one CUDA graph: per
  step time, the roofline at the card's copy rate, layer 0 of ours against float64, the logits against each other.

Every plan is checked against the float64 reference before it is timed (a plan off the bfloat16 tolerance is
reported and not timed). Times: a CUDA graph of many calls replayed between two CUDA events (never a Python loop of
launches), 5 interleaved rounds, median, in microseconds per call.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_decode_kernels_step (m4)

from superkernel.runtime.cuda.decode_kernels import eager, problems, reference  # noqa: E402
from superkernel.runtime.cuda.decode_kernels.configs import CANDIDATES, LLAMA_1B, DecodeShape, describe  # noqa: E402

PARTS = ("m1", "m2", "m3", "m4")
CHAIN_KERNELS = 230  # kernels per step of the compiled Llama-3.2-1B step (docs/gpu.md)
ATTENTION_CASES = ((162, 161), (4096, 1024), (4096, 4096))  # (cache length, KV length)
#: ``--dry-run``: every part on the CPU under Triton's interpreter at odd small shapes, the "times" wall-clock of one
#: pass of the calls (meaningless as figures: the run checks the script, not the kernels' speed).
DRY_SHAPE = DecodeShape(hidden=96, n_q_heads=6, n_kv_heads=2, head_dim=24, intermediate=80, vocab=300, kv_len=37)


class Setup:
    """Where the parts run: the GPU at the 1B shapes, or ``--dry-run``'s CPU."""
    dry = False
    device = "cuda"
    shape = LLAMA_1B
    layers = 16
    attention_cases = ATTENTION_CASES
    chain_programs = (1, 132)
    pdl = (False, True)

    @classmethod
    def dry_run(cls) -> None:
        cls.dry, cls.device, cls.shape, cls.layers = True, "cpu", DRY_SHAPE, 2
        cls.attention_cases, cls.chain_programs, cls.pdl = ((37, 30),), (1, 3), (False,)  # (no PDL in the interpreter)


def MODE() -> str | None:  # noqa: N802
    """Inductor's mode: superkernel's CUDA max-autotune; the default in a dry run (no GEMM autotuning on the CPU)."""
    return None if Setup.dry else "max-autotune-no-cudagraphs"


def synchronize() -> None:
    if not Setup.dry:
        torch.cuda.synchronize()
WEIGHTS = ("w", "w_qkv", "w_gate", "w_up")
#: Large blocks for the interpreter (few programs); rows of the two largest weights checked on the CPU.
INTERPRET_LAUNCH = {"qkv_rope": dict(block_p=32, block_k=2048), "attention": dict(splits=4, block_s=64),
                    "o_proj": dict(block_n=256, block_k=2048), "gate_up": dict(block_n=512, block_k=2048),
                    "down": dict(block_n=256, block_k=2048), "lm_head": dict(block_n=256, block_k=1024, split_k=2)}
INTERPRET_ROWS = {"gate_up": 2048, "lm_head": 4099}


# ---------------------------------------------------------------------------------------------- the chain (m2)
def chain_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def chain(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start its prologue now ...
            tl.extra.cuda.gdc_wait()  # ... and this one waits for the previous one's writes
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask, other=0.0) + 1.0, mask=mask)

    return chain


def run_chain(kernel: Any, a: torch.Tensor, b: torch.Tensor, launches: int, programs: int, pdl: bool) -> None:
    """``launches`` dependent kernels ping-ponging between a and b, each adding 1 (a ends + launches if even)."""
    import triton

    n = a.numel()
    block = max(16, triton.next_power_of_2(triton.cdiv(n, programs)))
    extra = {"launch_pdl": True} if pdl else {}
    for i in range(launches):
        src, dst = (a, b) if i % 2 == 0 else (b, a)
        kernel[(programs,)](src, dst, n, BLOCK=block, PDL=pdl, num_warps=4, **extra)


# ---------------------------------------------------------------------------------------------- timing
def graph_us(calls: list[Callable[[], Any]], replays: int) -> Callable[[], float]:
    """A measure: microseconds per call of ``calls`` captured in one CUDA graph, replayed ``replays`` times between
    two CUDA events. The calls run three times first on a side stream (Triton compiles, Inductor autotunes)."""
    if Setup.dry:
        def wall() -> float:
            start = time.perf_counter()
            for c in calls:
                c()
            return (time.perf_counter() - start) * 1e6 / len(calls)
        return wall
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def measure() -> float:
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / (replays * len(calls))

    return measure


def copy_gbps() -> float:
    """The card's copy rate (read + write of 1 GiB, in a graph), GB/s counted once: what a GEMV's bytes are read at,
    at best."""
    if Setup.dry:
        return 1.0
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    us = statistics.median(graph_us([lambda: dst.copy_(src)], 5)() for _ in range(3))
    return 2 * src.numel() * 2 / (us * 1e-6) / 1e9


def timed_rows(plans: dict[str, list[Callable[[], Any]]], rounds: int, replays: int) -> dict[str, float]:
    from superkernel.timing import interleave

    measures, labels = [], []
    for label, calls in plans.items():
        try:
            measures.append(graph_us(calls, replays))
            labels.append(label)
        except Exception as exc:  # one plan failing to capture leaves the others timed
            print(f"  {label}: not timed ({type(exc).__name__}: {exc})"[:400], flush=True)
    return {label: statistics.median(t) for label, t in zip(labels, interleave(measures, rounds))}


# ---------------------------------------------------------------------------------------------- the parts
def inductor_fn(name: str, shape: DecodeShape) -> Callable[..., Any]:
    """The eager form compiled as superkernel's CUDA max-autotune compiles (GEMVs become Triton reductions)."""
    from torch._inductor import config as inductor_config

    fn = torch.compile(eager.function(name, shape), mode=MODE(), dynamic=False)

    def call(**inputs: Any) -> Any:
        with inductor_config.patch(coordinate_descent_tuning=True):
            return fn(**inputs)

    return call


def copies_for(inputs: dict[str, Any], l2_bytes: int) -> list[dict[str, Any]]:
    """Copies of ``inputs`` with their own weights, enough that one pass reads over 3x the L2 cache."""
    weight = sum(inputs[k].numel() * inputs[k].element_size() for k in WEIGHTS if k in inputs)
    n = max(1, min(16, math.ceil(3 * l2_bytes / max(weight, 1))))
    return [inputs] + [{k: (v.clone() if k in WEIGHTS else v) for k, v in inputs.items()} for _ in range(n - 1)]


def check_plan(label: str, name: str, inputs: dict[str, Any], want: dict[str, torch.Tensor], run: Callable[[], Any],
               floor: float) -> tuple[bool, dict[str, float] | str]:
    """``run()``'s outputs against ``want`` (``problems.expected``, computed once per problem: lm_head's float64
    reference alone reads a 2 GB copy of the weight)."""
    try:
        got = problems.produced(name, inputs, run())
        return True, {out: reference.check(f"{name}.{out}", got[out], want[out], floor) for out in want}
    except Exception as exc:
        print(f"  {label}: FAILED its check: {type(exc).__name__}: {exc}"[:600], flush=True)
        return False, f"{type(exc).__name__}: {exc}"[:300]


def part_m1(args: argparse.Namespace, l2: int, gbps: float, save: Callable[[dict], None]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for name in [n for n in problems.NAMES if n != "attention"]:
        start = time.perf_counter()
        inputs = problems.make_inputs(name, Setup.shape, Setup.device)
        sets = copies_for(inputs, l2)
        want = problems.expected(name, inputs, Setup.shape)
        weight_bytes = sum(inputs[k].numel() * 2 for k in WEIGHTS if k in inputs)
        plans: dict[str, list[Callable[[], Any]]] = {}
        errors: dict[str, Any] = {}
        errors["cuBLAS F.linear (the GEMV alone)"] = None  # (not the fused work: nothing to check it against)
        plans["cuBLAS F.linear (the GEMV alone)"] = [eager.gemv_only(name, s) for s in sets]
        if not args.skip_inductor:
            compiled = inductor_fn(name, Setup.shape)
            label = "Inductor max-autotune (the same fused work)"
            ok, errors[label] = check_plan(label, name, inputs, want, lambda: compiled(**inputs),
                                           problems.EAGER_FLOOR)
            if ok:
                plans[label] = [lambda s=s: compiled(**s) for s in sets]
        for launch in CANDIDATES[name]:
            label = f"ours {describe(launch)}"
            ok, errors[label] = check_plan(label, name, inputs, want,
                                           lambda: problems.call(name, inputs, Setup.shape, launch), 2e-3)
            if ok:
                plans[label] = [lambda s=s, launch=launch: problems.call(name, s, Setup.shape, launch) for s in sets]
        times = timed_rows(plans, args.rounds, args.replays)
        rows.append({"problem": name, "weight_mb": weight_bytes / 1e6, "copies": len(sets),
                     "plans": {label: {"us": times.get(label), "check": errors.get(label),
                                       "pct_of_copy_rate": (100 * weight_bytes / (times[label] * 1e-6) / 1e9 / gbps)
                                       if label in times else None} for label in plans | errors},
                     "seconds": round(time.perf_counter() - start, 1)})
        print(name, {k: round(v, 2) for k, v in times.items()}, flush=True)
        save({"rows": rows, "partial": True})  # a timeout later in the part keeps the rows done
        del inputs, sets, plans
        if not Setup.dry:
            torch.cuda.empty_cache()
    return {"rows": rows}


def part_m2(args: argparse.Namespace) -> dict[str, Any]:
    kernel = chain_kernel()
    rows = []
    for programs in Setup.chain_programs:
        a = torch.zeros(programs * 256, device=Setup.device)
        b = torch.zeros_like(a)
        plans = {}
        for pdl in Setup.pdl:
            a.zero_()
            b.zero_()
            run_chain(kernel, a, b, CHAIN_KERNELS, programs, pdl)
            synchronize()
            right = bool((a == CHAIN_KERNELS).all())  # 230 adds of 1, ending in a (an even count)
            print(f"chain of {CHAIN_KERNELS}, {programs} programs, PDL {pdl}: values {'right' if right else 'WRONG'}")
            if right:
                plans[f"PDL {'on' if pdl else 'off'}"] = [
                    lambda pdl=pdl: run_chain(kernel, a, b, CHAIN_KERNELS, programs, pdl)]
        times = timed_rows(plans, args.rounds, max(3, args.replays // 4))
        rows.append({"programs": programs, "kernels": CHAIN_KERNELS,
                     "us_per_kernel": {k: v / CHAIN_KERNELS for k, v in times.items()},
                     "us_per_graph": times})
        print(programs, {k: round(v / CHAIN_KERNELS, 3) for k, v in times.items()}, flush=True)
    return {"rows": rows}


def part_m3(args: argparse.Namespace, save: Callable[[dict], None]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for cache, length in Setup.attention_cases:
        shape = DecodeShape(**{**Setup.shape.__dict__, "kv_len": cache})
        inputs = problems.make_inputs("attention", shape, Setup.device, length=length)
        plans: dict[str, list[Callable[[], Any]]] = {}
        errors: dict[str, Any] = {}
        sdpa = eager.function("attention", shape)
        want = problems.expected("attention", inputs, shape)
        label = "SDPA over the static cache, masked (the step's)"
        ok, errors[label] = check_plan(label, "attention", inputs, want, lambda: sdpa(**inputs),
                                       problems.EAGER_FLOOR)
        if ok:
            plans[label] = [lambda: sdpa(**inputs)] * 20
        for launch in CANDIDATES["attention"]:
            label = f"ours {describe(launch)}"
            ok, errors[label] = check_plan(label, "attention", inputs, want,
                                           lambda: problems.call("attention", inputs, shape, launch), 2e-3)
            if ok:
                plans[label] = [lambda launch=launch: problems.call("attention", inputs, shape, launch)] * 20
        times = timed_rows(plans, args.rounds, args.replays)
        kv_mb = 2 * shape.n_kv_heads * length * shape.head_dim * 2 / 1e6
        rows.append({"cache": cache, "length": length, "kv_mb_read": kv_mb,
                     "plans": {label: {"us": times.get(label), "check": errors.get(label)} for label in errors}})
        print(f"attention L={length}/{cache}", {k: round(v, 2) for k, v in times.items()}, flush=True)
        save({"rows": rows, "partial": True})
    return {"rows": rows}


def part_m4(args: argparse.Namespace, gbps: float) -> dict[str, Any]:
    from torch._inductor import config as inductor_config

    from gpu_decode_kernels_step import Step, compare
    from superkernel.runtime.cuda.decode_kernels import layer, reference

    step = Step(Setup.shape, Setup.layers, Setup.device)
    token = torch.tensor([min(1234, Setup.shape.vocab - 1)], device=Setup.device)
    pos = torch.tensor([Setup.shape.kv_len - 2], device=Setup.device)  # the last step of the benchmark's cache
    x, cos, sin = step._inputs(token, pos)
    kc, vc = step.k_caches[0].clone(), step.v_caches[0].clone()
    want = layer.reference_layer(x, step.layers[0], cos, sin, int(pos), kc, vc, Setup.shape)
    got = layer.decode_layer(x, step.layers[0], cos, sin, pos, pos + 1, kc, vc, Setup.shape, step.launches)
    checks: dict[str, Any] = {}
    try:
        checks["layer 0 of ours vs float64"] = reference.check("layer 0", got, want, floor=problems.EAGER_FLOOR)
    except AssertionError as exc:
        checks["layer 0 of ours vs float64"] = f"FAILED {exc}"[:300]
    eager_logits = step.eager(token, pos)
    ours_logits = step.ours(token, pos)
    checks["ours vs eager PyTorch"] = compare(ours_logits, eager_logits)
    # int8 weight-only by the set: the same weights quantized per channel (the target: <= 0.60x of ours)
    step8 = Step(Setup.shape, Setup.layers, Setup.device, int8=True)
    x8, cos8, sin8 = step8._inputs(token, pos)
    kc8, vc8 = step8.k_caches[0].clone(), step8.v_caches[0].clone()
    want8 = layer.reference_layer(x8, step8.layers[0], cos8, sin8, int(pos), kc8, vc8, Setup.shape)
    got8 = layer.decode_layer(x8, step8.layers[0], cos8, sin8, pos, pos + 1, kc8, vc8, Setup.shape, step8.launches)
    try:
        checks["layer 0 of ours int8 vs float64 of int8 * scale"] = reference.check(
            "layer 0 int8", got8, want8, floor=problems.EAGER_FLOOR)
    except AssertionError as exc:
        checks["layer 0 of ours int8 vs float64 of int8 * scale"] = f"FAILED {exc}"[:300]
    checks["ours int8 vs ours bfloat16"] = compare(step8.ours(token, pos), ours_logits)
    plans = {"ours (kernel set)": [lambda: step.ours(token, pos)],
             "ours int8 weight-only (kernel set)": [lambda: step8.ours(token, pos)]}
    compile_s = None
    if not args.skip_inductor:
        start = time.perf_counter()
        compiled = torch.compile(step.eager, mode=MODE(), dynamic=False)
        with inductor_config.patch(coordinate_descent_tuning=True):
            compiled_logits = compiled(token, pos)
        compile_s = round(time.perf_counter() - start, 1)
        checks["Inductor vs eager PyTorch"] = compare(compiled_logits, eager_logits)

        def inductor_step() -> Any:
            with inductor_config.patch(coordinate_descent_tuning=True):
                return compiled(token, pos)

        plans["Inductor max-autotune (the same work)"] = [inductor_step]
    plans["eager PyTorch in a CUDA graph"] = [lambda: step.eager(token, pos)]
    print(checks, f"Inductor compile {compile_s} s", flush=True)
    times = timed_rows(plans, args.rounds, max(5, args.replays // 2))
    roofline_us = step.weight_bytes() / (gbps * 1e9) * 1e6
    return {"weight_gb": step.weight_bytes() / 1e9, "roofline_us_at_copy_rate": roofline_us,
            "int8_weight_gb": step8.weight_bytes() / 1e9,
            "int8_vs_ours": times["ours int8 weight-only (kernel set)"] / times["ours (kernel set)"]
            if {"ours int8 weight-only (kernel set)", "ours (kernel set)"} <= set(times) else None,
            "step_us": times, "checks": checks, "inductor_compile_s": compile_s,
            "ours_vs_inductor": times["ours (kernel set)"] / times["Inductor max-autotune (the same work)"]
            if {"ours (kernel set)", "Inductor max-autotune (the same work)"} <= set(times) else None}


# ---------------------------------------------------------------------------------------------- output
def markdown(part: str, result: dict[str, Any], meta: dict[str, Any]) -> str:
    head = [f"# Decode kernel set on the GPU, part {part} ({meta['device']})", "",
            f"torch {meta['torch']}, Triton {meta['triton']}, {meta['date']}; copy rate {meta['copy_gbps']:.0f} "
            "GB/s. Microseconds per call: a CUDA graph of many calls replayed between CUDA events, median of "
            f"{meta['rounds']} interleaved rounds. Written by `benchmarks/gpu_decode_kernels.py --parts {part}`.", ""]
    lines = []
    if part == "m4":
        inductor = result["step_us"].get("Inductor max-autotune (the same work)")
        lines += [f"Step of {result['weight_gb']:.2f} GB of weights; roofline at the copy rate "
                  f"{result['roofline_us_at_copy_rate']:.0f} us; Inductor's compile {result['inductor_compile_s']} s.",
                  "", "| plan | us per step | vs Inductor | roofline / time |", "|---|---|---|---|"]
        for label, us in result["step_us"].items():
            ratio = f"{us / inductor:.2f}" if inductor else "-"
            lines.append(f"| {label} | {us:.1f} | {ratio} | {result['roofline_us_at_copy_rate'] / us:.2f} |")
        if result.get("int8_vs_ours") is not None:
            lines += ["", f"int8 weight-only ({result['int8_weight_gb']:.2f} GB of weights, lm_head included) over "
                          f"ours in bfloat16: {result['int8_vs_ours']:.2f}x (the issue's target: <= 0.60x)."]
        lines += ["", "Checks: " + json.dumps(result["checks"])]
        return "\n".join(head + lines) + "\n"
    if part == "m2":
        lines += ["| programs | kernels | PDL off us/kernel | PDL on us/kernel |", "|---|---|---|---|"]
        for r in result["rows"]:
            u = r["us_per_kernel"]
            lines.append(f"| {r['programs']} | {r['kernels']} | {u.get('PDL off', float('nan')):.3f} | "
                         f"{u.get('PDL on', float('nan')):.3f} |")
        return "\n".join(head + lines) + "\n"
    lines += ["| problem | plan | us | % of copy rate | check (max error / max ref) |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        key = r.get("problem") or f"attention L={r['length']} of {r['cache']}"
        for label, p in r["plans"].items():
            us = f"{p['us']:.2f}" if p.get("us") is not None else "-"
            pct = f"{p['pct_of_copy_rate']:.0f}" if p.get("pct_of_copy_rate") is not None else "-"
            chk = p["check"] if isinstance(p["check"], str) else (
                "-" if p["check"] is None else ", ".join(f"{k} {v:.1e}" for k, v in p["check"].items()))
            lines.append(f"| {key} | {label} | {us} | {pct} | {chk} |")
    return "\n".join(head + lines) + "\n"


def check() -> int:
    """Every kernel at Llama-3.2-1B's shapes (the two largest weights on a slice of their rows) against float64,
    under Triton's interpreter where there is no GPU (every candidate where there is one); the m2 chain without PDL
    (the interpreter cannot run PDL's inline PTX)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        from superkernel.runtime.cuda.decode_kernels.interpret import fix_bf16
        fix_bf16()
    failed = 0
    for name in problems.NAMES:
        launches = CANDIDATES[name] if device == "cuda" else [INTERPRET_LAUNCH[name]]
        rows = None if device == "cuda" else INTERPRET_ROWS.get(name)
        for launch in launches:
            inputs = problems.make_inputs(name, LLAMA_1B, device, rows=rows)
            start = time.perf_counter()
            try:
                errors = problems.check(name, inputs, LLAMA_1B, problems.call(name, inputs, LLAMA_1B, launch))
                status = "max error " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items())
            except AssertionError as exc:
                failed, status = failed + 1, f"FAILED {exc}"
            what = f"first {rows} rows" if rows else "full shape"
            print(f"{name:9s} {describe(launch):45s} {what:16s} {status} ({time.perf_counter() - start:.1f} s)",
                  flush=True)
    a, b = torch.zeros(300, device=device), torch.zeros(300, device=device)
    run_chain(chain_kernel(), a, b, 6, 3, pdl=False)
    chain_ok = bool((a == 6).all())
    print(f"m2 chain, 6 launches, 3 programs, no PDL: {'right' if chain_ok else 'WRONG'}")
    print("check", "passed" if not failed and chain_ok else "FAILED")
    return 0 if not failed and chain_ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="values only (Triton's interpreter on the CPU)")
    parser.add_argument("--dry-run", action="store_true", help="every part on the CPU at small odd shapes under "
                        "Triton's interpreter: the script's own check, no figures")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--skip-inductor", action="store_true", help="m1 without the Inductor rows (its compiles)")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(set(parts) - set(PARTS))}; allowed: {', '.join(PARTS)}")
    if args.check:
        return check()
    if args.dry_run:
        from superkernel.runtime.cuda.decode_kernels.interpret import fix_bf16
        fix_bf16()
        Setup.dry_run()
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --check or --dry-run (Triton's interpreter) on the CPU")
    import triton

    props = torch.cuda.get_device_properties(0) if not args.dry_run else None
    card = props.name.replace("NVIDIA ", "").replace(" ", "-") if props else "dry-run-cpu"
    gbps = copy_gbps()
    meta = {"device": props.name if props else "CPU, Triton's interpreter (dry run: no figures)", "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "copy_gbps": gbps, "rounds": args.rounds,
            "replays": args.replays}
    print(meta, flush=True)
    l2 = getattr(props, "L2_cache_size", 50 << 20) if props else 0  # (dry run: one copy of each weight)
    args.out.mkdir(parents=True, exist_ok=True)
    for part in parts:
        start = time.perf_counter()
        stem = args.out / f"gpu_decode_kernels_{part}_{card}"

        def save(result: dict[str, Any], stem: Path = stem, part: str = part) -> None:
            stem.with_suffix(".json").write_text(json.dumps({**meta, "part": part, **result}, indent=2) + "\n")
            stem.with_suffix(".md").write_text(markdown(part, result, meta))

        result = {"m1": lambda: part_m1(args, l2, gbps, save), "m2": lambda: part_m2(args),
                  "m3": lambda: part_m3(args, save), "m4": lambda: part_m4(args, gbps)}[part]()
        result["seconds"] = round(time.perf_counter() - start, 1)
        save(result)
        print(markdown(part, result, meta), flush=True)
    return 0


if __name__ == "__main__":
    if ("--check" in sys.argv and not torch.cuda.is_available()) or "--dry-run" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module imports Triton
    raise SystemExit(main())
