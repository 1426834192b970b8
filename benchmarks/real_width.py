"""Real-width decode: a Qwen2-0.5B-shaped model in float32 and bfloat16, on 1 and all threads.

    .venv/bin/python benchmarks/real_width.py [--dtypes float32,bfloat16] [--threads 1,all]
                                              [--steps 16] [--warmup 3] [--rounds 3] [--layers 24]

The model is ``Qwen2ForCausalLM`` with Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads /
2 KV heads, intermediate 4864, vocabulary 151936, tied embeddings) and seeded random weights
(nothing is downloaded). Per (dtype, threads): eager, ``torch.compile`` (default Inductor) and
superkernel ``reduce-overhead`` and ``max-autotune`` with one scope per decoder layer, each
compiled once (compile time = its first step), then timed in rotating rounds. Every round of
every peer runs on a **fresh** ``StaticCache`` prefilled with another prompt (as a user's
next ``generate()`` would) and its
logits are checked against eager on that round (``superkernel.tools.peer_check``); a wrong peer
is marked and not used as a baseline. reduce-overhead is checked bit for bit against its
exactness reference. The roofline is (bytes of weights + KV cache) / memory bandwidth measured
here with the same thread count (the fastest of three STREAM-like reads of a 512 MiB tensor:
``sum``, ``W @ x`` and ``x @ W``, measured before the configuration and after every round, the
best kept; a copy is reported beside it). Compile times are cold (a fresh
Inductor cache directory per run, unless ``--warm-cache``), wall and CPU (user + sys, g++ included).
Runs with PyTorch's ``THP_MEM_ALLOC_ENABLE=1`` (weights on transparent huge pages, every peer and the
bandwidth measurement alike; ``SUPERKERNEL_HUGEPAGES=0``: 4 KiB pages; see studies/real_width_hugepages.py).
Writes benchmarks/results/<--name>.{json,md} (default real_width: name a configuration, e.g.
real_width_f32 for ``--dtypes float32``; the next run of it overwrites the file, git keeps the history). It is slow: a max-autotune compile of 24 layers
takes minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from superkernel import hugepages

# Weights on transparent huge pages unless SUPERKERNEL_HUGEPAGES=0: set before torch's first allocation
# (benchmarks/results/real_width_hugepages.md measured what it changes).
PAGES = hugepages.enable_for_this_process()

import torch  # noqa: E402

import superkernel as sk
from superkernel.timing import rotation
from superkernel.tools.advisor.compiling import own_code
from superkernel.tools.advisor.environment import hardware as describe_hardware
from superkernel.tools.advisor.strategies import plan_for
from superkernel.tools.advisor.structure import analyze_structure
from superkernel.tools.decode import DecodeSession, prepare, run_decode, synchronize
from superkernel.tools.fresh_cache import CacheHolder, fresh_cache, holder_step
from superkernel.tools.peer_check import PeerCheck, peer_tolerance
from superkernel.util import atomic_write

RESULTS = Path(__file__).resolve().parent / "results"
QWEN2_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                 tie_word_embeddings=True, rms_norm_eps=1e-6)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_model(layers: int, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**{**QWEN2_05B, "num_hidden_layers": layers})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.to(dtype).eval().requires_grad_(False)


def save_checkpoint(directory: Path, layers: int, dtype_name: str, seed: int) -> int:
    """A local checkpoint for ``superkernel optimize --model DIR`` (written to a temporary sibling, then renamed)."""
    if directory.exists():
        print(f"error: --save-checkpoint {directory}: exists; give a new directory", file=sys.stderr)
        return 2
    if dtype_name not in DTYPES:
        print(f"error: dtype {dtype_name!r}: allowed {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    partial = directory.with_name(directory.name + ".partial")
    if partial.exists():
        print(f"error: {partial} exists (an interrupted earlier write?); remove it or give another directory",
              file=sys.stderr)
        return 2
    build_model(layers, DTYPES[dtype_name], seed).save_pretrained(partial)
    partial.rename(directory)
    print(f"wrote {directory} ({layers} layers, {dtype_name}, seed {seed})")
    return 0


def memory_bandwidth(megabytes: int = 512, repeats: int = 5) -> dict[str, float]:
    """Bytes/s of streaming reads of a large float32 tensor, best of ``repeats`` each: ``sum``, a
    matrix-vector product over it as rows (``W @ x``) and as columns (``x @ W``), and a copy (read +
    write). ``read`` is the fastest read: the bound a decode step's weight reads are held to (a
    ``sum`` alone reads slower here than MKL's GEMV does: measured 15 vs 21 GB/s on one core)."""
    n = megabytes * 2**20 // 4
    src, dst = torch.rand(n), torch.empty(n)
    rows = src.view(-1, 4096)
    vec_in, vec_out = torch.rand(4096), torch.rand(rows.shape[0])
    kernels = {"sum": lambda: src.sum(), "W @ x": lambda: torch.mv(rows, vec_in),
               "x @ W": lambda: torch.mv(rows.t(), vec_out), "copy": lambda: dst.copy_(src)}
    best = dict.fromkeys(kernels, float("inf"))
    with torch.no_grad():
        for _ in range(repeats):
            for name, kernel in kernels.items():
                start = time.perf_counter()
                kernel()
                best[name] = min(best[name], time.perf_counter() - start)
    reads = {name: n * 4 / t for name, t in best.items() if name != "copy"}
    return {"read": max(reads.values()), "copy": 2 * n * 4 / best["copy"],
            "reads": reads}


