"""The GPU instrument: decode-step latency of every CUDA plan against its peers, on one card, in one process.

    PYTHONPATH=src python3 benchmarks/gpu_decode.py --model llama-tiny --out DIR
    PYTHONPATH=src python3 benchmarks/gpu_decode.py --model llama-1b --dtype bfloat16 --out DIR

What a GPU decode step costs, measured the way DESIGN.md §7 asks on a GPU:

* one cache object for every plan (a ``transformers`` StaticCache, restored in place between rounds:
  its addresses never change, so no plan copies K/V in or out);
* every step's inputs are tensors of their own (a new token id and position per step, as
  ``generate()`` makes them), prepared before the clock starts;
* a round is ``--steps`` back-to-back steps with no host synchronization between them, timed by CUDA
  events (GPU ms per step) and by the host clock around the enqueueing (host ms per step: Dynamo's
  guards, Python glue, launches);
* every plan's logits are checked against eager's on every round: bit-identical or not, top-1
  agreement, max difference (teacher-forced: every plan sees the same inputs, so logits compare
  step by step);
* compile time (first call, with its capture) and peak memory beside each latency; launches, graph
  replays and copies per step from the profiler; the roofline from the bytes a step must read
  (weights and KV cache) over a device copy's measured bandwidth.

Plans are compiled cheapest first and skipped, named as such, once ``--budget`` seconds are spent, so a
short GPU lease still returns every figure it could measure. Writes ``gpu_decode_<model>_<card>.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent

#: Llama-3.2-1B's shape (random weights): 16 layers, hidden 2048, GQA 32/8 heads of 64, SwiGLU 8192,
#: vocabulary 128256 with tied embeddings (2.47 GB of bf16 weights).
LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                rms_norm_eps=1e-5, tie_word_embeddings=True)

ALL_PLANS = ("eager", "cudagraphs", "cudagraphs-static-params", "sk-ro-decoder_layer", "sk-ro-all_layers",
             "sk-ro-all_layers-precompiled", "inductor", "inductor-reduce-overhead", "sk-ma-decoder_layer",
             "sk-ma-all_layers", "sk-ma-all_layers-pdl", "sk-ma-all_layers-autotune", "sk-ma-all_layers-autotune-pdl",
             "inductor-max-autotune")

#: vendor memory bandwidth (bytes/s) by card name, for the roofline the issue's targets use
SPEC_BANDWIDTH = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 SXM": 3.35e12, "H100 PCIe": 2.0e12,
                  "H100 NVL": 3.9e12}


def environment() -> dict[str, Any]:
    """The card, driver, clocks and software this run measured."""
    env: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                           "cuda": torch.version.cuda, "platform": platform.platform()}
    for name in ("triton", "transformers"):
        try:
            env[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            env[name] = f"unavailable: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(card=props.name, sms=props.multi_processor_count, memory_GiB=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}", l2_MB=getattr(props, "L2_cache_size", 0) / 1e6)
        query = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu"
        try:
            env["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"],
                                               capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as exc:  # noqa: BLE001
            env["nvidia_smi"] = f"unavailable: {exc}"
    return env


def build_model(name: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    import transformers

    if name == "llama-1b":
        config = transformers.LlamaConfig(**LLAMA_1B)
        torch.manual_seed(0)
        with torch.device(device):
            model = transformers.LlamaForCausalLM._from_config(config, dtype=dtype)
        return model.eval().requires_grad_(False)
    from superkernel.tools.models import load_model

    return load_model(name, device=device, dtype=dtype).model


def inductor_patch(text: str) -> dict[str, Any]:
    """``--inductor-patch`` as Inductor config values (``true``/``false``, integers, else strings)."""
    values: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, raw = item.partition("=")
        low = raw.strip().lower()
        values[key.strip()] = (low == "true") if low in ("true", "false") else int(low) if low.isdigit() else raw
    return values


def make_step(model: torch.nn.Module, session: Any) -> Callable[..., torch.Tensor]:
    """The session's decode step on ``model`` (a scoped copy, or the model itself)."""
    cache, keyword, extra = session.cache, session.cache_kwarg, session.step_kwargs

    def decode_step(input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=input_ids, cache_position=cache_position, use_cache=True, **{keyword: cache},
                    **extra(input_ids, cache_position))
        return out.logits[:, -1, :]

    return decode_step


