"""The rows of ``real_decode_peers.py``: runner names and types, per-row statistics, ratios, the JSON and markdown.

Run nothing from here: ``benchmarks/real_decode_peers.py`` is the command (its docstring).
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m"
SCHEMES = ("int8-weight", "w8a8", "int4-weight", "w4a8")
FLOATS = ("float32", "bfloat16")
LLAMACPP = ("Q4_1", "Q8_0", "Q4_0", "F16", "F32")
#: the peer type of each model / llama.cpp file: a row's ratio is to the fastest checked peer of its type
TYPE_OF = {"float32": "float32", "bfloat16": "bfloat16", "int8-weight": "int8", "w8a8": "int8", "int4-weight": "int4",
           "w4a8": "int4", "F32": "float32", "F16": "bfloat16", "Q8_0": "int8", "Q4_0": "int4", "Q4_1": "int4"}
#: the llama.cpp file each type is named against (issue 59: float32 vs F32, bfloat16 vs F16, int8 vs Q8_0, int4 vs Q4_0)
LLAMACPP_OF_TYPE = {"float32": "F32", "bfloat16": "F16", "int8": "Q8_0", "int4": "Q4_0"}
#: llama.cpp's least top-1 agreement with float32 eager over the decode steps. F32 / F16 hold the same weights as
#: the reference (the Q4_1 file dequantized); the quantized types show their own error, which on this model leaves
#: top-1 at 60-97 % (torchao's int4 / int8 on the same text, results/quality_smollm2-135m.md). A wrong file or
#: tensor mapping agrees on almost nothing.
LLAMACPP_MIN_TOP1 = {"F32": 0.9, "F16": 0.85, "Q8_0": 0.3, "Q4_0": 0.3, "Q4_1": 0.3}
ALL_RUNNERS = ([f"eager-{m}" for m in FLOATS + SCHEMES] + [f"compile-{m}" for m in FLOATS]
               + [f"superkernel-{m}" for m in FLOATS + SCHEMES] + [f"llamacpp-{q}" for q in LLAMACPP])
#: timed by default: not eager of the quantized models (torchao's eager int4 x int8 takes ~2 s a step on 30 layers;
#: each is still run once, untimed, as its plan's reference)
DEFAULT_RUNNERS = [r for r in ALL_RUNNERS if not any(r == f"eager-{m}" for m in SCHEMES)]


@dataclass
class Runner:
    """One row: a way to run the decode step, its check and its times."""

    name: str
    kind: str                   # eager / torch.compile / superkernel / llama.cpp
    model: str                  # a key of TYPE_OF
    step: Any = None            # torch runners: the step function
    llm: Any = None             # llama.cpp: the Llama
    peer: Any = None            # compiled torch runners: their PeerCheck over every run
    compile_s: float = 0.0      # compile (or build) + first step; llama.cpp: its constructor
    prepared_s: float = 0.0     # model load / quantization; llama.cpp: making its file
    round_ms: list[float] = field(default_factory=list)   # each timed round's median step
    steps_ms: list[float] = field(default_factory=list)   # every timed step
    check: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] | None = None                 # over the decode steps, against float32 eager
    note: str = ""

    @property
    def type(self) -> str:
        return TYPE_OF[self.model]

    @property
    def passed(self) -> bool:
        return bool(self.check.get("passed"))

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.round_ms) if self.round_ms else None


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ratio(a: Runner, b: Runner) -> float | None:
    """Median over rounds of a's round median / b's (both ran in every round, interleaved)."""
    pairs = list(zip(a.round_ms, b.round_ms))
    return statistics.median(x / y for x, y in pairs) if pairs else None


def fastest_peer(runners: list[Runner], kind: str) -> Runner | None:
    """The fastest checked runner of type ``kind`` that is not superkernel's."""
    peers = [r for r in runners if r.type == kind and r.kind != "superkernel" and r.passed and r.round_ms]
    return min(peers, key=lambda r: r.median_ms) if peers else None


def row(r: Runner, runners: list[Runner]) -> dict[str, Any]:
    med = r.median_ms
    out = {"runner": r.name, "kind": r.kind, "model": r.model, "type": r.type, "median_ms": med,
           "p90_ms": quantile(r.steps_ms, 0.9), "tokens_per_s": 1e3 / med if med else None,
           "round_ms": r.round_ms, "compile_or_load_s": r.compile_s, "prepared_s": r.prepared_s,
           "check": r.check, "quality": r.quality, "note": r.note}
    peer = fastest_peer(runners, r.type)
    if peer is not None and med is not None:
        out["fastest_peer"] = peer.name
        out["vs_fastest_peer"] = ratio(r, peer)
    named = next((x for x in runners if x.kind == "llama.cpp" and x.model == LLAMACPP_OF_TYPE[r.type]
                  and x.passed and x.round_ms), None)
    if named is not None and med is not None:
        out["vs_llamacpp"] = {"file": named.model, "ratio": ratio(r, named)}
    return out


