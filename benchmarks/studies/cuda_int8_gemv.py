"""Study (issue 36): can a Triton int8 weight-only GEMV of ours beat Inductor's reduction on the GPU's decode shapes?

    python benchmarks/studies/cuda_int8_gemv.py [--out DIR]          # on a CUDA machine
    TRITON_INTERPRET=1 python benchmarks/studies/cuda_int8_gemv.py --check   # CPU: the kernel's values only

Why: on the H200 the Llama-3.2-1B-shaped step quantized int8 weight-only by torchao ran at 2.26 ms, 1.9x the
bfloat16 step and 5.2x its own roofline (``benchmarks/results/gpu_decode_llama-1b_int8-weight_H200.md``): every
GEMV is Inductor's fused dequantize-and-reduce (``triton_red_fused__to_copy_..._mm``), e.g. the MLP down projection
16 us a call where its 16.8 MB need about 4 us. This measures, per projection shape of that step (batch 1,
bfloat16 activations, int8 weights with a bfloat16 scale per output row, torchao's weight-only layout):

* bfloat16 ``F.linear`` on the dequantized weight (cuBLAS: what the bfloat16 model runs);
* Inductor's compile of the graph torchao's linear produces (``(x @ w.t().to(bf16)) * s``: a reduction, no GEMM
  template applies, so max-autotune adds nothing), with coordinate descent tuning as superkernel's CUDA compile
  turns it on, and with it searching every direction at radius 2;
* our Triton kernel (below), autotuned over row blocks, K blocks and warps;
* a copy of the int8 weight (read + write, halved): the rate this card reads memory at.

Each is checked against a float64 reference first; then CUDA-event timed, rotating over enough weight copies to
leave the L2 cache. Writes ``cuda_int8_gemv.{json,md}`` to ``--out``. ``--check`` runs the kernel alone on small
shapes (Triton's interpreter on the CPU, ``TRITON_INTERPRET=1``; Triton 3.6's interpreter needs numpy < 2.4,
triton-lang/triton#9171) against the reference: how it was tested before any GPU time was spent on it. If the
kernel wins at the step's shapes, the next step is to call it from the CUDA rewrite as the CPU int8 kernel is
called (``runtime/inductor/quant_gemv.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import types
from pathlib import Path
from typing import Any, Callable

import torch

SHAPES = {"q_proj/o_proj": (2048, 2048), "k_proj/v_proj": (512, 2048), "gate/up": (8192, 2048),
          "down": (2048, 8192), "lm_head": (128256, 2048)}
CHECK_SHAPES = [(1, 64, 256), (2, 48, 300), (1, 5, 1000)]  # (rows of x, N, K): blocks, N and K tails


def _kernel(autotune: bool = True) -> Any:
    """The kernel, autotuned over row blocks, K blocks and warps; without ``autotune`` (Triton's interpreter has
    no driver to time configs with) the bare kernel, to be given BLOCK_N and BLOCK_K."""
    import triton
    import triton.language as tl

    configs = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w)
               for bn in (1, 4, 8) for bk in (1024, 2048) for w in (4, 8)]  # 12: a few seconds per shape

    @triton.jit
    def int8_gemv(x_ptr, w_ptr, s_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_ym,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid, m = tl.program_id(0), tl.program_id(1)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(x_ptr + m * stride_xm + rk, mask=rk < K, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K),
                        other=0).to(tl.float32)
            acc += tl.sum(w * xk[None, :], axis=1)
        s = tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * stride_ym + rn, (acc * s).to(y_ptr.dtype.element_ty), mask=rn < N)

    return triton.autotune(configs=configs, key=["N", "K"])(int8_gemv) if autotune else int8_gemv


def triton_gemv(kernel: Any, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, **blocks: int) -> torch.Tensor:
    """``(x @ float(w).T) * s``: x ``[M, K]``, w int8 ``[N, K]`` contiguous, s ``[N]``; one program per row block
    and row of x (``blocks``: BLOCK_N and BLOCK_K for the bare kernel)."""
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = lambda meta: ((n + meta["BLOCK_N"] - 1) // meta["BLOCK_N"], m)  # noqa: E731
    kernel[grid](x, w, s, y, n, k, x.stride(0), w.stride(0), y.stride(0), **blocks)
    return y


def reference(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().t()) * s.double()


def torchao_graph(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """What torchao's int8 weight-only linear computes (its graph under Dynamo)."""
    return (x @ w.t().to(x.dtype)) * s