def best_bandwidth(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per kernel, the faster of two bandwidth measurements (one per round, so a busy moment of a
    shared machine does not set the roofline)."""
    reads = {k: max(a["reads"].get(k, 0.0), v) for k, v in b["reads"].items()}
    return {"read": max(reads.values()), "copy": max(a["copy"], b["copy"]), "reads": reads}


def bytes_per_step(model: torch.nn.Module, session: DecodeSession) -> int:
    """Weights (tied ones once) + the whole KV cache: what one decode step reads at most."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = sum(t.numel() * t.element_size() for layer in session.cache.layers
             for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor))
    return weights + kv


class Peer:
    def __init__(self, label: str, compile_fn: Callable[[Callable], Callable], model: torch.nn.Module,
                 mode: str | None = None) -> None:
        self.label, self.compile_fn, self.model, self.mode = label, compile_fn, model, mode
        self.holder: CacheHolder | None = None
        self.step: Callable | None = None
        self.compile_s: float | None = None
        self.compile_cpu_s: float | None = None
        self.counters: dict[str, int] = {}
        self.medians: list[float] = []
        self.p90s: list[float] = []
        self.first_logits: torch.Tensor | None = None
        self.check: PeerCheck | None = None
        self.error: str | None = None
        self.bit_exact: bool | None = None
        self.recompiles_timed = 0


