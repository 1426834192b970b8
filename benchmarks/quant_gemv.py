"""The int8 weight-only GEMV at a Qwen2-0.5B step's real shapes: what each way of running it costs on this CPU.

    .venv/bin/python benchmarks/quant_gemv.py [--threads 1] [--rounds 7]

For every projection shape of the step (q/o 896x896, k/v 128x896, gate/up 4864x896, down 896x4864,
lm_head 151936x896), batch 1, in float32 and in bfloat16:

* float GEMV: ``F.linear`` on the dequantized weight, compiled by Inductor (what the float model runs);
* ATen ``_weight_int8pack_mm`` (Inductor's own weight-only pattern rewrites to it, for bfloat16 only);
* Inductor's compile of the graph torchao's int8 weight-only linear produces (``mm(x, float(w_int8).T) * s``);
* superkernel's rewrite (``superkernel.runtime.inductor.quant_gemv``) of the same graph, both ways it can go:
  our int8 kernel (``superkernel.runtime.cpu.quant_kernels``, where this CPU has AVX-512 or AVX2) and Inductor's reduction
  reading int8 (elsewhere, and for bfloat16);
* for float32 also the W8A8 dot of the same weight with an int8 activation: ATen's ``torch._int_mm`` and our
  kernel (``torch.ops.superkernel.int8_gemv``);
* a plain ``sum`` over a float32 view of the same int8 bytes: the rate this core reads memory at here.

``--int4``: instead, torchao's CPU int4 weight-only layout (groups of ``--group``, default 128) at the same shapes, float32
activations: ATen's ``_weight_int4pack_mm_for_cpu`` (what the eager model and Inductor run), the same call with
bfloat16 activations (the only ones Inductor's int4 template and ATen's vector kernel take) and our kernel
(``torch.ops.superkernel.int4_weight_gemv``); writes ``quant_gemv_int4.{json,md}``.

Each is checked against a float64 reference first, then timed in interleaved rounds (median of per-round
medians), rotating over enough copies of the weights that they come from memory, as in a decode step (one
copy of a projection fits in the last-level cache and would time the cache). The weight bytes read at the measured copy bandwidth give the roofline. Writes
``benchmarks/results/quant_gemv.{json,md}``: the measurement behind the rewrite's rule.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from superkernel.timing import interleave
from superkernel.util import atomic_write

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {"q_proj/o_proj": (896, 896), "k_proj/v_proj": (128, 896), "gate/up": (4864, 896), "down": (896, 4864),
          "lm_head": (151936, 896)}


def woq_graph(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """What torchao's Int8WeightOnlyConfig linear decomposes to."""
    return torch.mm(x, w.to(x.dtype).t()) * s


def float_gemv(x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, dense)


def compile_rewritten(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, kernel: bool = True) -> Callable[..., Any]:
    """``woq_graph`` through superkernel's rewrite, compiled by Inductor (the max-autotune CPU path); with
    ``kernel=False`` the rewrite is told our kernel is not there (Inductor's reduction)."""
    from superkernel.runtime.cpu import quant_kernels
    from superkernel.runtime.inductor.quant_gemv import rewrite_quantized_gemv

    def rewrite(g: torch.fx.GraphModule) -> None:
        saved = quant_kernels.fast_path
        if not kernel:
            quant_kernels.fast_path = lambda op: False
        try:
            rewrite_quantized_gemv(g)
        finally:
            quant_kernels.fast_path = saved

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._inductor.compile_fx import compile_fx_inner
        from torch._inductor.decomposition import select_decomp_table

        def fw(g: torch.fx.GraphModule, inputs: list[Any]) -> Any:
            rewrite(g)
            return compile_fx_inner(g, inputs, is_inference=True)

        return aot_module_simplified(gm, example_inputs, fw_compiler=fw, decompositions=select_decomp_table())

    return torch.compile(_own(woq_graph), backend=backend, dynamic=False)