def check() -> int:
    """The kernel's values on small shapes (Triton's interpreter where there is no GPU)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    kernel = _kernel(autotune=False)
    worst = 0.0
    for m, n, k in CHECK_SHAPES:
        g = torch.Generator().manual_seed(m * n + k)
        x = torch.randn(m, k, generator=g).to(device)
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g).to(device)
        s = (torch.rand(n, generator=g) * 1e-2).to(device)
        want = reference(x.cpu(), w.cpu(), s.cpu())
        for bn, bk in ((1, 512), (4, 128), (16, 1024)):
            got = triton_gemv(kernel, x, w, s, BLOCK_N=bn, BLOCK_K=bk)
            err = float((got.double().cpu() - want).abs().max() / want.abs().max())
            worst = max(worst, err)
            print(f"({m}, {k}) x ({n}, {k})^T, BLOCK_N {bn}, BLOCK_K {bk}: relative error {err:.2e}")
    ok = worst < 1e-5
    print("check", "passed" if ok else "FAILED")
    return 0 if ok else 1


def _events_ms(fn: Callable[[], Any], reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def measure(out: Path, rounds: int, reps: int) -> int:
    from torch._inductor import config as inductor_config

    from superkernel.timing import interleave  # (the project's rotation of rounds; PYTHONPATH=src as gpu_run.sh)

    kernel = _kernel()
    device, dtype = "cuda", torch.bfloat16
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    rows = []

    for name, (n, k) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g).to(device)
        s = (torch.rand(n, generator=g) * 1e-2 + 1e-3).to(device, dtype)
        x = torch.randn(1, k, generator=g).to(device, dtype)
        dense = (w.to(dtype) * s[:, None]).contiguous()
        copies = max(1, -(-3 * l2 // (n * k)))
        nw = itertools.cycle([w.clone() for _ in range(copies)]).__next__
        nd = itertools.cycle([dense.clone() for _ in range(max(1, copies // 2))]).__next__

        torch._dynamo.reset()

        def inductor(tag: str, **patch: Any) -> Callable[..., Any]:
            """torchao's graph compiled under ``patch``, as a function of its own (Dynamo caches per code object:
            the same code compiled twice would give the first compile back)."""
            code = torchao_graph.__code__.replace(co_name=f"torchao_graph_{tag}")
            fn = torch.compile(types.FunctionType(code, torchao_graph.__globals__), dynamic=False)
            with inductor_config.patch(**patch):
                fn(x, w, s)  # compiled now, under the patch
            return fn

        cdt = inductor("cdt", coordinate_descent_tuning=True)
        cdt_all = inductor("cdt_all", coordinate_descent_tuning=True, coordinate_descent_check_all_directions=True,
                           coordinate_descent_search_radius=2)
        plans: dict[str, Callable[[], Any]] = {
            "bf16 F.linear (cuBLAS)": lambda: torch.nn.functional.linear(x, nd()),
            "Inductor + coordinate descent (superkernel's CUDA compile)": lambda: cdt(x, nw(), s),
            "Inductor, coordinate descent all directions r2": lambda: cdt_all(x, nw(), s),
            "our Triton GEMV": lambda: triton_gemv(kernel, x, nw(), s),
            "int8 weight copy (read+write)/2": lambda: nw().clone(),
        }
        ref = reference(x.float().cpu(), w.cpu(), s.float().cpu())
        errors: dict[str, float | None] = {}
        with torch.no_grad():
            for label, fn in list(plans.items()):
                if label.startswith("int8 weight copy"):
                    errors[label] = None
                    continue
                try:
                    got = fn().double().cpu()
                except Exception as exc:  # a study: one way failing leaves the others measured
                    print(f"{name}: {label} failed: {type(exc).__name__}: {exc}"[:500], flush=True)
                    del plans[label]
                    continue
                errors[label] = float((got - ref).abs().max() / ref.abs().max())
            halve = {label: 2 if label.startswith("int8 weight copy") else 1 for label in plans}
            times = dict(zip(plans, interleave([lambda f=f, h=halve[label]: _events_ms(f, reps) / h
                                                for label, f in plans.items()], rounds)))
        best = getattr(kernel, "best_config", None)
        row = {"shape": name, "n": n, "k": k, "weight_mb": n * k / 1e6, "triton_best_config": str(best),
               "plans": {label: {"us": statistics.median(t) * 1e3, "rel_error": errors[label]}
                         for label, t in times.items()}}
        rows.append(row)
        print(name, {label: round(v["us"], 2) for label, v in row["plans"].items()}, flush=True)
    labels = list(dict.fromkeys(label for row in rows for label in row["plans"]))
    lines = ["# int8 weight-only GEMV on the GPU at Llama-3.2-1B's decode shapes (batch 1, bfloat16)", "",
             f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; median of {rounds} interleaved rounds of "
             f"{reps} calls (CUDA events), weights rotated past the L2 cache. Relative error: max |out - float64 "
             "reference| / max |reference|.", "",
             "| shape (N x K) | weight MB | " + " | ".join(f"{label} us (err)" for label in labels)
             + " | Triton config |", "|---|---|" + "---|" * (len(labels) + 1)]
    for row in rows:
        cells = " | ".join("-" if (p := row["plans"].get(label)) is None else f"{p['us']:.2f}"
                           + (f" ({p['rel_error']:.0e})" if p["rel_error"] is not None else "") for label in labels)
        lines.append(f"| {row['shape']} {row['n']}x{row['k']} | {row['weight_mb']:.1f} | {cells} | "
                     f"{row['triton_best_config']} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_int8_gemv.json").write_text(json.dumps({"device": torch.cuda.get_device_name(0),
                                                         "torch": torch.__version__, "rows": rows}, indent=2) + "\n")
    (out / "cuda_int8_gemv.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="the kernel's values on small shapes only")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args(argv)
    if args.check:
        return check()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --check (TRITON_INTERPRET=1) on the CPU")
    return measure(args.out, args.rounds, args.reps)


if __name__ == "__main__":
    if "--check" in os.sys.argv and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    raise SystemExit(main())
