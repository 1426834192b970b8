"""Where a cold max-autotune compile's wall time goes, and what a change to the compile path saves.

    .venv/bin/python benchmarks/max_autotune_compile.py --models gpt_neox,real:3 [--strategy S]
                     [--repeats 2] [--variants before,after] [--name max_autotune_compile]

Each run is a fresh process with its own empty TorchInductor cache directory: it builds the model
(an architecture name of ``superkernel.tools.models.archs``, a zoo name such as ``llama-tiny``, or
``real:N``: the Qwen2-0.5B-shaped f32 model of ``real_width.py`` with N layers; one thread, as ``optimize``
runs tiny models and ``real_width.py --threads 1`` the real one), applies the strategy's scopes (default:
``all_layers`` for tiny models, as ``optimize --strategy auto`` compiles them; ``decoder_layer`` at real
width, as ``real_width.py``), compiles the
decode step with superkernel max-autotune and runs its first step (trace + compile + one step: what a
plan's cold compile costs). Inside, spans around the compile path's parts are timed on the wall clock
(per thread) and the CPU time of g++ children is counted per build:

* ``g++ autotune``: a C++ GEMM template module built only so Inductor can time it;
* ``g++ module``: a compiled partition's final module (plain or frozen);
* ``autotune timing``: Inductor timing the choices of one GEMM (builds inside it excluded);
* ``plain vs frozen timing``: :func:`superkernel.runtime.inductor.cpu_freezing.time_variants`;
* ``freezing passes``, ``lowering`` (GraphLowering.run), ``codegen`` (the rest of Inductor's
  compile of a partition, builds excluded), and ``other`` (Dynamo, AOTAutograd, our passes, the step).

``--variants``: ``before`` runs with ``SUPERKERNEL_COMPILE_PATH=before`` (the GEMM template modules built as
Inductor builds them, index expressions parsed on every render, each partition's module built with Inductor's
own precompiled wrapper header alone: the compile path before :mod:`superkernel.runtime.inductor.autotune_builds`,
``frozen_code.parsed_index_expressions_reused`` and :mod:`superkernel.runtime.inductor.wrapper_pch`), ``after``
with the default; the variants of one repeat run one after the other (A/B, B/A on the next repeat). Each run's autotune picks (per GEMM:
the fastest choice's name) are recorded so the variants can be compared. Writes
``benchmarks/results/<name>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SRC = HERE.parent / "src"
#: ``--variants``: the environment of each (``before``: the compile path without this branch's speedups)
VARIANTS = {"before": {"SUPERKERNEL_COMPILE_PATH": "before"}, "after": {"SUPERKERNEL_COMPILE_PATH": "after"}}


# ----------------------------------------------------------------------------------------------- child


class Spans:
    """Wall-clock spans per thread, nested; CPU seconds of g++ children per build."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.events: list[dict[str, Any]] = []
        self.local = threading.local()
        self.lock = threading.Lock()
        self.picks: list[dict[str, Any]] = []

    def wrap(self, owner: Any, attr: str, kind: str, static: bool = False, classmethod_: bool = False) -> None:
        original = getattr(owner, attr)
        func = original.__func__ if classmethod_ else original
        spans = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack = getattr(spans.local, "stack", None)
            if stack is None:
                stack = spans.local.stack = []
            event = {"kind": kind, "thread": threading.current_thread().name, "start": time.perf_counter() - spans.t0,
                     "depth": len(stack), "parent": stack[-1]["kind"] if stack else None, "children_s": 0.0}
            if kind == "g++":
                event["kind"] = "g++ autotune" if any(e["kind"] == "autotune build" for e in stack) else "g++ module"
                event["source"] = str(getattr(args[0], "_sources_args", "") or "")[-80:]
                child_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            stack.append(event)
            try:
                return func(*args, **kwargs)
            finally:
                stack.pop()
                event["end"] = time.perf_counter() - spans.t0
                if kind == "g++":
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    event["child_cpu_s"] = (after.ru_utime - child_before.ru_utime) + (after.ru_stime - child_before.ru_stime)
                if stack:
                    stack[-1]["children_s"] += event["end"] - event["start"]
                with spans.lock:
                    spans.events.append(event)

        if classmethod_:
            setattr(owner, attr, classmethod(wrapper))
        elif static:
            setattr(owner, attr, staticmethod(wrapper))
        else:
            setattr(owner, attr, wrapper)

    def install(self) -> None:
        import torch._inductor.codecache as codecache
        import torch._inductor.cpp_builder as cpp_builder
        import torch._inductor.fx_passes.freezing_patterns as freezing_patterns
        import torch._inductor.graph as graph
        import torch._inductor.compile_fx as compile_fx
        import torch._inductor.select_algorithm as select_algorithm
        from torch._inductor.autotune_process import CppBenchmarkRequest

        import superkernel.runtime.inductor.compile as sk_inductor
        import superkernel.runtime.inductor.cpu_freezing as sk_inductor_cpu

        self.wrap(cpp_builder.CppBuilder, "build", "g++")
        self.wrap(CppBenchmarkRequest, "precompile", "autotune build")
        self.wrap(CppBenchmarkRequest, "make_run_fn", "autotune build")
        self._wrap_timing(select_algorithm.AlgorithmSelectorCache)
        self.wrap(freezing_patterns, "freezing_passes", "freezing passes")
        self.wrap(graph.GraphLowering, "run", "lowering")
        self.wrap(compile_fx, "compile_fx_inner", "inductor compile")
        self.wrap(sk_inductor, "compile_partition", "partition compile")
        self.wrap(sk_inductor_cpu, "time_variants", "plain vs frozen timing")
        self.wrap(codecache.PyCodeCache, "load_by_key_path", "python module load", classmethod_=True)
        self.wrap(sk_inductor_cpu, "compile_frozen", "frozen compile")

    def _wrap_timing(self, cls: Any) -> None:
        """``benchmark_choices`` (one pass of timing one GEMM's choices); the picks are recorded."""
        original = cls.benchmark_choices.__func__
        spans = self

        def benchmark_choices(klass: Any, choices: Any, *args: Any, **kwargs: Any) -> Any:
            stack = getattr(spans.local, "stack", None)
            if stack is None:
                stack = spans.local.stack = []
            event = {"kind": "autotune timing", "thread": threading.current_thread().name,
                     "start": time.perf_counter() - spans.t0, "depth": len(stack),
                     "parent": stack[-1]["kind"] if stack else None, "children_s": 0.0, "choices": len(choices)}
            stack.append(event)
            try:
                result = original(klass, choices, *args, **kwargs)
            finally:
                stack.pop()
                event["end"] = time.perf_counter() - spans.t0
                if stack:
                    stack[-1]["children_s"] += event["end"] - event["start"]
                with spans.lock:
                    spans.events.append(event)
            return result

        cls.benchmark_choices = classmethod(benchmark_choices)
        # the pick of each GEMM: the autotune's final ``timings`` (after our interleaved passes), via its log hook
        original_log = cls.log_results

        def log_results(*args: Any, **kwargs: Any) -> Any:
            name = kwargs.get("name", args[0] if args else "?")
            timings = kwargs.get("timings", args[2] if len(args) > 2 else {})
            try:
                ranked = sorted(timings.items(), key=lambda kv: kv[1])
                spans.picks.append({"op": str(name), "pick": ranked[0][0].name if ranked else None,
                                    "choices": [[c.name, t] for c, t in ranked]})
            except Exception:  # noqa: BLE001 - a record only
                pass
            return original_log(*args, **kwargs)

        cls.log_results = staticmethod(log_results)

    def summary(self, total_s: float) -> dict[str, Any]:
        main = [e for e in self.events if e["thread"] == "MainThread"]
        self_s: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for e in main:
            self_s[e["kind"]] += e["end"] - e["start"] - e["children_s"]
            counts[e["kind"]] += 1
        top = sum(e["end"] - e["start"] for e in main if e["depth"] == 0)
        self_s["other (Dynamo, AOT, passes, step)"] = total_s - top
        builds = [e for e in self.events if e["kind"].startswith("g++")]
        background = [e for e in self.events if e["thread"] != "MainThread"]
        by_thread: dict[str, float] = defaultdict(float)
        for e in background:
            if e["depth"] == 0:
                by_thread[e["thread"]] += e["end"] - e["start"]
        return {
            "main_thread_self_s": dict(sorted(self_s.items(), key=lambda kv: -kv[1])),
            "main_thread_counts": dict(counts),
            "builds": {kind: {"count": sum(1 for e in builds if e["kind"] == kind),
                              "wall_s": sum(e["end"] - e["start"] for e in builds if e["kind"] == kind),
                              "child_cpu_s": sum(e.get("child_cpu_s", 0.0) for e in builds if e["kind"] == kind),
                              "in_main_thread": sum(1 for e in builds if e["kind"] == kind and e["thread"] == "MainThread")}
                       for kind in ("g++ autotune", "g++ module")},
            "other_threads_busy_s": dict(by_thread),
        }


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def build(spec: str) -> Any:
    import torch

    if spec.startswith("real:"):
        sys.path.insert(0, str(HERE))
        from real_width import build_model

        return build_model(int(spec.split(":", 1)[1]), torch.float32, 0)
    from superkernel.tools.models import ZOO
    from superkernel.tools.models.archs import ARCHS, build as build_arch
    from superkernel.tools.models.loader import load_model

    if spec in ZOO:
        return load_model(spec).model
    if spec in ARCHS:
        return build_arch(spec)
    raise SystemExit(f"error: --models {spec!r}: give an architecture ({', '.join(ARCHS)}), a zoo name "
                     f"({', '.join(ZOO)}) or real:N")