class Plan:
    def __init__(self, name: str) -> None:
        self.name = name
        self.step: Callable[..., Any] | None = None
        self.backend: Any = None
        self.error: str | None = None
        self.compile_s: float | None = None
        self.peak_GiB: float | None = None
        self.gpu_ms: list[float] = []
        self.host_ms: list[float] = []
        self.exact_rounds: list[bool] = []
        self.top1: list[float] = []
        self.max_diff: list[float] = []
        self.profile: dict[str, float] = {}
        self.dynamo: dict[str, int] = {}
        self.realizations: list[str] = []
        self.counters: dict[str, int] = {}
        self.warm: dict[str, Any] = {}          # after the warm-up round: captures, guard failures
        self.after: dict[str, Any] = {}         # after the timed rounds
        self.explain: str = ""


def compile_plan(plan: Plan, model: torch.nn.Module, session: Any, scoped: dict[str, torch.nn.Module],
                 inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    import superkernel as sk
    from superkernel.tools.advisor.compiling import own_code

    name = plan.name
    if name.startswith("sk-"):
        strategy = name.split("-")[2]
        mode = {"ro": "reduce-overhead", "ma": "max-autotune"}[name.split("-")[1]]
        fn = own_code(make_step(scoped[strategy], session), name.replace("-", "_"))
        flags = set(name.split("-")[3:])  # precompiled, pdl, autotune
        cfg = sk.CompilerConfig.from_dict({"mode": mode, "cuda": {"pdl": "pdl" in flags},
                                           "inductor": {"autotune": "autotune" in flags}})
        if "precompiled" in flags:
            plan.step = sk.precompile_step(fn, inputs[0], cfg)
            from superkernel.pipeline.backend import find_backend

            plan.backend = find_backend(plan.step)
        else:
            plan.backend = sk.get_backend(cfg)
            plan.step = torch.compile(fn, backend=plan.backend, dynamic=False)
        return
    fn = own_code(make_step(model, session), name.replace("-", "_"))
    if name == "eager":
        plan.step = make_step(model, session)
    elif name == "cudagraphs":
        plan.step = torch.compile(fn, backend="cudagraphs", dynamic=False)
    elif name == "cudagraphs-static-params":
        # torch's cudagraphs backend keeps only AOT-lifted parameters in place; with nn modules inlined (the
        # default) the weights are graph inputs and are copied in on every replay. Not inlined, they are lifted.
        with torch._dynamo.config.patch(inline_inbuilt_nn_modules=False):
            compiled = torch.compile(fn, backend="cudagraphs", dynamic=False)

            def step(*args: Any, _compiled: Any = compiled) -> Any:
                with torch._dynamo.config.patch(inline_inbuilt_nn_modules=False):
                    return _compiled(*args)
        plan.step = step
    elif name == "inductor":
        plan.step = torch.compile(fn, dynamic=False)
    elif name == "inductor-reduce-overhead":
        plan.step = torch.compile(fn, mode="reduce-overhead", dynamic=False)
    elif name == "inductor-max-autotune":
        plan.step = torch.compile(fn, mode="max-autotune", dynamic=False)
    else:
        raise ValueError(f"unknown plan {name!r}; known: {', '.join(ALL_PLANS)}")


def run_round(step: Callable[..., Any], session: Any, inputs: list[tuple[torch.Tensor, torch.Tensor]],
              out: torch.Tensor) -> tuple[float, float]:
    """All steps back to back from the post-prefill cache; (GPU ms per step, host ms per step)."""
    session.restore_cache()
    n = len(inputs)
    if out.device.type != "cuda":  # a CPU dry run of the instrument itself: host clock only
        host = time.perf_counter()
        for i, (ids, pos) in enumerate(inputs):
            out[i].copy_(step(ids, pos)[0])
        host = (time.perf_counter() - host) * 1e3 / n
        return host, host
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    host = time.perf_counter()
    for i, (ids, pos) in enumerate(inputs):
        out[i].copy_(step(ids, pos)[0])
    host = time.perf_counter() - host
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n, host * 1e3 / n


def profile_counts(step: Callable[..., Any], session: Any, inputs: list[tuple[torch.Tensor, torch.Tensor]],
                   steps: int = 4) -> dict[str, float]:
    """Per step, from the profiler: graph launches, kernel launches, memcpy calls, ATen copies and clones."""
    from torch.profiler import ProfilerActivity, profile

    session.restore_cache()
    cuda = inputs[0][0].device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for ids, pos in inputs[:steps]:
            step(ids, pos)
        sync()
    counts: dict[str, float] = {}
    for event in prof.events():
        name = event.name
        key = None
        if name in ("cudaGraphLaunch", "cuGraphLaunch"):
            key = "graph_launches"
        elif name in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"):
            key = "kernel_launches"
        elif name.startswith("cudaMemcpy") or name.startswith("cuMemcpy"):
            key = "memcpy_calls"
        elif name == "aten::copy_":
            key = "aten_copy"
        elif name == "aten::clone":
            key = "aten_clone"
        elif name.startswith("cudaStreamSynchronize") or name.startswith("cudaDeviceSynchronize"):
            key = "syncs"
        if key:
            counts[key] = counts.get(key, 0) + 1
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            counts["gpu_kernels"] = counts.get("gpu_kernels", 0) + 1
    result: dict[str, Any] = {k: v / steps for k, v in sorted(counts.items())}
    result["top_kernels_us"] = top_kernels(prof, steps) if cuda else []
    return result


def top_kernels(prof: Any, steps: int, n: int = 12) -> list[tuple[str, float, float]]:
    """The device kernels that took the most GPU time: (name, µs per step, calls per step), largest first.
    Where two plans differ in GPU time, this says which kernels the difference is in."""
    rows = [(e.key[:120], e.self_device_time_total / steps, e.count / steps) for e in prof.key_averages()
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])[:n]


