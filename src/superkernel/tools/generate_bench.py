"""``superkernel bench --generate``: tokens/s of ``model.generate()`` with a plan, against eager and torch.compile.

Each peer gets its own copy of the model (same weights): eager ``generate()`` with a static
cache, ``generate()`` whose decode steps plain ``torch.compile`` compiles, and ``generate()``
with the superkernel plan (:func:`superkernel.tools.generate.apply_for_generate`). The first
call of each compiles; then every peer generates in rotating rounds (machine drift spreads
over all of them). Per call a streamer timestamps the prompt and every new token:
time to first token (prefill + first token), total time, end-to-end tokens/s (new tokens /
total) and decode tokens/s (tokens after the first / time after it). Every call's greedy
tokens are compared with eager's on every round: a peer whose tokens differ is marked and
gets no ratio (never a baseline without the flag).
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from superkernel.timing import median_ratio, rotation
from superkernel.tools.generate import apply_for_generate, compile_config

EAGER, TORCH_COMPILE = "eager generate()", "torch.compile generate()"


class _Clock:
    """A ``generate()`` streamer that records when the prompt and each new token arrive."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value: Any) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        self.stamps.append(time.perf_counter())


@dataclass
class GenerateRun:
    label: str
    first_call_s: float | None = None
    ttft_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)   # time after the first token
    wrong_rounds: list[int] = field(default_factory=list)  # 1-based rounds whose tokens differ from eager's
    rounds: int = 0
    error: str | None = None
    tokens_vs_eager_ratio: list[float] = field(default_factory=list)

    @property
    def wrong(self) -> bool:
        return bool(self.wrong_rounds)

    def median(self, name: str) -> float | None:
        values = getattr(self, name)
        return statistics.median(values) if values else None

    def compile_s(self) -> float | None:
        """First call minus a warm call: what compiling cost."""
        total = self.median("total_ms")
        if self.first_call_s is None or total is None:
            return None
        return max(0.0, self.first_call_s - total / 1e3)


@dataclass
class GenerateBench:
    runs: list[GenerateRun]
    prompt_len: int
    new_tokens: int
    rounds: int
    batch: int = 1
    plan: str = ""

    def run(self, label: str) -> GenerateRun | None:
        return next((r for r in self.runs if r.label == label), None)

    def to_dict(self) -> dict[str, Any]:
        eager, compiled = self.run(EAGER), self.run(TORCH_COMPILE)
        rows = []
        for r in self.runs:
            row = {"peer": r.label, "error": r.error, "first_call_s": r.first_call_s, "compile_s": r.compile_s(),
                   "ttft_ms": r.median("ttft_ms"), "total_ms": r.median("total_ms"),
                   "tokens_per_s": _per_s(self.new_tokens * self.batch, r.median("total_ms")),
                   "decode_tokens_per_s": _per_s((self.new_tokens - 1) * self.batch, r.median("decode_ms")),
                   "tokens_equal_eager_every_round": not r.wrong and r.rounds > 0, "wrong_rounds": r.wrong_rounds,
                   "rounds": r.rounds, "speedup_vs_eager": _speedup(r, eager), "speedup_vs_torch_compile":
                   _speedup(r, compiled)}
            rows.append(row)
        return {"prompt_len": self.prompt_len, "new_tokens": self.new_tokens, "rounds": self.rounds,
                "batch": self.batch, "plan": self.plan, "rows": rows}


def _per_s(tokens: int, ms: float | None) -> float | None:
    return tokens * 1e3 / ms if ms else None


def _speedup(run: GenerateRun, base: GenerateRun | None) -> float | None:
    """Median over rounds of base total / run total (same round); None for a wrong run or base."""
    if base is None or base.wrong or run.wrong or not run.total_ms or not base.total_ms:
        return None
    return median_ratio(run.total_ms, base.total_ms)


def _generate(model: Any, prompt: torch.Tensor, new_tokens: int, **kwargs: Any) -> tuple[torch.Tensor, _Clock]:
    clock = _Clock()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             streamer=clock, attention_mask=torch.ones_like(prompt), **kwargs)
    clock.stamps.insert(0, start)
    return out, clock


