"""Where a real-width max-autotune decode step spends its time, partition by partition and kernel by kernel.

    .venv/bin/python benchmarks/studies/real_width_breakdown.py [--layers 24] [--threads 1] [--steps 12]
                                                        [--no-isolated] [--name real_width_breakdown]

The model is benchmarks/real_width.py's Qwen2-0.5B-shaped ``Qwen2ForCausalLM`` (float32 unless --dtype, seeded random
weights), compiled once with superkernel ``max-autotune`` and one scope per decoder layer, with Inductor's
C++ kernel profiling on (``cpp.enable_kernel_profile``: every generated kernel records itself for
``torch.profiler``; off when the profiler is off). Then, on the same process:

* **partitions**: every compiled partition is wrapped by a wall clock (``perf_counter`` before and after);
  the decode step's wall minus the sum of its partitions is what runs outside them (Dynamo's guards, the
  glue between partitions, the output copy);
* **kernels**: ``torch.profiler`` over a few steps, self CPU time per kernel/operator, per step;
* **GEMM choices**: what Inductor's autotuning measured for every GEMM of the compile, each choice (its C++
  GEMM template on the packed weight, MKL's packed GEMM) at its real shape, timed as ``inductor.gemm_timing``
  says (default: weights evicted from the caches before every call), and which one it kept;
* **GEMMs in isolation** (unless ``--no-isolated``): every weight shape of the model (``N x K``, ``x`` of
  one row) through MKL (``F.linear``), ``torch.mv``, MKL's packed GEMM (Inductor's frozen ATen choice in
  f32) and oneDNN's packed linear, each over rotating copies of the weight totalling >= 256 MiB (so the
  weights come from memory, as in the model), interleaved rounds, median. Effective read bandwidth = weight
  bytes / time, beside the measured STREAM-like read bandwidth (benchmarks/real_width.py's ``memory_bandwidth``).

Writes benchmarks/results/<name>.{json,md}. Compile time (wall and CPU) is reported beside the step.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from superkernel import hugepages

PAGES = hugepages.enable_for_this_process()  # before torch's first allocation; SUPERKERNEL_HUGEPAGES=0: 4 KiB pages

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import superkernel as sk  # noqa: E402
from real_width import build_model, cpu_seconds, memory_bandwidth, RESULTS  # noqa: E402
from superkernel.tools.advisor.environment import hardware as describe_hardware  # noqa: E402
from superkernel.tools.advisor.strategies import plan_for  # noqa: E402
from superkernel.tools.advisor.structure import analyze_structure  # noqa: E402
from superkernel.tools.decode import prepare, run_decode  # noqa: E402
from superkernel.util import atomic_write  # noqa: E402


class PartitionClock:
    """Wall time per compiled partition, accumulated while ``on``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.labels: dict[str, str] = {}
        self.on = False

    def wrap(self, name: str, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.labels[name] = label

        def timed(*args: Any) -> Any:
            if not self.on:
                return fn(*args)
            start = time.perf_counter()
            out = fn(*args)
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            return out

        for attr in ("source_key",):
            if hasattr(fn, attr):
                setattr(timed, attr, getattr(fn, attr))
        return timed

    def install(self) -> None:
        from superkernel.runtime.realizations.inductor_rows import InductorCpu

        original = InductorCpu._compile
        clock = self

        def _compile(self: Any, job: Any, compile_fn: Any) -> Any:
            fn, suffix = original(self, job, compile_fn)
            return clock.wrap(job.module.partition.name, suffix, fn), suffix

        InductorCpu._compile = _compile  # type: ignore[method-assign]


def partition_kind(name: str) -> str:
    return "layer" if "decoder_layer" in name else name


def step_breakdown(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model = build_model(args.layers, getattr(torch, args.dtype), args.seed)
    session = prepare(model, prompt_len=args.prompt_len, steps=args.steps, warmup=args.warmup, seed=args.seed)
    scoped = copy.deepcopy(model)
    sk.apply_scopes(scoped, plan_for("decoder_layer", analyze_structure(scoped)).scopes)
    clock = PartitionClock()
    clock.install()
    from torch._inductor import config as inductor_config

    eager_run = run_decode(session, session.step_fn(), label="eager")
    session_scoped = prepare(scoped, prompt_len=args.prompt_len, steps=args.steps, warmup=args.warmup, seed=args.seed)
    autotuned: list[dict[str, Any]] = []

    def record(timings: dict[Any, float], name: str, input_nodes: Any, choices: Any, *_: Any) -> None:
        shapes = " x ".join(str(tuple(int(d) for d in n.get_size())) for n in input_nodes)
        best = min(timings, key=timings.get) if timings else None
        autotuned.append({"op": name, "inputs": shapes, "kept": getattr(best, "name", str(best)),
                          "ms": {getattr(c, "name", str(c)): t for c, t in timings.items()}})

    from torch._inductor.select_algorithm import add_feedback_saver, clear_feedback_savers

    add_feedback_saver(record)
    cfg = sk.CompilerConfig.from_dict({"mode": "max-autotune", "inductor": {"gemm_timing": args.gemm_timing}})
    backend = sk.get_backend(cfg)
    step = torch.compile(session_scoped.step_fn(), backend=backend, dynamic=False)
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    with inductor_config.patch({"cpp.enable_kernel_profile": args.kernel_profile}):
        first = run_decode(session_scoped, step, label="max-autotune")
    clear_feedback_savers()
    compile_wall = first.compile_seconds
    compile_cpu = cpu_seconds() - cpu0 - sum(first.step_seconds[1:])
    print(f"compiled in {compile_wall:.1f} s wall, {compile_cpu:.1f} s CPU (whole first run {time.perf_counter() - wall0:.1f} s)",
          flush=True)
    diff = (first.logits - eager_run.logits).abs().max().item()
    # partitions
    clock.on = True
    runs = [run_decode(session_scoped, step, label="max-autotune") for _ in range(args.rounds)]
    clock.on = False
    steps_timed = sum(len(r.step_seconds) for r in runs)
    step_ms = statistics.median(statistics.median(r.step_seconds[r.warmup:]) for r in runs) * 1e3
    mean_step_ms = sum(sum(r.step_seconds) for r in runs) / steps_timed * 1e3
    parts = {name: clock.seconds[name] / clock.calls[name] * 1e3 for name in clock.seconds}
    calls_per_step = {name: clock.calls[name] / steps_timed for name in clock.calls}
    kinds: dict[str, float] = defaultdict(float)
    for name, ms in parts.items():
        kinds[partition_kind(name)] += ms * calls_per_step[name]
    inside = sum(kinds.values())
    # kernels
    from torch.profiler import ProfilerActivity, profile

    session_scoped.restore_cache()
    prof_steps = min(4, session_scoped.total_steps)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(prof_steps):
            ids, pos = session_scoped.inputs(i)
            step(ids, pos)
    session_scoped.restore_cache()
    kernels = []
    for evt in prof.key_averages():
        kernels.append({"name": evt.key, "self_ms_per_step": evt.self_cpu_time_total / 1e3 / prof_steps,
                        "calls_per_step": evt.count / prof_steps})
    kernels.sort(key=lambda k: -k["self_ms_per_step"])
    counters = dict(backend.counters)
    return {"eager_ms": statistics.median(eager_run.step_seconds[eager_run.warmup:]) * 1e3,
            "step_ms_median": step_ms, "step_ms_mean": mean_step_ms, "compile_s_wall": compile_wall,
            "compile_s_cpu": compile_cpu, "max_abs_diff_vs_eager": diff,
            "partitions_ms": parts, "partition_labels": clock.labels, "partition_calls_per_step": calls_per_step,
            "kinds_ms_per_step": dict(kinds), "inside_partitions_ms": inside,
            "outside_partitions_ms": mean_step_ms - inside, "profiled_steps": prof_steps,
            "kernels": kernels[:60], "counters": counters, "autotuned": autotuned, "gemm_timing": args.gemm_timing,
            "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


SHAPES = {"q_proj / o_proj": (896, 896), "k_proj / v_proj": (128, 896), "gate_proj / up_proj": (4864, 896),
          "down_proj": (896, 4864), "lm_head": (151936, 896)}


def _copies(n: int, k: int, target: int = 256 * 2**20, cap: int = 400) -> int:
    return max(1, min(cap, -(-target // (n * k * 4))))


def _time_rotating(fns: dict[str, Callable[[int], Any]], copies: dict[str, int], rounds: int = 7) -> dict[str, float]:
    """Median ms per call of each variant; each call of a variant uses the next copy of the weight."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        for name, fn in fns.items():
            for i in range(copies[name]):
                fn(i)
        for _ in range(rounds):
            for name, fn in fns.items():
                c = copies[name]
                start = time.perf_counter()
                for i in range(c):
                    fn(i)
                samples[name].append((time.perf_counter() - start) / c * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def isolated_gemms(args: argparse.Namespace, read_bw: float) -> list[dict[str, Any]]:
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for label, (n, k) in SHAPES.items():
        c = _copies(n, k)
        weights = [torch.randn(n, k, generator=gen) * 0.02 for _ in range(c)]
        x = torch.randn(1, k, generator=gen)
        xv = x.reshape(k)
        fns: dict[str, Callable[[int], Any]] = {
            "F.linear (MKL sgemm)": lambda i: torch.nn.functional.linear(x, weights[i]),
            "torch.mv": lambda i: torch.mv(weights[i], xv),
        }
        copies = {name: c for name in fns}
        try:
            packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, 1) for w in weights]
            fns["MKL packed (_mkl_linear)"] = lambda i: torch.ops.mkl._mkl_linear(x, packed[i], weights[i], None, 1)
            copies["MKL packed (_mkl_linear)"] = c
        except Exception as exc:  # noqa: BLE001
            print(f"  {label}: MKL packed unavailable: {exc}", flush=True)
        try:
            onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
            fns["oneDNN packed (_linear_pointwise)"] = lambda i: torch.ops.mkldnn._linear_pointwise(
                x, onednn[i], None, "none", [], "")
            copies["oneDNN packed (_linear_pointwise)"] = c
        except Exception as exc:  # noqa: BLE001
            print(f"  {label}: oneDNN packed unavailable: {exc}", flush=True)
        timings = _time_rotating(fns, copies)
        per_gemm = dict(timings)
        wbytes = n * k * 4
        row = {"gemm": label, "n": n, "k": k, "weight_MB": wbytes / 1e6, "copies": c,
               "ms": per_gemm, "GBps": {name: wbytes / (ms * 1e-3) / 1e9 for name, ms in per_gemm.items()},
               "roofline_ms": wbytes / read_bw * 1e3}
        rows.append(row)
        print(f"  {label} ({n}x{k}, {wbytes / 1e6:.1f} MB, roofline {row['roofline_ms']:.3f} ms): "
              + ", ".join(f"{name} {ms:.3f} ms ({row['GBps'][name]:.1f} GB/s)" for name, ms in per_gemm.items()),
              flush=True)
        del weights, fns
    return rows


def markdown(result: dict[str, Any]) -> str:
    s = result["step"]
    bw = result["bandwidth_read_GBps"]
    item = 2 if result.get("dtype") == "bfloat16" else 4   # bytes per weight
    layer_mb = (896 * 896 * 2 + 128 * 896 * 2 + 4864 * 896 * 3) * item / 1e6   # a decoder layer's weights
    roof = s["weight_bytes"] / (bw * 1e9) * 1e3
    lines = [f"# Where the real-width max-autotune decode step goes (Qwen2-0.5B-shaped, {result['layers']} layers, "
             f"{result.get('dtype', 'float32')}, {result['threads']} thread(s))", "",
             f"Hardware: {result['hardware']}; torch {result['torch']}, transformers {result['transformers']}. "
             f"Load: {result['load_start']} at the start, {result['load_end']} at the end. Inductor cache: cold (fresh dir).",
             f"Read bandwidth {bw:.1f} GB/s (best of sum / W@x / x@W, 512 MiB); weights {s['weight_bytes'] / 1e9:.3f} GB "
             f"-> weight roofline {roof:.1f} ms.", "",
             f"Step: median {s['step_ms_median']:.1f} ms, mean {s['step_ms_mean']:.1f} ms ({s['step_ms_mean'] / roof:.2f}x "
             f"roofline); eager {s['eager_ms']:.1f} ms; max abs diff vs eager {s['max_abs_diff_vs_eager']:.2g}. "
             f"Compile {s['compile_s_wall']:.1f} s wall, {s['compile_s_cpu']:.1f} s CPU (with kernel profiling compiled in: "
             f"{result['kernel_profile']}).", "", "## Partitions (wall per step, partition clocks on)", "",
             "| partition | realization | ms / step | share of step |", "|---|---|---|---|"]
    mean = s["step_ms_mean"]
    for kind, ms in sorted(s["kinds_ms_per_step"].items(), key=lambda kv: -kv[1]):
        label = "+frozen" if any(s["partition_labels"].get(n) for n in s["partitions_ms"] if partition_kind(n) == kind) else ""
        lines.append(f"| {kind} | inductor{label} | {ms:.2f} | {ms / mean:.1%} |")
    lines.append(f"| outside partitions (guards, glue, output copy) | - | {s['outside_partitions_ms']:.2f} | "
                 f"{s['outside_partitions_ms'] / mean:.1%} |")
    layer_ms = [ms for n, ms in s["partitions_ms"].items() if partition_kind(n) == "layer"]
    if layer_ms:
        lines += ["", f"Per decoder layer: median {statistics.median(layer_ms):.3f} ms, min {min(layer_ms):.3f}, "
                      f"max {max(layer_ms):.3f} ({len(layer_ms)} layers); a layer's weights are "
                      f"{layer_mb:.1f} MB -> {layer_mb / bw:.3f} ms at {bw:.1f} GB/s."]
    lines += ["", f"## Kernels and operators (torch.profiler, self CPU per step over {s['profiled_steps']} steps; "
                  "identical layers share kernel names, so a row sums all layers)", "",
              "| kernel / operator | self ms / step | calls / step |", "|---|---|---|"]
    for k in s["kernels"][:30]:
        lines.append(f"| `{k['name'][:90]}` | {k['self_ms_per_step']:.3f} | {k['calls_per_step']:.0f} |")
    if s.get("autotuned"):
        lines += ["", f"## GEMM choices Inductor timed during the compile (inductor.gemm_timing = {s['gemm_timing']}; "
                      "ms per call at the real shape; effective GB/s = weight bytes / time)", "",
                  "| GEMM (x, packed W, W) | C++ template ms | ATen / MKL ms | kept | kept GB/s | times seen |",
                  "|---|---|---|---|---|---|"]
        seen: dict[tuple[str, str, str], int] = {}
        for a in s["autotuned"]:  # every lowering reports, cache hits (the next identical layer) included
            key = (a["op"], a["inputs"], json.dumps(sorted(a["ms"].values())))
            seen[key] = seen.get(key, 0) + 1
        for a in s["autotuned"]:
            key = (a["op"], a["inputs"], json.dumps(sorted(a["ms"].values())))
            if key not in seen:
                continue
            count = seen.pop(key)
            tmpl = [t for n, t in a["ms"].items() if n.startswith("cpp_")]
            mkl = [t for n, t in a["ms"].items() if not n.startswith("cpp_")]
            dims = a["inputs"].split(" x ")[-1].strip("()").split(",")
            wbytes = item
            for d in dims:
                wbytes *= int(d) if d.strip() else 1
            kept_ms = a["ms"].get(a["kept"])
            gbps = f"{wbytes / (kept_ms * 1e-3) / 1e9:.1f}" if kept_ms else "-"
            lines.append(f"| {a['inputs']} | {tmpl[0] if tmpl else float('nan'):.3f} | {mkl[0] if mkl else float('nan'):.3f} | "
                         f"{'template' if a['kept'].startswith('cpp_') else a['kept']} | {gbps} | {count} |")
    if result.get("isolated"):
        names = list(dict.fromkeys(n for r in result["isolated"] for n in r["ms"]))
        lines += ["", "## GEMMs in isolation (float32 weights, x of one row, rotating weight copies >= 256 MiB, median of interleaved "
                      "rounds): ms and effective read GB/s", "",
                  "| GEMM | N x K | MB | roofline ms | " + " | ".join(names) + " |",
                  "|---|---|---|---|" + "---|" * len(names)]
        for r in result["isolated"]:
            cells = [f"{r['ms'][n]:.3f} ({r['GBps'][n]:.1f})" if n in r["ms"] else "-" for n in names]
            lines.append(f"| {r['gemm']} | {r['n']}x{r['k']} | {r['weight_MB']:.1f} | {r['roofline_ms']:.3f} | "
                         + " | ".join(cells) + " |")
    lines += ["", "Counters: " + ", ".join(f"{k} {v}" for k, v in sorted(s["counters"].items()))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gemm-timing", default="memory", choices=("memory", "cache"),
                        help="inductor.gemm_timing of the compile")
    parser.add_argument("--no-kernel-profile", dest="kernel_profile", action="store_false")
    parser.add_argument("--no-isolated", dest="isolated", action="store_false")
    parser.add_argument("--no-step", dest="step", action="store_false")
    parser.add_argument("--name", default="real_width_breakdown")
    parser.add_argument("--from-json", type=Path, help="only rewrite <name>.md from this result file")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.from_json is not None:  # only the markdown again: nothing is measured
        result = json.loads(args.from_json.read_text())
        atomic_write(args.output / f"{args.name}.md", markdown(result) + "\n")
        return 0
    cold = tempfile.TemporaryDirectory(prefix="real_width_breakdown_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold.name
    import transformers

    torch.set_num_threads(args.threads)
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    bw = memory_bandwidth()
    result: dict[str, Any] = {"pages": {**hugepages.settings(), "switch": PAGES}, "hardware": describe_hardware(torch.device("cpu")), "torch": torch.__version__,
                              "transformers": transformers.__version__, "layers": args.layers, "threads": args.threads, "dtype": args.dtype,
                              "load_start": load_start, "kernel_profile": args.kernel_profile}
    if args.step:
        result["step"] = step_breakdown(args)
    bw2 = memory_bandwidth()
    result["bandwidth_read_GBps"] = max(bw["read"], bw2["read"]) / 1e9
    if args.isolated:
        result["isolated"] = isolated_gemms(args, result["bandwidth_read_GBps"] * 1e9)
    result["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    args.output.mkdir(parents=True, exist_ok=True)
    atomic_write(args.output / f"{args.name}.json", json.dumps(result, indent=2) + "\n")
    if args.step:
        text = markdown(result)
        atomic_write(args.output / f"{args.name}.md", text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