def cpu() -> dict[str, Any]:
    """The CPU's name and the ISA flags the kernels of every peer choose by."""
    from superkernel.static_kernel.environment import cpu_capability
    from superkernel.util import cpu_name

    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        pass
    keys = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
            "amx_bf16", "amx_int8")
    return {"name": cpu_name(), "cores": os.cpu_count(), "flags": {k: k in flags for k in keys},
            "capability": cpu_capability()}


def write(result: dict[str, Any], out: Path, stem: str) -> tuple[Path, Path]:
    runners: list[Runner] = result.pop("runners")
    result["cpu"] = cpu()
    result["load_avg_end"] = os.getloadavg()
    result["rows"] = [row(r, runners) for r in runners]
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / f"{stem}.json", out / f"{stem}.md"
    js.write_text(json.dumps(result, indent=1, default=str) + "\n")
    md.write_text(markdown(result))
    print(md.read_text())
    print(f"wrote {js} and {md}")
    return js, md


def _f(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _check_cell(rw: dict[str, Any]) -> str:
    c = rw["check"]
    if not c:
        return "-"
    return ("ok" if c.get("passed") else "**FAILED**") + (f": {c['summary']}" if c.get("summary") else "")


def _quality_cell(q: dict[str, Any] | None) -> str:
    if not q:
        return "- | - | -"
    kl = "-" if q.get("kl_mean") is None else f"{q['kl_mean']:.2e}"
    top1 = "-" if q.get("top1") is None else f"{q['top1']:.0%}"
    return f"{q['perplexity']:.2f} | {kl} | {top1}"


def markdown(r: dict[str, Any]) -> str:
    c, flags = r["cpu"], r["cpu"]["flags"]
    isa = ", ".join(k for k, v in flags.items() if v) or "none of the listed"
    lc = r["llamacpp"]
    lc_text = (f"llama-cpp-python {lc.get('version')} (`{lc.get('system_info', '')}`)" if lc.get("installed")
               else f"llama.cpp: not installed ({lc.get('why', '')})")
    lines = [f"# Decode step of {r['model']} against its peers (real weights, one run)", "",
             f"`benchmarks/real_decode_peers.py`{' --smoke (structure only: no figures)' if r['smoke'] else ''}. "
             f"CPU: {c['name']}, {c['cores']} cores; ISA flags: {isa}. torch {r['torch']}; {lc_text}. "
             f"{r['threads']} thread(s), batch 1, {r['layers']} layers, prompt {r['prompt_len']} tokens, "
             f"{r['warmup']} warm-up + {r['steps']} timed steps teacher-forced on *{r['text']}*, {r['rounds']} "
             f"interleaved rounds after a compile / load round; "
             f"Inductor cache {'cold' if r['cold_inductor_cache'] else 'warm'}; "
             f"1-min load average {r['load_avg_start'][0]:.2f} at the start, {r['load_avg_end'][0]:.2f} at the end "
             f"(other processes on the cores skew every figure); {r['seconds']:.0f} s in all.", "",
             "ms/step: median over rounds of each round's median step; p90 over every timed step. Ratios: medians of "
             "per-round ratios, to the fastest checked peer of the same type (not superkernel's) and to the named "
             "llama.cpp file. Check: torch runners against eager of the same model, every round (max-autotune's "
             "gate; eager against its own first run); llama.cpp's picks against float32 eager's and its own first "
             "round. Quality over the decode steps against float32 eager.", "",
             "| runner | type | ms/step | p90 | tokens/s | compile / load s | prepare s | vs fastest peer | "
             "vs llama.cpp | check | perplexity | KL vs f32 | top-1 vs f32 |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|"]
    for rw in r["rows"]:
        vs_peer = (f"{rw['vs_fastest_peer']:.2f}x {rw['fastest_peer']}" if rw.get("vs_fastest_peer") is not None
                   else "-")
        vs_lc = (f"{rw['vs_llamacpp']['ratio']:.2f}x {rw['vs_llamacpp']['file']}" if rw.get("vs_llamacpp") else "-")
        if rw["median_ms"] is None:
            lines.append(f"| {rw['runner']} | {rw['type']} | {rw['note'] or 'not timed'} | - | - | - | - | - | - | "
                         f"{_check_cell(rw)} | {_quality_cell(rw['quality'])} |")
            continue
        lines.append(f"| {rw['runner']} | {rw['type']} | {rw['median_ms']:.2f} | {_f(rw['p90_ms'])} | "
                     f"{_f(rw['tokens_per_s'], '.1f')} | {rw['compile_or_load_s']:.1f} | {rw['prepared_s']:.1f} | "
                     f"{vs_peer} | {vs_lc} | {_check_cell(rw)} | {_quality_cell(rw['quality'])} |")
    notes = [f"- {rw['runner']}: {rw['note']}" for rw in r["rows"] if rw["note"] and rw["median_ms"] is not None]
    if notes:
        lines += ["", *notes]
    lines += ["", "Models: " + "; ".join(f"{k}: {v}" for k, v in r["models"].items()) + ".",
              "", "Not covered here: vLLM's CPU build and zentorch (issue 59's other peers), batch 8, prefill."]
    return "\n".join(lines) + "\n"