def dynamo_marks() -> tuple[int, int]:
    from torch._dynamo.utils import counters, guard_failures

    return (sum(len(r) for r in guard_failures.values()), int(counters["stats"]["unique_graphs"]))


def plan_guard_failures(plan_name: str) -> int:
    """Dynamo guard failures (recompiles) of this plan's own code object (each plan compiles its own copy)."""
    from torch._dynamo.utils import guard_failures

    tag = plan_name.replace("-", "_")
    return sum(len(r) for code, r in guard_failures.items() if getattr(code, "co_name", "").endswith(tag))


def capture_counts(backend: Any) -> dict[str, int]:
    """Captures, recaptures, replays and uncaptured calls over the backend's CUDA graphs so far."""
    import superkernel as sk

    graphs = [g for info in sk.explain(backend).graphs for g in info.cuda_graphs]
    return {"cuda_graphs": len(graphs), "captures": sum(g.captures for g in graphs),
            "recaptures": sum(g.recaptures for g in graphs), "uncaptured_calls": sum(g.uncaptured_calls for g in graphs),
            "copies_per_replay": sum(g.copies_per_replay for g in graphs),
            "copied_bytes_per_replay": sum(g.copied_bytes_per_replay for g in graphs),
            "uncaptured": sum(1 for g in graphs if g.status.startswith("uncaptured"))}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import superkernel as sk
    from superkernel.runtime.inductor.autofusion.machine import measure_bandwidth
    from superkernel.tools.advisor.strategies import plan_for
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.decode import prepare

    t0 = time.perf_counter()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dtype = getattr(torch, args.dtype)
    model = build_model(args.model, dtype, device)
    if args.quantize:  # every plan, eager included, runs the quantized model (torchao's tensors)
        from superkernel.tools.quantize import quantize_model

        log_q = quantize_model(model, args.quantize)
        print(f"quantized {log_q.layers} linear layers {args.quantize} with {log_q.library}: "
              f"{log_q.weight_bytes_before / 1e9:.2f} -> {log_q.weight_bytes_after / 1e9:.2f} GB", flush=True)
    session = prepare(model, prompt_len=args.prompt_len, steps=args.steps - 1, warmup=1, device=device)
    inputs = [(session.tokens[i].reshape(1, 1).clone(), torch.tensor([args.prompt_len + i], device=device))
              for i in range(args.steps)]
    structure = analyze_structure(model)
    wanted = [p for p in args.plans.split(",") if p]
    unknown = [p for p in wanted if p not in ALL_PLANS]
    if unknown:
        raise SystemExit(f"unknown plans {unknown}; known: {', '.join(ALL_PLANS)}")
    strategies = sorted({p.split("-")[2] for p in wanted if p.startswith("sk-")})
    scoped = {}
    for strategy in strategies:
        scoped[strategy] = copy.deepcopy(model)
        sk.apply_scopes(scoped[strategy], plan_for(strategy, structure).scopes)
    plans = [Plan(p) for p in wanted]
    outs: dict[str, torch.Tensor] = {}
    log = lambda s: print(f"[{time.perf_counter() - t0:6.1f}s] {s}", flush=True)  # noqa: E731
    with torch.no_grad(), session.dynamo_config():
        for plan in plans:
            if time.perf_counter() - t0 > args.budget:
                plan.error = f"skipped: the run's {args.budget:.0f} s compile budget was spent"
                log(f"{plan.name}: {plan.error}")
                continue
            try:
                sync()
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
                start = time.perf_counter()
                compile_plan(plan, model, session, scoped, inputs)
                out = torch.empty(args.steps, model.config.vocab_size, device=device, dtype=dtype)
                session.restore_cache()
                with torch._inductor.config.patch(inductor_patch(args.inductor_patch)):
                    out[0].copy_(plan.step(*inputs[0])[0])  # first call: trace, compile, capture
                sync()
                plan.compile_s = time.perf_counter() - start
                run_round(plan.step, session, inputs, out)  # warm-up round
                if device.type == "cuda":
                    plan.peak_GiB = (torch.cuda.max_memory_allocated() - base) / 2**30
                outs[plan.name] = out
                plan.warm = {"guard_failures": plan_guard_failures(plan.name),
                             **(capture_counts(plan.backend) if plan.backend is not None else {})}
                if plan.backend is not None:
                    ex = sk.explain(plan.backend)
                    plan.realizations = sorted({s.realization for s in ex.segments})
                    plan.counters = dict(plan.backend.counters)
                    if ex.fallbacks:
                        plan.realizations.append(f"fallbacks: {[str(f)[:200] for f in ex.fallbacks]}")
                log(f"{plan.name}: compiled + warm in {plan.compile_s:.1f} s, peak +{plan.peak_GiB or 0:.2f} GiB "
                    f"{plan.realizations}")
            except Exception as exc:  # noqa: BLE001 - a plan that fails is reported, not fatal
                plan.error = f"{type(exc).__name__}: {str(exc).strip()[:400]}"
                plan.step = None
                log(f"{plan.name}: FAILED {plan.error}\n{traceback.format_exc()[-3000:]}")
        live = [p for p in plans if p.step is not None]
        eager = next((p for p in live if p.name == "eager"), None)
        marks = dynamo_marks()
        for r in range(args.rounds if live else 0):
            order = live[r % len(live):] + live[:r % len(live)]
            for plan in order:
                try:
                    gpu, host = run_round(plan.step, session, inputs, outs[plan.name])
                except Exception as exc:  # noqa: BLE001
                    plan.error = f"round {r}: {type(exc).__name__}: {str(exc)[:300]}"
                    log(f"{plan.name}: FAILED in round {r}: {plan.error}")
                    live.remove(plan)
                    continue
                plan.gpu_ms.append(gpu)
                plan.host_ms.append(host)
                if eager is not None and plan is not eager:
                    a, b = outs[plan.name].float(), outs[eager.name].float()
                    plan.exact_rounds.append(bool(torch.equal(outs[plan.name], outs[eager.name])))
                    plan.top1.append(float((a.argmax(-1) == b.argmax(-1)).float().mean()))
                    plan.max_diff.append(float((a - b).abs().max()))
            log(f"round {r + 1}/{args.rounds}: " + "  ".join(f"{p.name} {p.gpu_ms[-1]:.3f}" for p in live if p.gpu_ms))
        after = dynamo_marks()
        for plan in live:
            try:
                plan.profile = profile_counts(plan.step, session, inputs)
            except Exception as exc:  # noqa: BLE001
                plan.profile = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            plan.after = {"guard_failures": plan_guard_failures(plan.name),
                          **(capture_counts(plan.backend) if plan.backend is not None else {})}
            if plan.backend is not None:
                plan.counters = dict(plan.backend.counters)
                plan.explain = str(sk.explain(plan.step if plan.name.endswith("precompiled") else plan.backend))
    bandwidth = measure_bandwidth(1024, 10, device)
    from superkernel.tools.quantize import tensor_bytes

    weights = sum(tensor_bytes(p) for p in model.parameters())
    kv = sum(t.numel() * t.element_size() for layer in session.cache.layers
             for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor))
    roofline_ms = (weights + kv) / bandwidth * 1e3
    card = torch.cuda.get_device_properties(0).name if device.type == "cuda" else ""
    spec = next((v for k, v in SPEC_BANDWIDTH.items() if k in card), None)
    spec_roofline_ms = (weights + kv) / spec * 1e3 if spec else None
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    by = {p.name: p for p in plans}
    rows = []
    for plan in plans:
        row: dict[str, Any] = {"plan": plan.name}
        if plan.error and not plan.gpu_ms:
            row["error"] = plan.error
            rows.append(row)
            continue
        row.update(gpu_ms=med(plan.gpu_ms), host_ms=med(plan.host_ms), gpu_ms_rounds=plan.gpu_ms,
                   compile_s=plan.compile_s, peak_GiB=plan.peak_GiB, roofline_x=med(plan.gpu_ms) / roofline_ms,
                   bit_exact_every_round=all(plan.exact_rounds) if plan.exact_rounds else None,
                   top1_min=min(plan.top1) if plan.top1 else None,
                   max_diff=max(plan.max_diff) if plan.max_diff else None,
                   profile=plan.profile, realizations=plan.realizations, counters=plan.counters,
                   spec_roofline_x=med(plan.gpu_ms) / spec_roofline_ms if spec_roofline_ms else None,
                   after_warmup={k: plan.after.get(k, 0) - plan.warm.get(k, 0) for k in
                                 ("guard_failures", "captures", "recaptures", "uncaptured_calls")},
                   capture=plan.after, explain=plan.explain)
        for peer in ("eager", "cudagraphs", "cudagraphs-static-params", "inductor", "inductor-reduce-overhead",
                     "inductor-max-autotune", "sk-ma-all_layers"):
            other = by.get(peer)
            if other is not None and other is not plan and other.gpu_ms and len(other.gpu_ms) == len(plan.gpu_ms):
                row[f"vs_{peer}"] = statistics.median(a / b for a, b in zip(plan.gpu_ms, other.gpu_ms))
        if plan.error:
            row["error"] = plan.error
        rows.append(row)
    return {"model": args.model, "dtype": args.dtype + (f", {args.quantize}" if args.quantize else "")
            + (f", inductor {args.inductor_patch}" if args.inductor_patch else ""), "steps": args.steps, "rounds": args.rounds,
            "environment": environment(), "copy_bandwidth_GBps": bandwidth / 1e9, "weight_bytes": weights,
            "kv_bytes": kv, "roofline_ms": roofline_ms, "spec_bandwidth_GBps": spec / 1e9 if spec else None,
            "spec_roofline_ms": spec_roofline_ms, "dynamo_after_warmup": {
                "guard_failures": after[0] - marks[0], "new_graphs": after[1] - marks[1]},
            "wall_s": time.perf_counter() - t0, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    spec = (f"; at the card's spec {result['spec_bandwidth_GBps']:.0f} GB/s {result['spec_roofline_ms']:.3f} ms"
            if result.get("spec_roofline_ms") else "")
    lines = [f"# GPU decode: {result['model']} ({result['dtype']}) on {env.get('card')}", "",
             f"torch {env['torch']} (CUDA {env['cuda']}), triton {env.get('triton')}, transformers "
             f"{env.get('transformers')}, Python {env['python']}; {result['steps']} steps per round on one cache "
             f"object, {result['rounds']} interleaved rounds, CUDA events around each round (no host sync inside); "
             f"\"host ms\" is the time the host took to enqueue a step. Roofline {result['roofline_ms']:.3f} ms "
             f"({(result['weight_bytes'] + result['kv_bytes']) / 1e9:.2f} GB of weights and KV cache at a measured "
             f"copy {result['copy_bandwidth_GBps']:.0f} GB/s){spec}. Ratios are medians of per-round ratios "
             "(below 1.00 is faster). Logits of every plan are compared with eager's on every round.", "",
             f"`{env.get('nvidia_smi', '')}`", "",
             "| plan | GPU ms/step | host ms/step | vs eager | vs cudagraphs | vs cudagraphs static-params | "
             "vs inductor RO | vs inductor MA | x roofline (measured / spec) | bit-exact vs eager | top-1 min | max diff "
             "| compile s | peak GiB | graphs/kernels/memcpy/copy_/clone per step | after warm-up: recompiles/recaptures "
             "| realization |",
             "|---|" + "---|" * 16]
    f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) else "-"  # noqa: E731
    for r in result["rows"]:
        if "gpu_ms" not in r:
            lines.append(f"| {r['plan']} | {r.get('error', '')} |" + " |" * 15)
            continue
        p = r.get("profile", {})
        prof = "/".join(f(p.get(k, 0), "%.0f") for k in ("graph_launches", "kernel_launches", "memcpy_calls",
                                                          "aten_copy", "aten_clone"))
        late = r.get("after_warmup", {})
        lines.append(f"| {r['plan']} | {r['gpu_ms']:.3f} | {r['host_ms']:.3f} | {f(r.get('vs_eager'), '%.2f')} | "
                     f"{f(r.get('vs_cudagraphs'), '%.2f')} | {f(r.get('vs_cudagraphs-static-params'), '%.2f')} | "
                     f"{f(r.get('vs_inductor-reduce-overhead'), '%.2f')} | {f(r.get('vs_inductor-max-autotune'), '%.2f')}"
                     f" | {r['roofline_x']:.2f} / {f(r.get('spec_roofline_x'), '%.2f')} | {r['bit_exact_every_round']} | "
                     f"{f(r['top1_min'], '%.3f')} | {f(r['max_diff'], '%.2e')} | {f(r['compile_s'], '%.1f')} | "
                     f"{f(r['peak_GiB'], '%.2f')} | {prof} | {late.get('guard_failures', 0)}/{late.get('recaptures', 0)} | "
                     f"{', '.join(r['realizations'])[:200]} |")
    profiled = [r for r in result["rows"] if r.get("profile", {}).get("top_kernels_us")]
    if profiled:
        lines += ["", "## Where each plan's GPU time goes (profiler, per step)", ""]
        for r in profiled:
            top = r["profile"]["top_kernels_us"]
            lines += [f"### {r['plan']}", "", "| kernel | µs/step | calls/step |", "|---|---|---|"]
            lines += [f"| `{name}` | {us:.1f} | {calls:.0f} |" for name, us, calls in top]
            lines.append("")
    explained = [r for r in result["rows"] if r.get("explain")]
    if explained:
        lines += ["", "## What each superkernel plan compiled (explain)", ""]
        for r in explained:
            lines += [f"### {r['plan']}", "", "```", r["explain"][:4000], "```", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-tiny", help="llama-1b (Llama-3.2-1B-shaped) or a zoo model")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--plans", default=",".join(ALL_PLANS))
    parser.add_argument("--budget", type=float, default=240.0, help="seconds after which no further plan compiles")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    parser.add_argument("--inductor-patch", default="", metavar="KEY=VALUE,...",
                        help="torch._inductor.config values set around every plan's first call (its compile), for "
                             "studies, e.g. coordinate_descent_check_all_directions=true")
    parser.add_argument("--quantize", default=None, choices=("int8-weight", "w8a8"),
                        help="quantize the model's linear layers with torchao first (superkernel.tools.quantize)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only dry-runs the instrument itself")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_decode needs a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    result = measure(args)
    card = result["environment"].get("card", "gpu").replace("NVIDIA ", "").replace(" ", "_")
    study = "_patched" if args.inductor_patch else ""
    stem = f"gpu_decode_{args.model}{'_' + args.quantize if args.quantize else ''}{study}_{card}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    text = markdown(result)
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
