"""Decode harness: prefill once, then time teacher-forced decode steps on a static KV cache.

The flow per model (DESIGN.md section 7):

1. :func:`prepare` builds a seeded prompt, preallocates a ``transformers`` StaticCache,
   runs the prefill once (uncompiled, unscoped: scopes only act under torch.compile),
   snapshots the cache, and greedy-decodes the token sequence every plan is fed.
2. :func:`run_decode` restores the snapshot and feeds that same sequence through a
   step function (eager, torch.compile, superkernel...). Step *i* of every plan sees
   the same input token, position and cache contents, so logits are comparable
   across plans bit for bit.

The first call of a compiled step includes compilation; it is reported as compile
time and never counted in the step statistics, which only use the steps after the
warm-up.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class DecodeSession:
    """Everything plans share: prompt, cache (with its post-prefill snapshot) and the fed tokens."""

    model: torch.nn.Module
    device: torch.device
    prompt_ids: torch.Tensor          # [1, prompt_len]
    tokens: torch.Tensor              # [warmup + steps] token fed at each decode step
    cache: object                     # transformers StaticCache, preallocated
    snapshot: list[tuple[torch.Tensor, ...]]
    warmup: int
    steps: int
    prefill_seconds: float
    max_cache_len: int

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_ids.shape[1])

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    def restore_cache(self) -> None:
        """Put the cache back to its state right after prefill, in place (addresses stay the same)."""
        for layer, saved in zip(self.cache.layers, self.snapshot):
            for tensor, value in zip(_layer_state(layer), saved):
                tensor.copy_(value)

    def step_fn(self) -> StepFn:
        """A fresh eager decode step bound to this session's model and cache.

        Returns the last-position logits ``[1, vocab]``. Compile it with any backend.
        """
        model, cache = self.model, self.cache

        def decode_step(input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
            out = model(input_ids=input_ids, past_key_values=cache, cache_position=cache_position, use_cache=True)
            return out.logits[:, -1, :]

        return decode_step

    def inputs(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.tokens[i].reshape(1, 1)
        pos = torch.tensor([self.prompt_len + i], device=self.device)
        return ids, pos


@dataclass
class DecodeRun:
    """Logits and timings of one plan over all decode steps of a session."""

    label: str
    logits: torch.Tensor                     # [warmup + steps, vocab], float32 on CPU
    step_seconds: list[float] = field(repr=False)  # every step, warm-up included
    warmup: int = 1
    compile_seconds: float = 0.0             # first call: tracing + compiling + one step

    @property
    def timed(self) -> list[float]:
        return self.step_seconds[self.warmup:]

    @property
    def median_ms(self) -> float:
        return _quantile(self.timed, 0.5) * 1e3

    @property
    def p90_ms(self) -> float:
        return _quantile(self.timed, 0.9) * 1e3

    @property
    def tokens_per_s(self) -> float:
        return 1e3 / self.median_ms if self.median_ms > 0 else math.inf  # batch 1


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _layer_state(layer) -> tuple[torch.Tensor, ...]:
    state = [layer.keys, layer.values]
    if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
        state.append(layer.cumulative_length)  # transformers >= 5 tracks the write position in the layer
    return tuple(state)


def make_prompt(vocab_size: int, prompt_len: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, prompt_len), generator=gen).to(device)


def prepare(model: torch.nn.Module, *, prompt_len: int = 32, steps: int = 32, warmup: int = 4, seed: int = 0,
            device: str | torch.device | None = None, batch: int = 1, reference_tokens: bool = True) -> DecodeSession:
    """Prefill once and fix the token sequence all plans are fed (see module doc).

    ``reference_tokens=False`` skips the greedy reference decode (batch 1 only): ``tokens``
    is then each sequence's next token after the prompt, enough to run one decode step
    (static kernel builds and cold starts use this).
    """
    from transformers import StaticCache

    if prompt_len < 1 or steps < 1:
        raise ValueError(f"prompt length and steps must be >= 1 (got prompt_len={prompt_len}, steps={steps})")
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1: the first step of a compiled plan includes compiling (got {warmup})")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    max_pos = getattr(model.config, "max_position_embeddings", None)
    max_cache_len = prompt_len + warmup + steps
    if max_pos is not None and max_cache_len > max_pos:
        raise ValueError(f"prompt_len + warmup + steps = {max_cache_len} exceeds the model's "
                         f"max_position_embeddings ({max_pos})")
    if reference_tokens and batch != 1:
        raise ValueError(f"the greedy reference token sequence is batch 1 only (got batch={batch})")
    prompt = make_prompt(int(model.config.vocab_size), prompt_len, seed, device).repeat(batch, 1)
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    with torch.no_grad():
        synchronize(device)
        start = time.perf_counter()
        out = model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(prompt_len, device=device),
                    use_cache=True)
        synchronize(device)
        prefill_seconds = time.perf_counter() - start
    snapshot = [tuple(t.clone() for t in _layer_state(layer)) for layer in cache.layers]
    session = DecodeSession(model=model, device=device, prompt_ids=prompt, tokens=torch.empty(0), cache=cache,
                            snapshot=snapshot, warmup=warmup, steps=steps, prefill_seconds=prefill_seconds,
                            max_cache_len=max_cache_len)
    if reference_tokens:
        session.tokens = _greedy_tokens(session, out.logits[0, -1].argmax())
    else:
        session.tokens = out.logits[:, -1].argmax(-1)
    return session


def _greedy_tokens(session: DecodeSession, first: torch.Tensor) -> torch.Tensor:
    """Greedy decode with the uncompiled model; the result is the sequence every plan is fed."""
    tokens = [first.reshape(())]
    step = session.step_fn()
    session.restore_cache()
    with torch.no_grad():
        for i in range(session.total_steps - 1):
            ids = tokens[-1].reshape(1, 1)
            pos = torch.tensor([session.prompt_len + i], device=session.device)
            tokens.append(step(ids, pos)[0].argmax())
    session.restore_cache()
    return torch.stack(tokens).to(session.device)


def run_decode(session: DecodeSession, step: StepFn, *, label: str = "",
               on_step: Callable[[int, int], None] | None = None) -> DecodeRun:
    """Run every decode step of the session through ``step`` and time each one.

    ``on_step(done, total)`` is called after each step (progress bars).
    """
    session.restore_cache()
    device = session.device
    logits, times = [], []
    total = session.total_steps
    with torch.no_grad():
        for i in range(total):
            ids, pos = session.inputs(i)
            synchronize(device)
            start = time.perf_counter()
            out = step(ids, pos)
            synchronize(device)
            times.append(time.perf_counter() - start)
            # Copy out at once: a CUDA-graph replay may reuse the output buffer on the next step.
            logits.append(out.detach().reshape(-1).float().cpu().clone())
            if on_step is not None:
                on_step(i + 1, total)
    session.restore_cache()
    return DecodeRun(label=label, logits=torch.stack(logits), step_seconds=times, warmup=session.warmup,
                     compile_seconds=times[0])