def cpu_seconds() -> float:
    """user + sys CPU time of this process and its finished children (g++ runs included)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


#: ``--modes`` values: a superkernel mode, max-autotune without freezing (weights stay inputs, so
#: identical layers share one compiled kernel and the compile grows with distinct partitions only), or
#: max-autotune with ``inductor.bf16_gemv`` off (Inductor's bf16 micro-kernel as shipped, for A/B runs).
MODES = {"reduce-overhead": {"mode": "reduce-overhead"}, "max-autotune": {"mode": "max-autotune"},
         "max-autotune-unfrozen": {"mode": "max-autotune", "inductor": {"freezing": False}},
         "max-autotune-bf16-gemv-off": {"mode": "max-autotune", "inductor": {"bf16_gemv": False}}}


def _superkernel(mode: str, run_eagerly: bool = False) -> Callable[[Callable], Callable]:
    def make(fn: Callable) -> Callable:
        cfg = sk.CompilerConfig.from_dict({**MODES[mode], "debug": {"run_eagerly": run_eagerly}})
        backend = sk.get_backend(cfg)
        compiled = torch.compile(fn, backend=backend, dynamic=False)
        compiled.superkernel_counters = backend.counters  # type: ignore[attr-defined]
        return compiled
    return make


def run_config(dtype_name: str, threads: int, args: argparse.Namespace, bandwidth: dict[str, float]) -> dict[str, Any]:
    dtype = DTYPES[dtype_name]
    torch.set_num_threads(threads)
    torch._dynamo.reset()
    start = time.perf_counter()
    model = build_model(args.layers, dtype, args.seed)
    print(f"[{dtype_name}, {threads} thread(s)] built model in {time.perf_counter() - start:.1f} s", flush=True)
    session = prepare(model, prompt_len=args.prompt_len, steps=args.steps, warmup=args.warmup, seed=args.seed)
    scopes = plan_for(args.strategy, analyze_structure(model)).scopes
    scoped = copy.deepcopy(model)   # scopes wrap module forwards, which Dynamo guards on: own copy
    sk.apply_scopes(scoped, scopes)
    peers = [Peer("eager", lambda fn: fn, model),
             Peer("torch.compile", lambda fn: torch.compile(fn, dynamic=False), model)]
    peers += [Peer(f"superkernel {args.strategy} {m}", _superkernel(m), scoped, m) for m in args.modes]
    reference = Peer("reference", _superkernel("reduce-overhead", run_eagerly=True), scoped)
    tolerance = peer_tolerance(dtype)

    def run(peer: Peer, cache: Any) -> Any:
        peer.holder.cache = cache
        return run_decode(session, peer.step, label=peer.label)

    for peer in [*peers, reference]:
        peer.holder = CacheHolder(session.cache)
        base = holder_step(session, peer.holder, peer.model)
        base = own_code(base, f"{len(peer.label)}_{id(peer)}")  # every peer's graph stays live
        try:
            peer.step = peer.compile_fn(base)
            session.restore_cache()
            cpu_before = cpu_seconds()
            first = run(peer, session.cache)
            cpu_first = cpu_seconds() - cpu_before
        except Exception as exc:  # noqa: BLE001 - reported in the table
            peer.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            print(f"  {peer.label}: failed: {peer.error}", flush=True)
            continue
        peer.compile_s = first.compile_seconds if peer.label != "eager" else 0.0
        # CPU time of the whole first run less the CPU time of its timed steps (about their wall time)
        steps_s = sum(first.step_seconds[1:])
        peer.compile_cpu_s = max(0.0, cpu_first - steps_s) if peer.label != "eager" else 0.0
        peer.counters = dict(getattr(peer.step, "superkernel_counters", {}))
        peer.first_logits = first.logits
        print(f"  compiled {peer.label:<40} first step {first.compile_seconds:7.1f} s wall, "
              f"{peer.compile_cpu_s:7.1f} s CPU (load {os.getloadavg()[0]:.1f})", flush=True)
    eager = peers[0]
    for peer in peers:
        if peer.mode == "reduce-overhead" and peer.first_logits is not None and reference.first_logits is not None:
            peer.bit_exact = bool(torch.equal(peer.first_logits, reference.first_logits))
    live = [p for p in peers if p.step is not None]
    for p in live:
        p.check = PeerCheck(tolerance)
    for r in range(args.rounds):
        order = [live[i] for i in rotation(len(live), r)]
        logits = {}
        for peer in order:
            out = run(peer, fresh_cache(session, model, seed=1000 + r))   # a new cache, another prompt
            peer.medians.append(out.median_ms)
            peer.p90s.append(out.p90_ms)
            peer.recompiles_timed += out.dynamo.recompiles_timed
            logits[peer.label] = out.logits
        for peer in live:
            peer.check.check(logits[peer.label], logits["eager"])
        print(f"  round {r + 1}/{args.rounds}: " + "  ".join(f"{p.label.replace('superkernel ', 'sk ')} "
                                                            f"{p.medians[-1]:.1f}" for p in live), flush=True)
        bandwidth = best_bandwidth(bandwidth, memory_bandwidth())  # the load changes: the best seen is the bound
    total_bytes = bytes_per_step(model, session)
    roofline_ms = total_bytes / bandwidth["read"] * 1e3
    good = {p.label: p for p in live if not p.check.wrong}

    def ratio(peer: Peer, base: str) -> float | None:
        other = good.get(base)
        if other is None or peer.check.wrong:
            return None
        return statistics.median(a / b for a, b in zip(peer.medians, other.medians))

    rows = []
    for peer in peers:
        row: dict[str, Any] = {"peer": peer.label}
        if peer.step is None:
            row["error"] = peer.error
            rows.append(row)
            continue
        median = statistics.median(peer.medians)
        row.update({"median_ms": median, "p90_ms": statistics.median(peer.p90s), "compile_s": peer.compile_s,
                    "time_vs_eager": ratio(peer, "eager"), "time_vs_torch_compile": ratio(peer, "torch.compile"),
                    "compile_cpu_s": peer.compile_cpu_s,
                    "x_roofline": median / roofline_ms, "correct_every_round": not peer.check.wrong,
                    "check": peer.check.to_dict(), "check_summary": peer.check.summary(),
                    "recompiles_timed": peer.recompiles_timed})
        if peer.bit_exact is not None:
            row["bit_exact_vs_reference"] = peer.bit_exact
        if peer.counters:
            row["superkernel_counters"] = peer.counters
        rows.append(row)
    pages = hugepages.memory()   # every peer's weights and packed constants are alive here
    regions = hugepages.large_regions(64)
    del scoped, model, session
    return {"memory_kb": pages, "large_regions_kb": regions, "dtype": dtype_name, "threads": threads, "bytes_per_step": total_bytes, "roofline_ms": roofline_ms,
            "load_at_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "bandwidth_read_GBps": bandwidth["read"] / 1e9, "bandwidth_copy_GBps": bandwidth["copy"] / 1e9,
            "bandwidth_reads_GBps": {k: v / 1e9 for k, v in bandwidth.get("reads", {}).items()},
            "rows": rows}


def _pages_line(memory: dict[str, int] | None, regions: list[dict[str, int]] | None = None) -> str:
    if not memory:
        return "Huge pages: not reported by this kernel."
    share = memory["anon_huge_kb"] / memory["anon_kb"] if memory["anon_kb"] else 0.0
    small = [r["rss_kb"] / 1024 for r in regions or () if r["anon_huge_kb"] < r["rss_kb"] // 2]
    return (f"Anonymous memory with every peer alive: {memory['anon_kb'] / 1024:.0f} MB, "
            f"{memory['anon_huge_kb'] / 1024:.0f} MB of it on transparent huge pages ({share:.0%}); "
            f"anonymous regions of 64 MB or more: {len(regions or ())}, of which on 4 KiB pages (MB): "
            + (", ".join(f"{x:.0f}" for x in sorted(small, reverse=True)) or "none") + ".")


def _markdown(result: dict[str, Any]) -> str:
    lines = [f"# Real-width decode: Qwen2-0.5B-shaped ({result['layers']} layers, random weights) on {result['hardware']}",
             "", f"torch {result['torch']}; batch 1, prompt {result['prompt_len']}, {result['steps']} timed steps after "
             f"{result['warmup']} warm-up, {result['rounds']} rotating rounds, each on a fresh StaticCache whose logits "
             "are checked against eager's on that round. Times: median over rounds of each run's median step. "
             "\"x roofline\" = median / ((weights + KV cache bytes) / measured read bandwidth): 1.00 is the memory "
             "bound. Ratios are medians of per-round ratios; a peer wrong on any round has none (never a baseline).",
             f"Pages: {result.get('pages', {})}. Load when it started: {result['load']}. Inductor caches: {result.get('inductor_cache', 'user default')}. "
             "Compile time = the first step (trace + compile + one step); CPU = user + sys of the process and its "
             "g++ children over that step.", ""]
    for config in result["configs"]:
        lines += [f"## {config['dtype']}, {config['threads']} thread(s)", "",
                  f"{config['bytes_per_step'] / 1e9:.2f} GB per step; read bandwidth {config['bandwidth_read_GBps']:.1f} "
                  f"GB/s (best of " + ", ".join(f"{k} {v:.1f}" for k, v in config.get("bandwidth_reads_GBps", {}).items())
                  + f"), copy {config['bandwidth_copy_GBps']:.1f} GB/s; roofline {config['roofline_ms']:.1f} ms. "
                  f"Load at the end of this configuration: {config.get('load_at_end', '?')}. "
                  + _pages_line(config.get("memory_kb"), config.get("large_regions_kb")), "",
                  "| peer | median ms | p90 ms | vs eager | vs torch.compile | x roofline | compile s (wall) | "
                  "compile s (CPU) | correct every round | bit-exact vs reference | recompiles (timed) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in config["rows"]:
            if "error" in r:
                lines.append(f"| {r['peer']} | failed: {r['error']} |" + " |" * 9)
                continue
            fmt = lambda v: f"{v:.2f}x" if v is not None else "-"  # noqa: E731
            exact = {True: "yes", False: "NO"}.get(r.get("bit_exact_vs_reference"), "-")
            lines.append(f"| {r['peer']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | {fmt(r['time_vs_eager'])} | "
                         f"{fmt(r['time_vs_torch_compile'])} | {r['x_roofline']:.2f} | {r['compile_s']:.1f} | "
                         f"{r.get('compile_cpu_s') or 0.0:.1f} | "
                         f"{r['check_summary']} | {exact} | {r['recompiles_timed']} |")
        lines.append("")
        for r in config["rows"]:
            c = r.get("superkernel_counters")
            if c and "partitions_compiled" in c:
                lines.append(f"- {r['peer']}: {c.get('partitions_compiled', 0)} partitions, "
                             f"{c.get('partitions_inductor_compiles', 0)} plain Inductor compiles "
                             f"({c.get('partitions_reused', 0)} reused), {c.get('partitions_frozen', 0)} frozen, "
                             f"{c.get('partitions_choice_reused', 0)} took an identical partition's plain/frozen choice, "
                             f"{c.get('partitions_frozen_code_shared', 0)} frozen shared an identical layer's C++ build")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", default="1,all", help="comma-separated thread counts; 'all' = os.cpu_count()")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", default="decoder_layer")
    parser.add_argument("--modes", default="reduce-overhead,max-autotune")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--name", default="real_width",
                        help="stem of the result files: a configuration's name, never a run's: its next run overwrites the file, git keeps the history (e.g. real_width_f32)")
    parser.add_argument("--warm-cache", action="store_true",
                        help="use the user's Inductor cache dir (default: a fresh one, so compile times are cold)")
    parser.add_argument("--save-checkpoint", type=Path, metavar="DIR",
                        help="only write the seeded model (--layers, first of --dtypes) as a Hugging Face checkpoint "
                             "(config.json + model.safetensors) into DIR, which must not exist, and exit")
    args = parser.parse_args(argv)
    if args.save_checkpoint is not None:
        return save_checkpoint(args.save_checkpoint, args.layers, args.dtypes.split(",")[0], args.seed)
    cold_dir = None
    if not args.warm_cache:
        cold_dir = tempfile.TemporaryDirectory(prefix="real_width_inductor_")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold_dir.name
    args.modes = [m for m in args.modes.split(",") if m]
    dtypes = [d for d in args.dtypes.split(",") if d]
    threads = [os.cpu_count() or 1 if t == "all" else int(t) for t in args.threads.split(",") if t]
    if set(dtypes) - set(DTYPES) or set(args.modes) - set(MODES):
        parser.error(f"dtypes: {', '.join(DTYPES)}; modes: {', '.join(MODES)}")
    threads = list(dict.fromkeys(threads))
    import transformers

    result: dict[str, Any] = {"hardware": describe_hardware(torch.device("cpu")), "torch": torch.__version__,
                              "transformers": transformers.__version__, "superkernel_source": str(Path(sk.__file__).parent),
                              "python": sys.version.split()[0], "layers": args.layers, "steps": args.steps,
                              "warmup": args.warmup, "rounds": args.rounds, "prompt_len": args.prompt_len,
                              "strategy": args.strategy, "pages": {**hugepages.settings(), "switch": PAGES}, "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
                              "inductor_cache": "user default (warm)" if args.warm_cache else "fresh dir (cold)",
                              "configs": []}
    args.output.mkdir(parents=True, exist_ok=True)
    wrong = []
    for n in threads:
        torch.set_num_threads(n)
        bandwidth = memory_bandwidth()
        for dtype in dtypes:
            config = run_config(dtype, n, args, bandwidth)
            result["configs"].append(config)
            wrong += [f"{r['peer']} ({dtype}, {n} threads)" for r in config["rows"]
                      if r.get("bit_exact_vs_reference") is False]
            atomic_write(args.output / f"{args.name}.json", json.dumps(result, indent=2) + "\n")
            atomic_write(args.output / f"{args.name}.md", _markdown(result) + "\n")
    print(_markdown(result))
    if wrong:
        print(f"reduce-overhead not bit-exact: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