def _own(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a code object of its own: Dynamo caches per code object, and a shared one would hit
    its recompile limit over the shapes and dtypes here and silently run the rest uncompiled."""
    from superkernel.tools.advisor.compiling import own_code

    return own_code(fn, f"v{next(_COUNTER)}")


_COUNTER = iter(range(10**6))


def timed(fn: Callable[[], Any], reps: int) -> float:
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def machine_line() -> str:
    """Where it ran: the CPU, its core count and the vector kernel each of our ops runs there."""
    from superkernel.runtime.cpu import quant_kernels
    from superkernel.util import cpu_id

    module = quant_kernels.load()
    kernels = module.fast_path() if module is not None else {}
    named = ", ".join(f"{op} {isa or 'plain loop'}" for op, isa in kernels.items()) or "not built"
    return f"CPU: {cpu_id()} (ATen {torch.backends.cpu.get_cpu_capability()}); superkernel's kernels: {named}."


def write_result(output: Path, stem: str, result: dict[str, Any], lines: list[str]) -> int:
    """``<stem>.json`` and ``<stem>.md`` in ``output`` (atomically); the table printed too, the machine named."""
    output.mkdir(parents=True, exist_ok=True)
    result["machine"] = machine_line()
    lines = [*lines[:2], result["machine"], "", *lines[2:]]
    atomic_write(output / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    atomic_write(output / f"{stem}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _cell(plan: dict[str, Any] | None) -> str:
    if plan is None:
        return "-"
    error = "" if plan["rel_error"] is None else f" ({plan['rel_error']:.0e})"
    return f"{plan['ms']:.3f}{error}"


_SHAPE_COLUMN: dict[str, Callable[[dict[str, Any]], str]] = {
    "shape (N x K)": lambda row: f"{row['shape']} {row['n']}x{row['k']}"}


def _plan_table(rows: list[dict[str, Any]], lead: dict[str, Callable[[dict[str, Any]], str]]) -> list[str]:
    """The markdown table of ``rows``: ``lead``'s columns (header -> cell of a row), then one column per timed way."""
    labels = list(dict.fromkeys(label for row in rows for label in row["plans"]))
    lines = ["| " + " | ".join([*lead, *(f"{label} ms (err)" for label in labels)]) + " |",
             "|" + "---|" * (len(lead) + len(labels))]
    for row in rows:
        cells = [*(cell(row) for cell in lead.values()), *(_cell(row["plans"].get(label)) for label in labels)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--int4", action="store_true", help="time the int4 weight-only GEMV ways instead")
    parser.add_argument("--tag", default="", help="appended to the result files' name (e.g. _avx2)")
    parser.add_argument("--group", type=int, default=128, help="--int4: weights per scale and zero point")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from superkernel.runtime.cpu import quant_kernels
    from superkernel.runtime.inductor.autofusion.machine import measure_bandwidth

    bandwidth = measure_bandwidth(256, 5)
    if args.int4:
        return int4_main(args, bandwidth, args.group)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, (n, k) in SHAPES.items():
            g = torch.Generator().manual_seed(0)
            w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
            s32 = torch.rand(n, generator=g) * 1e-2 + 1e-3
            x = torch.randn(1, k, generator=g).to(dtype)
            s = s32.to(dtype)
            dense = (w.double() * s.double()[:, None]).to(dtype)
            ref = x.double() @ (w.double() * s.double()[:, None]).t()
            from superkernel.runtime.inductor.gemm_timing import last_level_cache_bytes

            copies = max(1, -(-3 * last_level_cache_bytes() // (n * k)))  # int8 copies past the cache, x3
            next_w = itertools.cycle([w.clone() for _ in range(copies)]).__next__
            next_dense = itertools.cycle([dense.clone() for _ in range(
                max(1, -(-copies // (4 if dtype == torch.float32 else 2))))]).__next__

            plans: dict[str, Callable[[], Any]] = {
                "float GEMV (Inductor)": (lambda f=torch.compile(_own(float_gemv), dynamic=False): f(x, next_dense())),
                "ATen _weight_int8pack_mm": lambda: torch._weight_int8pack_mm(x, next_w(), s),
                "Inductor, torchao's graph": (lambda f=torch.compile(_own(woq_graph), dynamic=False): f(x, next_w(), s)),
                "superkernel rewrite, reduction": (lambda f=compile_rewritten(x, w, s, False): f(x, next_w(), s)),
            }
            if quant_kernels.fast_path("int8_weight_gemv") and dtype == torch.float32:
                plans["superkernel rewrite, our kernel"] = lambda f=compile_rewritten(x, w, s): f(x, next_w(), s)
            if dtype == torch.float32:
                xq = torch.randint(-127, 128, (1, k), dtype=torch.int8, generator=g)
                plans["W8A8: ATen _int_mm"] = lambda: torch._int_mm(xq, next_w().t())
                if quant_kernels.fast_path("int8_gemv"):
                    plans["W8A8: our kernel"] = lambda: torch.ops.superkernel.int8_gemv(xq, next_w())
                plans["plain sum over the int8 bytes"] = lambda: next_w().view(torch.float32).sum()
            errors: dict[str, float | None] = {}
            with torch.no_grad():
                for label, fn in plans.items():
                    out = fn().double()
                    if label.startswith("plain sum"):
                        errors[label] = None  # not a GEMV: the read rate only
                        continue
                    want = (xq.double() @ w.double().t()) if label.startswith("W8A8") else ref
                    errors[label] = float((out - want).abs().max() / want.abs().max())
                reps = max(3, args.reps // (20 if n > 100000 else 1))
                times = dict(zip(plans, interleave([lambda f=f: timed(f, reps) for f in plans.values()],
                                                   args.rounds)))
            roofline_ms = (n * k + n * s.element_size()) / bandwidth * 1e3
            row = {"dtype": str(dtype).replace("torch.", ""), "shape": name, "n": n, "k": k,
                   "roofline_int8_ms": roofline_ms, "plans": {}}
            for label in plans:
                median = statistics.median(times[label])
                row["plans"][label] = {"ms": median, "rel_error": errors[label], "x_roofline": median / roofline_ms}
            rows.append(row)
            print(dtype, name, {k: round(v["ms"], 3) for k, v in row["plans"].items()}, flush=True)
    result = {"threads": args.threads, "rounds": args.rounds, "copy_bandwidth_GBps": bandwidth / 1e9,
              "torch": torch.__version__, "rows": rows}
    lines = ["# int8 weight-only GEMV at a Qwen2-0.5B step's shapes (batch 1)", "",
             f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} interleaved rounds (median of per-round "
             f"medians); roofline = int8 weight bytes at the measured copy bandwidth {bandwidth / 1e9:.1f} GB/s. "
             "Relative error: max |out - float64 reference| / max |reference|.", "",
             *_plan_table(rows, {"dtype": lambda row: row["dtype"], **_SHAPE_COLUMN,
                                 "roofline ms": lambda row: f"{row['roofline_int8_ms']:.3f}"})]
    return write_result(args.output, "quant_gemv" + args.tag, result, lines)


def int4_main(args: argparse.Namespace, bandwidth: float, group: int = 128) -> int:
    """``--int4``: the int4 weight-only GEMV ways at the step's shapes (module doc)."""
    from superkernel.runtime.cpu import quant_kernels
    from superkernel.runtime.inductor.gemm_timing import last_level_cache_bytes

    rows = []
    for name, (n, k) in SHAPES.items():
        if n % 64:
            continue  # (torchao's CPU layout packs 64 output rows a block; k/v 128 is fine, all are multiples)
        g = torch.Generator().manual_seed(0)
        q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        sz = torch.rand(k // group, n, 2, generator=g) * 1e-2
        x = torch.randn(1, k, generator=g)
        scale, zero = (sz[torch.arange(k) // group, :, i].t().double() for i in (0, 1))
        ref = x.double() @ ((q.double() - 8) * scale + zero).t()
        copies = max(1, -(-3 * last_level_cache_bytes() // (n * k // 2)))
        next_w = itertools.cycle([packed.clone() for _ in range(copies)]).__next__

        xb, szb = x.bfloat16(), sz.bfloat16()
        plans: dict[str, Callable[[], Any]] = {
            "ATen, float32 activation": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, next_w(), group, sz),
            "ATen, bfloat16 activation": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, next_w(), group, szb),
        }
        if quant_kernels.fast_path("int4_weight_gemv"):
            plans["our kernel"] = lambda: torch.ops.superkernel.int4_weight_gemv(x, next_w(), group, sz)
        errors = {label: float((fn().double() - ref).abs().max() / ref.abs().max()) for label, fn in plans.items()}
        reps = {label: max(2, args.reps // (20 if n > 100000 else 1) // (10 if "float32" in label else 1))
                for label in plans}
        times = dict(zip(plans, interleave([lambda f=f, c=reps[label]: timed(f, c) for label, f in plans.items()],
                                           args.rounds)))
        roofline_ms = (n * k // 2 + sz.numel() * 4) / bandwidth * 1e3
        row = {"shape": name, "n": n, "k": k, "group": group, "roofline_ms": roofline_ms,
               "plans": {label: {"ms": statistics.median(times[label]), "rel_error": errors[label],
                                 "x_roofline": statistics.median(times[label]) / roofline_ms} for label in plans}}
        rows.append(row)
        print(name, {key: round(v["ms"], 3) for key, v in row["plans"].items()}, flush=True)
    lines = ["# int4 weight-only GEMV at a Qwen2-0.5B step's shapes (batch 1, float32 activations)", "",
             f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} interleaved rounds (median of per-round "
             f"medians); torchao's CPU int4 layout, groups of {group}; roofline = packed weight, scale and zero bytes "
             f"at the measured copy bandwidth {bandwidth / 1e9:.1f} GB/s. Relative error: max |out - float64 "
             "reference| / max |reference| (bfloat16 activations round the input).", "",
             *_plan_table(rows, {**_SHAPE_COLUMN, "roofline ms": lambda row: f"{row['roofline_ms']:.3f}"})]
    result = {"threads": args.threads, "rounds": args.rounds, "copy_bandwidth_GBps": bandwidth / 1e9,
              "torch": torch.__version__, "rows": rows}
    return write_result(args.output, "quant_gemv_int4" + args.tag, result, lines)


if __name__ == "__main__":
    raise SystemExit(main())
