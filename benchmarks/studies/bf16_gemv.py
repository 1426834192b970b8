"""bf16 decode GEMVs (M = 1) at Qwen2-0.5B's shapes: every path, weights read from memory, against the bandwidth bound.

    .venv/bin/python benchmarks/studies/bf16_gemv.py [--shapes 4864x896,896x4864,896x896,128x896,151936x896]
                                             [--rounds 21] [--name bf16_gemv]

Per weight shape ``N x K`` (``y = x @ W.T``, ``x`` one row): 2-16 distinct bf16 copies of the weight (twice the
last-level cache where that takes at most 16), all applied in one superkernel scope, and before every timed
call a read of a buffer twice the last-level cache, so that each call reads its weights from memory as a
decode step does; compiled in one process as

* ``eager``: ``F.linear`` in bf16 (ATen's bf16 GEMM; oneDNN takes bf16 only with avx512_bf16/AMX),
* ``max-autotune, bf16_gemv off``: superkernel max-autotune with Inductor's C++ GEMM template as shipped,
* ``max-autotune, bf16_gemv on``: the same with ``inductor.bf16_gemv: true`` (whole 16-bit weight loads
  and a 2 KiB prefetch in the micro-kernel, :mod:`superkernel.runtime.inductor.bf16_gemv`),
* ``float32 max-autotune``: the same GEMV on float32 copies (twice the bytes), the rate the fp32 kernel
  reads memory at,

then timed in interleaved rounds (the order reversed every other round); the median round per path, divided
by the copies. GB/s = weight bytes / time; the bound is the read bandwidth measured in the same run
(``real_width.memory_bandwidth``). Outputs are checked against a float32 reference and the two max-autotune
variants against each other bit for bit. Writes benchmarks/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from superkernel import hugepages

PAGES = hugepages.enable_for_this_process()

import torch  # noqa: E402

import superkernel as sk  # noqa: E402
from superkernel.runtime.inductor.bf16_gemv import applies, inductor_isa_is_avx2, native_bf16  # noqa: E402
from superkernel.runtime.inductor.gemm_timing import last_level_cache_bytes  # noqa: E402
from superkernel.tools.advisor.compiling import own_code  # noqa: E402
from superkernel.tools.advisor.environment import hardware  # noqa: E402
from superkernel.util import write_results  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from real_width import memory_bandwidth  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
PATHS = ("eager", "max-autotune, bf16_gemv off", "max-autotune, bf16_gemv on", "float32 max-autotune")


class Copies(torch.nn.Module):
    """``copies`` Linear(K -> N) layers without bias, all applied to the same row, in one scope."""

    def __init__(self, n: int, k: int, copies: int, dtype: torch.dtype, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(k, n, bias=False) for _ in range(copies))
        for layer in self.layers:
            layer.weight.data = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        with sk.super_kernel("gemv"):
            return [layer(x) for layer in self.layers]


def _compiled(module: torch.nn.Module, bf16_gemv: bool, tag: str) -> Any:
    """``module`` compiled by superkernel max-autotune, through a code object of its own (Dynamo keeps one
    compiled graph per code object, so every variant stays compiled beside the others)."""
    def step(x: torch.Tensor) -> list[torch.Tensor]:
        return module(x)

    cfg = sk.CompilerConfig.from_dict({"mode": "max-autotune", "inductor": {"bf16_gemv": bf16_gemv}})
    return torch.compile(own_code(step, tag), backend=sk.get_backend(cfg), dynamic=False)


def run_shape(n: int, k: int, rounds: int) -> dict[str, Any]:
    copies = max(2, min(16, -(-2 * last_level_cache_bytes() // (n * k * 2))))
    evict = torch.ones(2 * last_level_cache_bytes() // 4)
    bf16 = Copies(n, k, copies, torch.bfloat16, seed=n * 7 + k).eval()
    f32 = Copies(n, k, max(2, copies // 2), torch.float32, seed=n * 7 + k + 1).eval()
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    calls = {"eager": (bf16, x), "max-autotune, bf16_gemv off": (_compiled(bf16, False, f"off_{n}_{k}"), x),
             "max-autotune, bf16_gemv on": (_compiled(bf16, True, f"on_{n}_{k}"), x),
             "float32 max-autotune": (_compiled(f32, False, f"f32_{n}_{k}"), x.float())}
    row: dict[str, Any] = {"n": n, "k": k, "copies": copies, "compile_s": {}, "max_abs_err": {}}
    outputs = {}
    with torch.no_grad():
        for name, (fn, arg) in calls.items():
            start = time.perf_counter()
            outputs[name] = fn(arg)
            row["compile_s"][name] = time.perf_counter() - start
            module = f32 if name.startswith("float32") else bf16
            ref = [torch.nn.functional.linear(arg.float(), layer.weight.float()) for layer in module.layers]
            row["max_abs_err"][name] = max((o.float() - r).abs().max().item() for o, r in zip(outputs[name], ref))
        row["bit_identical_on_off"] = all(torch.equal(a, b) for a, b in zip(outputs["max-autotune, bf16_gemv off"],
                                                                           outputs["max-autotune, bf16_gemv on"]))
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for r in range(rounds):
            for name in (PATHS if r % 2 == 0 else PATHS[::-1]):
                fn, arg = calls[name]
                evict.sum()  # the caches hold none of the weights (outside the clock)
                start = time.perf_counter()
                fn(arg)
                per = (time.perf_counter() - start) / (copies if not name.startswith("float32") else len(f32.layers))
                samples[name].append(per)
    row["us_per_gemv"] = {name: statistics.median(s) * 1e6 for name, s in samples.items()}
    row["GBps"] = {name: n * k * (4 if name.startswith("float32") else 2) / (statistics.median(s) * 1e9)
                   for name, s in samples.items()}
    row["on_vs_off"] = row["us_per_gemv"]["max-autotune, bf16_gemv on"] / row["us_per_gemv"]["max-autotune, bf16_gemv off"]
    print(f"  {n}x{k} ({copies} copies): " + ", ".join(f"{p} {row['us_per_gemv'][p]:.0f} us ({row['GBps'][p]:.1f} GB/s)"
                                                     for p in PATHS) + f"; on/off {row['on_vs_off']:.3f}", flush=True)
    return row


def markdown(result: dict[str, Any]) -> str:
    bw = result["bandwidth_read_GBps"]
    lines = [f"# bf16 decode GEMVs (M = 1) at Qwen2-0.5B's shapes, 1 thread, weights read from memory", "",
             f"Hardware: {result['hardware']}; torch {result['torch']}; CPU capability {result['cpu_capability']}, "
             f"native bf16 (avx512_bf16/AMX): {result['native_bf16']}, Inductor ISA AVX2: {result['inductor_avx2']}, "
             f"`inductor.bf16_gemv: auto` applies: {result['auto_applies']}. Pages: {result['pages']}.",
             f"Load: {result['load_start']} at the start, {result['load_end']} at the end (2 cores shared with other jobs).",
             f"Read bandwidth (best of sum / W@x / x@W over 512 MiB, float32, measured before and after): {bw:.1f} GB/s.",
             "Per shape: 2-16 distinct weight copies in one scope, caches evicted before each timed call; each path timed in "
             f"{result['rounds']} interleaved rounds (order reversed every other round); median per GEMV. "
             "GB/s = weight bytes / time (float32: 4 bytes per weight).", "",
             "| N x K | bound us (bf16) | " + " | ".join(PATHS) + " | on / off | on: x bound | same bits on/off | max abs err (on, vs f32) |",
             "|---|---|" + "---|" * len(PATHS) + "---|---|---|---|"]
    for r in result["rows"]:
        bound = r["n"] * r["k"] * 2 / (bw * 1e9) * 1e6
        cells = [f"{r['us_per_gemv'][p]:.0f} us ({r['GBps'][p]:.1f} GB/s)" for p in PATHS]
        lines.append(f"| {r['n']}x{r['k']} | {bound:.0f} | " + " | ".join(cells) + f" | {r['on_vs_off']:.3f} | "
                     f"{r['us_per_gemv']['max-autotune, bf16_gemv on'] / bound:.2f} | {r['bit_identical_on_off']} | "
                     f"{r['max_abs_err']['max-autotune, bf16_gemv on']:.3g} |")
    lines += ["", "Compile (first call, s wall; the on variant reuses the off variant's non-GEMM builds): " +
              "; ".join(f"{r['n']}x{r['k']}: " + ", ".join(f"{p} {r['compile_s'][p]:.1f}" for p in PATHS[1:])
                        for r in result["rows"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4864x896,896x4864,896x896,128x896,151936x896")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--name", default="bf16_gemv")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        assert all(len(s) == 2 and min(s) > 0 for s in shapes)
    except (ValueError, AssertionError):
        parser.error(f"--shapes {args.shapes!r}: comma-separated NxK with positive integers, e.g. 4864x896")
    cold = tempfile.TemporaryDirectory(prefix="bf16_gemv_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold.name
    torch.set_num_threads(1)
    load_start = " ".join(f"{v:.2f}" for v in os.getloadavg())
    bw = memory_bandwidth()["read"]
    rows = [run_shape(n, k, args.rounds) for n, k in shapes]
    bw = max(bw, memory_bandwidth()["read"])
    result = {"hardware": hardware(torch.device("cpu")), "torch": torch.__version__,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": native_bf16(),
              "inductor_avx2": inductor_isa_is_avx2(), "auto_applies": applies("auto"), "pages": PAGES,
              "load_start": load_start, "load_end": " ".join(f"{v:.2f}" for v in os.getloadavg()),
              "bandwidth_read_GBps": bw / 1e9, "rounds": args.rounds, "rows": rows}
    write_results(args.output, args.name, result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