def child(spec: str, strategy: str, out: Path, profile: Path | None) -> None:
    import copy

    import torch

    import superkernel as sk
    from superkernel.tools.advisor.strategies import plan_for
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.decode import prepare, run_decode
    from superkernel.tools.fresh_cache import CacheHolder, holder_step

    torch.set_num_threads(1)
    spans = Spans()
    spans.install()
    model = build(spec)
    session = prepare(model, prompt_len=8 if not spec.startswith("real:") else 32, steps=1, warmup=1, seed=0)
    scoped = copy.deepcopy(model)
    sk.apply_scopes(scoped, plan_for(strategy, analyze_structure(model)).scopes)
    backend = sk.get_backend(sk.CompilerConfig.from_dict({"mode": "max-autotune"}))
    step = torch.compile(holder_step(session, CacheHolder(session.cache), scoped), backend=backend, dynamic=False)
    session.restore_cache()
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    spans.t0 = wall0
    first = run_decode(session, step, label="max-autotune")
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(str(profile))
    session.restore_cache()
    expected = run_decode(session, session.step_fn(), label="eager").logits
    result = {"model": spec, "strategy": strategy, "wall_s": wall, "cpu_s": cpu,
              "first_step_compile_s": first.compile_seconds,
              "max_abs_diff_vs_eager": float((first.logits.float() - expected.float()).abs().max()),
              "counters": dict(backend.counters), "breakdown": spans.summary(wall), "picks": spans.picks,
              "events": spans.events}
    out.write_text(json.dumps(result, indent=1))


