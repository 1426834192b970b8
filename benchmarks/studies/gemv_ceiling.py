"""How fast can anything read a Qwen2-0.5B-shaped decode step's weights on this CPU, one thread?

    .venv/bin/python benchmarks/studies/gemv_ceiling.py [--rounds 5] [--layers 24] [--dtypes float32,bfloat16]

Issue 24 asks for max-autotune within 1.15x of the memory roofline, where the roofline divides
the step's bytes by the best *one-buffer* streaming read. This benchmark asks what that target
means for the 24 x 7 projection weights a decode step reads one tensor after another:

- ``sum, one buffer``: a plain AVX2 sum over one buffer of the same size (the roofline's kind of read);
- ``sum, the step's tensors``: the same sum, tensor by tensor, over the step's 168 separate weights;
- ``MKL packed``: ``torch.ops.mkl._mkl_linear`` on prepacked weights, Inductor's extern choice for f32;
- ``ATen linear``: ``torch.nn.functional.linear`` (eager's path);
- ``hand dot rows``: a GEMV written here, four weight rows at a time (four streams);
- ``hand blocked``: the same over weights packed ``[N/16, K, 16]``, one sequential stream (the order
  of Inductor's C++ GEMM template at M = 1);
- ``hand dot rows + next head``: ``hand dot rows`` prefetching the first 64 KiB of the *next* weight
  during the last quarter of the current one (does the stream's ramp-up at each tensor cost time?);
- ``..., q/k/v and gate/up concatenated``: the same bytes as four tensors a layer (what
  ``inductor.autofusion``'s horizontal GEMM rule builds): do fewer, longer streams read faster?

The hand kernels exist only here (built with ``torch.utils.cpp_extension`` at run time, like
Inductor's own C++), to bound what a kernel could reach; they are not a superkernel feature.
Every variant runs once per round in a rotating order; figures are medians over rounds, and the
ratio column is that variant over ``sum, one buffer`` in the same rounds. Results:
``benchmarks/results/gemv_ceiling.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent  # benchmarks/: results/ and the scripts this study builds on
sys.path.insert(0, str(BENCH.parent / "src"))

from superkernel import hugepages  # noqa: E402
from superkernel.timing import rotation  # noqa: E402

# as in real_width.py (whose roofline this bounds): weights on transparent huge pages unless
# SUPERKERNEL_HUGEPAGES=0, set before torch's first allocation
PAGES = hugepages.enable_for_this_process()

#: A decoder layer's projections (out, in) at Qwen2-0.5B width.
LAYER = (("q_proj", (896, 896)), ("k_proj", (128, 896)), ("v_proj", (128, 896)), ("o_proj", (896, 896)),
         ("gate_proj", (4864, 896)), ("up_proj", (4864, 896)), ("down_proj", (896, 4864)))
NEXT_HEAD_BYTES = 64 << 10

_SOURCE = r'''
#include <torch/extension.h>
#include <immintrin.h>
#include <cstring>
static inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_hadd_ps(a, a); a = _mm_hadd_ps(a, a); return _mm_cvtss_f32(a);
}
static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const at::BFloat16* p) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}
template <typename T>
static void rows4_impl(const T* w, const float* x, float* y, int64_t N, int64_t K, const char* next, int64_t next_bytes) {
  const int64_t pf_from = N - N / 4;
  int64_t line = 0;
  for (int64_t n = 0; n + 4 <= N; n += 4) {
    if (next && n >= pf_from) {
      for (int j = 0; j < 4 && line * 64 < next_bytes; ++j, ++line) _mm_prefetch(next + line * 64, _MM_HINT_T0);
    }
    const T *r0 = w + n * K, *r1 = r0 + K, *r2 = r1 + K, *r3 = r2 + K;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t k = 0; k < K; k += 16) {   // K is a multiple of 16 at these shapes (checked by the caller)
      __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
      a0 = _mm256_fmadd_ps(load8(r0 + k), x0, a0); b0 = _mm256_fmadd_ps(load8(r0 + k + 8), x1, b0);
      a1 = _mm256_fmadd_ps(load8(r1 + k), x0, a1); b1 = _mm256_fmadd_ps(load8(r1 + k + 8), x1, b1);
      a2 = _mm256_fmadd_ps(load8(r2 + k), x0, a2); b2 = _mm256_fmadd_ps(load8(r2 + k + 8), x1, b2);
      a3 = _mm256_fmadd_ps(load8(r3 + k), x0, a3); b3 = _mm256_fmadd_ps(load8(r3 + k + 8), x1, b3);
    }
    y[n] = hsum(_mm256_add_ps(a0, b0)); y[n + 1] = hsum(_mm256_add_ps(a1, b1));
    y[n + 2] = hsum(_mm256_add_ps(a2, b2)); y[n + 3] = hsum(_mm256_add_ps(a3, b3));
  }
}
torch::Tensor dot_rows(torch::Tensor W, torch::Tensor x, c10::optional<torch::Tensor> next) {
  TORCH_CHECK(W.is_contiguous() && x.is_contiguous() && x.scalar_type() == at::kFloat);
  int64_t N = W.size(0), K = W.size(1);
  TORCH_CHECK(N % 4 == 0 && K % 16 == 0, "shape not supported by this experiment");
  auto y = torch::empty({N}, x.options());
  const char* nx = next ? static_cast<const char*>(next->data_ptr()) : nullptr;
  int64_t nb = next ? next->numel() * next->element_size() : 0;
  if (nb > NEXT_HEAD) nb = NEXT_HEAD;
  if (W.scalar_type() == at::kFloat) rows4_impl(W.data_ptr<float>(), x.data_ptr<float>(), y.data_ptr<float>(), N, K, nx, nb);
  else rows4_impl(W.data_ptr<at::BFloat16>(), x.data_ptr<float>(), y.data_ptr<float>(), N, K, nx, nb);
  return y;
}
template <typename T>
static void blocked_impl(const T* w, const float* x, float* y, int64_t NB, int64_t K) {
  for (int64_t nb = 0; nb < NB; ++nb) {
    const T* b = w + nb * K * 16;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, c0 = a0, c1 = a0;
    for (int64_t k = 0; k < K; k += 2) {
      __m256 xa = _mm256_broadcast_ss(x + k), xb = _mm256_broadcast_ss(x + k + 1);
      a0 = _mm256_fmadd_ps(load8(b + k * 16), xa, a0); a1 = _mm256_fmadd_ps(load8(b + k * 16 + 8), xa, a1);
      c0 = _mm256_fmadd_ps(load8(b + k * 16 + 16), xb, c0); c1 = _mm256_fmadd_ps(load8(b + k * 16 + 24), xb, c1);
    }
    _mm256_storeu_ps(y + nb * 16, _mm256_add_ps(a0, c0)); _mm256_storeu_ps(y + nb * 16 + 8, _mm256_add_ps(a1, c1));
  }
}
torch::Tensor blocked(torch::Tensor P, torch::Tensor x) {
  TORCH_CHECK(P.is_contiguous() && P.size(2) == 16 && P.size(1) % 2 == 0);
  int64_t NB = P.size(0), K = P.size(1);
  auto y = torch::empty({NB * 16}, x.options());
  if (P.scalar_type() == at::kFloat) blocked_impl(P.data_ptr<float>(), x.data_ptr<float>(), y.data_ptr<float>(), NB, K);
  else blocked_impl(P.data_ptr<at::BFloat16>(), x.data_ptr<float>(), y.data_ptr<float>(), NB, K);
  return y;
}
int64_t stream_sum(torch::Tensor t) {   // reads every byte once (32-bit integer adds: any dtype)
  TORCH_CHECK(t.is_contiguous());
  const char* p = static_cast<const char*>(t.data_ptr());
  int64_t n = t.numel() * t.element_size(), i = 0;
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (; i + 128 <= n; i += 128) {
    a = _mm256_add_epi32(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi32(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_add_epi32(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_add_epi32(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a = _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d));
  int32_t out[8]; std::memcpy(out, &a, 32);
  int64_t s = 0; for (int j = 0; j < 8; ++j) s += out[j];
  for (; i < n; ++i) s += p[i];
  return s;
}
'''


def build():
    from torch.utils.cpp_extension import load_inline

    source = _SOURCE.replace("NEXT_HEAD", str(NEXT_HEAD_BYTES))
    return load_inline("superkernel_gemv_ceiling", cpp_sources=source, functions=["dot_rows", "blocked", "stream_sum"],
                       extra_cflags=["-O3", "-mavx2", "-mfma"], verbose=False)


def blocked_weight(w):
    n, k = w.shape
    return w.reshape(n // 16, 16, k).transpose(1, 2).contiguous()


class Step:
    """One decode step's projection weights (``layers`` x 7 separate tensors) in every layout a variant needs."""

    def __init__(self, torch, dtype, layers: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.dtype = dtype
        self.weights = [torch.randn(shape, generator=gen).to(dtype) for _ in range(layers) for _, shape in LAYER]
        self.blocked = [blocked_weight(w) for w in self.weights]
        self.packed = ([(torch.ops.mkl._mkl_reorder_linear_weight(w, 1), w) for w in self.weights]
                       if dtype == torch.float32 and torch.backends.mkl.is_available() else None)
        self.inputs = {k: torch.randn(1, k, generator=gen) for k in {s[1] for _, s in LAYER}}
        # the same bytes as 4 tensors a layer: q/k/v and gate/up concatenated (autofusion's horizontal_gemm)
        self.merged = []
        for i in range(0, len(self.weights), len(LAYER)):
            q, k, v, o, g, u, d = self.weights[i:i + len(LAYER)]
            self.merged += [torch.cat([q, k, v]), o, torch.cat([g, u]), d]
        self.merged_packed = ([(torch.ops.mkl._mkl_reorder_linear_weight(w, 1), w) for w in self.merged]
                              if self.packed is not None else None)
        self.bytes = sum(w.numel() * w.element_size() for w in self.weights)
        self.one_buffer = torch.randint(0, 255, (self.bytes,), dtype=torch.uint8, generator=gen)


def variants(torch, ext, step: Step) -> dict:
    F = torch.nn.functional
    ws, xs = step.weights, step.inputs
    x_of = [xs[w.shape[1]] for w in ws]
    xf = [x[0] for x in x_of]
    xl = [x.to(step.dtype) for x in x_of]
    nexts = ws[1:] + [None]
    mx = [xs[w.shape[1]] for w in step.merged]
    out = {
        "sum, one buffer": lambda: ext.stream_sum(step.one_buffer),
        "sum, the step's tensors": lambda: [ext.stream_sum(w) for w in ws],
        "ATen linear": lambda: [F.linear(x, w) for x, w in zip(xl, ws)],
        "hand dot rows": lambda: [ext.dot_rows(w, x, None) for w, x in zip(ws, xf)],
        "hand blocked": lambda: [ext.blocked(p, x) for p, x in zip(step.blocked, xf)],
        "hand dot rows + next head": lambda: [ext.dot_rows(w, x, n) for w, x, n in zip(ws, xf, nexts)],
        "hand dot rows, q/k/v and gate/up concatenated": lambda: [ext.dot_rows(w, x[0], None)
                                                                  for w, x in zip(step.merged, mx)],
    }
    if step.packed is not None:
        out["MKL packed"] = lambda: [torch.ops.mkl._mkl_linear(x, p, w, None, 1) for x, (p, w) in zip(x_of, step.packed)]
        out["MKL packed, q/k/v and gate/up concatenated"] = lambda: [
            torch.ops.mkl._mkl_linear(x, p, w, None, 1) for x, (p, w) in zip(mx, step.merged_packed)]
    return out


def check(ext, step: Step) -> float:
    """Max abs difference of every hand kernel against ATen on the first layer (a wrong kernel is not timed)."""
    worst = 0.0
    for w, p in zip(step.weights[:7], step.blocked[:7]):
        x = step.inputs[w.shape[1]]
        ref = (x @ w.float().t())[0]
        for got in (ext.dot_rows(w, x[0], None), ext.blocked(p, x[0])):
            worst = max(worst, (got - ref).abs().max().item())
    if worst > 1e-2:
        raise SystemExit(f"a hand kernel disagrees with ATen by {worst}")
    return worst


def time_rounds(fns: dict, rounds: int) -> dict:
    names = list(fns)
    seconds = {n: [] for n in names}
    for r in range(rounds):
        order = [names[i] for i in rotation(len(names), r)]
        for n in order:
            fns[n]()  # one untimed pass: the same state for every variant (its tensors just left the caches)
            t = time.perf_counter()
            fns[n]()
            seconds[n].append(time.perf_counter() - t)
    return seconds


def run(args) -> dict:
    import torch
    from superkernel.hugepages import transparent_huge_pages_usable

    torch.set_num_threads(1)
    ext = build()
    out = {"meta": {"hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical cores",
                    "torch": torch.__version__, "threads": 1, "layers": args.layers, "rounds": args.rounds,
                    "huge_pages": PAGES,
                    "thp_usable": transparent_huge_pages_usable(), "load_start": os.getloadavg()}, "dtypes": {}}
    for name in args.dtypes:
        dtype = getattr(torch, name)
        step = Step(torch, dtype, args.layers)
        diff = check(ext, step)
        seconds = time_rounds(variants(torch, ext, step), args.rounds)
        base = seconds["sum, one buffer"]
        rows = {}
        for n, s in seconds.items():
            med = statistics.median(s)
            rows[n] = {"ms": med * 1e3, "gb_per_s": step.bytes / med / 1e9,
                       "vs_one_buffer": statistics.median(a / b for a, b in zip(s, base)), "rounds_ms": [x * 1e3 for x in s]}
        out["dtypes"][name] = {"bytes": step.bytes, "hand_kernel_max_abs_diff": diff, "rows": rows}
        print(f"{name}: " + "; ".join(f"{n} {r['ms']:.1f} ms ({r['gb_per_s']:.1f} GB/s, {r['vs_one_buffer']:.2f}x)"
                                      for n, r in rows.items()), flush=True)
        del step
    out["meta"]["load_end"] = os.getloadavg()
    smaps = Path("/proc/self/smaps_rollup")
    if smaps.is_file():
        out["meta"]["anon_huge_pages_kb"] = next((int(line.split()[1]) for line in smaps.read_text().splitlines()
                                                  if line.startswith("AnonHugePages")), None)
    return out


def render(data: dict) -> str:
    m = data["meta"]
    lines = ["# What reading a decode step's weights costs, one thread: streaming sums, MKL, ATen, hand GEMVs", "",
             f"{m['hardware']}, torch {m['torch']}, 1 thread; {m['layers']} Qwen2-0.5B-width layers (7 projections "
             f"each, separate tensors); {m['rounds']} rounds, every variant once per round in a rotating order, after "
             f"one untimed pass. huge pages switch (as real_width.py): {m['huge_pages']}, transparent huge pages usable: "
             f"{m['thp_usable']}, anonymous memory on huge pages at the end: "
             f"{(m.get('anon_huge_pages_kb') or 0) / 1024:.0f} MB. Load average at the start "
             f"{', '.join(f'{x:.2f}' for x in m['load_start'])}, at the end "
             f"{', '.join(f'{x:.2f}' for x in m['load_end'])}.", "",
             "`x one buffer` = the variant's time over `sum, one buffer`'s in the same round (median over rounds): "
             "the kind of read the real-width benchmarks' roofline assumes for the whole step.", ""]
    for name, d in data["dtypes"].items():
        lines += [f"## {name}: {d['bytes'] / 1e9:.2f} GB of projection weights (hand kernels' max abs diff vs ATen "
                  f"{d['hand_kernel_max_abs_diff']:.1e})", "",
                  "| variant | ms | GB/s | x one buffer |", "|---|---:|---:|---:|"]
        for n, r in d["rows"].items():
            lines.append(f"| {n} | {r['ms']:.1f} | {r['gb_per_s']:.1f} | {r['vs_one_buffer']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--output", type=Path, default=BENCH / "results")
    parser.add_argument("--name", default="gemv_ceiling")
    args = parser.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in args.dtypes if d not in ("float32", "bfloat16")]
    if bad or not args.dtypes:
        parser.error(f"--dtypes: {', '.join(bad) or 'none given'}; allowed: float32, bfloat16")
    if args.rounds < 1 or args.layers < 1:
        parser.error("--rounds and --layers must be >= 1")
    from superkernel.util import atomic_write

    args.output.mkdir(parents=True, exist_ok=True)
    for suffix in ("json", "md"):
        target = args.output / f"{args.name}.{suffix}"
        if target.is_dir():
            parser.error(f"{target} is a directory")
    data = run(args)
    atomic_write(args.output / f"{args.name}.json", json.dumps(data, indent=2) + "\n")
    atomic_write(args.output / f"{args.name}.md", render(data) + "\n")
    print(f"wrote {args.output / (args.name + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