def bench_generate(model: Any, plan: Any, *, mode: str | None = None, prompt_len: int = 32, new_tokens: int = 32,
                   rounds: int = 3, seed: int = 0, plan_label: str = "superkernel generate()") -> GenerateBench:
    """Time ``generate()`` of eager, torch.compile and the plan on copies of ``model`` (see module doc)."""
    from superkernel.tools.decode import make_prompt
    from superkernel.util import exception_summary

    if new_tokens < 2:
        raise ValueError(f"--new-tokens must be >= 2 (time to first token and decode rate), got {new_tokens}")
    device = next(model.parameters()).device
    vocab = getattr(model.config, "vocab_size", None) or model.config.get_text_config().vocab_size
    prompt = make_prompt(int(vocab), prompt_len, seed, device)
    eager_model = model
    compiled_model = copy.deepcopy(model)
    compiled_model.generation_config.compile_config = compile_config("inductor")
    plan_model = apply_for_generate(copy.deepcopy(model), plan, mode=mode)
    peers = [(GenerateRun(EAGER), eager_model, {"cache_implementation": "static", "disable_compile": True}),
             (GenerateRun(TORCH_COMPILE), compiled_model, {"cache_implementation": "static"}),
             (GenerateRun(plan_label), plan_model, {})]
    reference = None
    for run, peer_model, kwargs in peers:
        try:
            start = time.perf_counter()
            out, _ = _generate(peer_model, prompt, new_tokens, **kwargs)
            run.first_call_s = time.perf_counter() - start
            if reference is None:
                reference = out
        except Exception as exc:  # noqa: BLE001 - reported in the table
            run.error = exception_summary(exc, 300, first_line=True)
    live = [p for p in peers if p[0].error is None]
    for r in range(rounds):
        for run, peer_model, kwargs in (live[i] for i in rotation(len(live), r)):
            out, clock = _generate(peer_model, prompt, new_tokens, **kwargs)
            stamps = clock.stamps  # start, prompt put, token 1, ..., token N, end
            run.ttft_ms.append((stamps[2] - stamps[0]) * 1e3)
            run.total_ms.append((stamps[-1] - stamps[0]) * 1e3)
            run.decode_ms.append((stamps[-1] - stamps[2]) * 1e3)
            run.rounds += 1
            if reference is None or not torch.equal(out, reference):
                run.wrong_rounds.append(r + 1)
    return GenerateBench(runs=[p[0] for p in peers], prompt_len=prompt_len, new_tokens=new_tokens, rounds=rounds,
                         plan=plan_label)


def markdown_section(result: GenerateBench, title: str = "## `generate()`") -> str:
    """The report section: one row per peer."""
    data = result.to_dict()
    lines = [title, "",
             f"Greedy `model.generate()` of {data['new_tokens']} new tokens after a {data['prompt_len']}-token prompt, "
             f"batch {data['batch']}, static cache; {data['rounds']} rotating rounds after one compiling call per peer. "
             "Medians over rounds. tokens/s = new tokens / whole call (prefill included); decode tokens/s = tokens "
             "after the first / time after it; TTFT = call start to first new token. Every round's tokens are "
             "compared with eager's: a peer whose tokens differ gets no speedup.", "",
             "| peer | tokens/s | decode tokens/s | TTFT ms | total ms | vs eager | vs torch.compile | "
             "tokens = eager (every round) | first call s | compile s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f="{:.1f}": f.format(v) if v is not None else "-"  # noqa: E731
    for row in data["rows"]:
        if row["error"]:
            lines.append(f"| {row['peer']} | failed: {row['error']} |" + " |" * 8)
            continue
        same = "yes" if row["tokens_equal_eager_every_round"] else f"NO (rounds {row['wrong_rounds']})"
        lines.append(f"| {row['peer']} | {fmt(row['tokens_per_s'])} | {fmt(row['decode_tokens_per_s'])} | "
                     f"{fmt(row['ttft_ms'], '{:.2f}')} | {fmt(row['total_ms'])} | "
                     f"{fmt(row['speedup_vs_eager'], '{:.2f}x')} | {fmt(row['speedup_vs_torch_compile'], '{:.2f}x')} | "
                     f"{same} | {fmt(row['first_call_s'])} | {fmt(row['compile_s'])} |")
    return "\n".join(lines) + "\n"