# ---------------------------------------------------------------------------------------------- parent


def run_child(spec: str, strategy: str, variant: str, profile: Path | None = None) -> dict[str, Any]:
    cache_dir = tempfile.mkdtemp(prefix="sk_mac_inductor_")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, **VARIANTS[variant],
               PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    argv = [sys.executable, __file__, "--child", spec, "--strategy", strategy, "--child-out", str(out)]
    if profile is not None:
        argv += ["--profile", str(profile)]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    process_wall = time.perf_counter() - start
    import shutil

    shutil.rmtree(cache_dir, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {spec} {variant} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    out.unlink()
    result.update({"variant": variant, "process_wall_s": process_wall, "load_1min_before": load})
    return result


def markdown(meta: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    lines = [f"# {meta['title']}", "", meta["how"], "", f"Hardware: {meta['hardware']}; torch {meta['torch']}, "
             f"transformers {meta['transformers']}, Python {meta['python']}. Load (1 min) before each run is in "
             "the table.", ""]
    lines += ["| model | variant | repeat | compile wall s | compile CPU s | g++ autotune (n / wall s / CPU s) | "
              "g++ module (n / wall s / CPU s, in main thread) | autotune timing s | plain vs frozen timing s | "
              "lowering s | max abs diff vs eager | load |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        b = r["breakdown"]
        ga, gm, own = b["builds"]["g++ autotune"], b["builds"]["g++ module"], b["main_thread_self_s"]
        lines.append(f"| {r['model']} | {r['variant']} | {r['repeat']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     f"{ga['count']} / {ga['wall_s']:.1f} / {ga['child_cpu_s']:.1f} | "
                     f"{gm['count']} / {gm['wall_s']:.1f} / {gm['child_cpu_s']:.1f}, {gm['in_main_thread']} | "
                     f"{own.get('autotune timing', 0.0):.1f} | {own.get('plain vs frozen timing', 0.0):.1f} | "
                     f"{own.get('lowering', 0.0):.1f} | {r['max_abs_diff_vs_eager']:.2e} | {r['load_1min_before']:.1f} |")
    lines += ["", "## Main thread: where the wall goes (self seconds per span kind, median over repeats)", ""]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        groups[(r["model"], r["variant"])].append(r)
    kinds = sorted({k for r in runs for k in r["breakdown"]["main_thread_self_s"]})
    lines += ["| span | " + " | ".join(f"{m} {v}" for m, v in groups) + " |", "|---" * (len(groups) + 1) + "|"]
    for kind in kinds:
        cells = [statistics.median(r["breakdown"]["main_thread_self_s"].get(kind, 0.0) for r in rs) for rs in groups.values()]
        lines.append(f"| {kind} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    lines += ["", "## Before / after (median over repeats)", "",
              "| model | variant | compile wall s | compile CPU s | wall vs before | same picks as before |",
              "|---|---|---|---|---|---|"]
    for (model, variant), rs in groups.items():
        base = groups.get((model, "before"))
        wall = statistics.median(r["wall_s"] for r in rs)
        ratio = f"{wall / statistics.median(r['wall_s'] for r in base):.2f}" if base else "-"
        same = "-"
        if base:
            ref = [p["pick"] for p in base[0]["picks"]]
            same = "yes" if all([p["pick"] for p in r["picks"]] == ref for r in rs) else "NO"
        lines.append(f"| {model} | {variant} | {wall:.1f} | {statistics.median(r['cpu_s'] for r in rs):.1f} | "
                     f"{ratio} | {same} |")
    lines += ["", *meta.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gpt_neox,real:3")
    parser.add_argument("--strategy", help="default: all_layers for tiny models, decoder_layer for real:N")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default="before,after")
    parser.add_argument("--name", default="max_autotune_compile", help="stem of the result files: a configuration's name, never a run's: its next run overwrites the file, git keeps the history")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--note", action="append", dest="notes", default=[])
    parser.add_argument("--profile", type=Path, help="(child) cProfile the first step into this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.strategy or "all_layers", args.child_out, args.profile)
        return 0
    import platform

    import torch
    import transformers

    from superkernel.util import atomic_write

    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"--variants {v!r}: allowed {', '.join(VARIANTS)}")
    runs = []
    for spec in [m for m in args.models.split(",") if m]:
        for repeat in range(args.repeats):
            order = variants if repeat % 2 == 0 else variants[::-1]
            for variant in order:
                strategy = args.strategy or ("decoder_layer" if spec.startswith("real:") else "all_layers")
                r = run_child(spec, strategy, variant)
                r["repeat"] = repeat + 1
                runs.append(r)
                print(f"{spec} {variant} #{repeat + 1}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU "
                      f"(load {r['load_1min_before']:.1f})", flush=True)
    meta = {"title": "Cold max-autotune compile: where the wall goes",
            "how": (f"Strategy {args.strategy or 'all_layers (tiny models) / decoder_layer (real width)'}, superkernel max-autotune (defaults: freezing auto, GEMM templates, "
                    "weights-from-memory timing), one thread, each run a fresh process with an empty Inductor cache; "
                    "compile = the first decode step (trace + compile + one step). CPU = user + sys of the process "
                    "and its g++ children. Variants of one repeat run back to back, in alternating order."),
            "hardware": f"{platform.machine()}, {os.cpu_count()} logical cores ({platform.processor() or 'cpu'})",
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "notes": args.notes}
    args.output.mkdir(parents=True, exist_ok=True)
    slim = [{k: v for k, v in r.items() if k != "events"} for r in runs]
    atomic_write(args.output / f"{args.name}.json", json.dumps({"meta": meta, "runs": slim}, indent=1) + "\n")
    atomic_write(args.output / f"{args.name}.md", markdown(meta, runs))
    print(f"wrote {args.output / args.name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
