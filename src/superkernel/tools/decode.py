"""Decode harness: prefill once, then time teacher-forced decode steps on a static KV cache.

The flow per model (benchmarks/README.md, how speed is measured):

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

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from superkernel.hf_cache_names import CACHE_KEYWORDS, cache_keyword
from superkernel.tools.cache_state import (restore_module_state, restore_state, snapshot_module_state,
                                           snapshot_state)

__all__ = ["DecodeRun", "DecodeSession", "DynamoCounts", "StepFn", "prepare", "restore_state", "run_decode",
           "snapshot_state", "synchronize"]

StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class DecodeSession:
    """Everything plans share: prompt, cache (with its post-prefill snapshot) and the fed tokens."""

    model: torch.nn.Module
    device: torch.device
    prompt_ids: torch.Tensor          # [batch, prompt_len]
    tokens: torch.Tensor              # [warmup + steps, batch] tokens fed at each decode step
    cache: object                     # transformers StaticCache, preallocated
    snapshot: dict[str, Any]           # snapshot_state(cache) right after prefill
    warmup: int
    steps: int
    prefill_seconds: float
    max_cache_len: int
    #: Python ints of the cache that change from step to step (e.g. a sliding window's
    #: ``cumulative_length_int``): measured during the reference decode, made dynamic for
    #: Dynamo while the decode runs so the step compiles once instead of once per position.
    growing_ints: list[str] = field(default_factory=list)
    #: Tensors of the cache whose *size* changes from step to step (``name:dim``, e.g. a position
    #: history concatenated every step): measured like :attr:`growing_ints`. Their sizes reach
    #: frames after graph breaks under local names no source pattern can name, so such a decode
    #: compiles with every input size symbolic (:attr:`compile_dynamic`) instead of once per step.
    growing_tensors: list[str] = field(default_factory=list)
    #: The model's forward takes ``position_ids``: the step passes them (from cache_position)
    #: so models that derive them from a mask growing with the position (OPT) keep static shapes.
    pass_position_ids: bool = False
    #: The keyword the model's forward takes its cache under (:func:`cache_keyword`): Mamba-style
    #: models name it ``cache_params`` (``cache`` from transformers 5.24) and would take
    #: ``past_key_values`` into ``**kwargs``, ignore it and decode every step from an empty state.
    cache_kwarg: str = "past_key_values"

    #: A 2-D all-ones attention mask as long as the cache (``[batch, max_cache_len]``), passed with
    #: every decode step when the model would otherwise build its default mask from the cache's
    #: length (``torch.ones(batch, past + 1)``, see :func:`_default_mask_grows`): that mask's length
    #: changes every step, so a compiled step would see a data-dependent shape. A full-length mask
    #: is what transformers pads a shorter one to for a static cache, so the model computes the same.
    attention_mask: torch.Tensor | None = None
    #: The model's own decode state outside the cache, right after prefill
    #: (:func:`~superkernel.tools.cache_state.snapshot_module_state`): restored with the cache.
    module_snapshot: dict[str, Any] = field(default_factory=dict)
    #: With a real text (``prepare(text_ids=...)``): the token each decode step should predict ``[total_steps]``
    #: (step i is fed ``tokens[i]``, the text's next token); None for a greedy session.
    text_targets: torch.Tensor | None = None

    def step_kwargs(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> dict[str, torch.Tensor]:
        """The decode step's inputs besides ids, cache and position (see the two fields above)."""
        kwargs = {}
        if self.pass_position_ids:
            kwargs["position_ids"] = cache_position.unsqueeze(0).expand(input_ids.shape[0], -1)
        if self.attention_mask is not None:
            kwargs["attention_mask"] = self.attention_mask
        return kwargs

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_ids.shape[1])

    @property
    def batch(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def dynamic_sources(self) -> str:
        """``torch.compiler.config.dynamic_sources`` for the decode (see :attr:`growing_ints`)."""
        return ",".join(rf".*\.{name}$" for name in self.growing_ints)

    @property
    def compile_dynamic(self) -> bool:
        """``torch.compile(dynamic=...)`` for this decode: True when a cache tensor grows (see
        :attr:`growing_tensors`), else False (static shapes; growing ints are dynamic sources)."""
        return bool(self.growing_tensors)

    def dynamo_config(self):
        """Context manager: the Dynamo settings every decode run (baselines and plans alike) uses.

        - the cache's growing Python ints are dynamic sources (see :attr:`growing_ints`);
        - ``.item()`` and data-dependent output shapes are captured instead of breaking the
          graph (``capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops``): OPT's
          dead ``torch.ones(batch, past + 1)`` mask, MoE routing with ``nonzero``.
        """
        import contextlib

        import superkernel.pipeline.backend  # noqa: F401 - the backend registered (allowed() wraps Dynamo's converter)
        from superkernel.pipeline import capture_fallback

        stack = contextlib.ExitStack()
        stack.enter_context(capture_fallback.allowed())  # where capturing makes Dynamo fail: a graph break
        stack.enter_context(torch._dynamo.config.patch(capture_scalar_outputs=True,
                                                       capture_dynamic_output_shape_ops=True))
        if self.growing_ints:
            stack.enter_context(torch.compiler.config.patch(dynamic_sources=self.dynamic_sources))
        return stack

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    def restore_cache(self) -> None:
        """Put the cache back to its complete state right after prefill (see :func:`snapshot_state`).

        Tensors are copied in place (their addresses stay the same: compiled steps and CUDA
        graphs keep pointing at them); Python attributes (ints such as a sliding window's
        ``cumulative_length_int``, flags, dicts of per-state tensors) are set back, and so is the
        state the model keeps on its modules (a recurrent state held outside the cache).
        """
        restore_state(self.cache, self.snapshot)
        restore_module_state(self.model, self.module_snapshot)

    def step_fn(self) -> StepFn:
        """A fresh eager decode step bound to this session's model and cache.

        Returns the last-position logits ``[batch, vocab]``. Compile it with any backend.
        """
        model, cache, cache_kwarg = self.model, self.cache, self.cache_kwarg
        extra = self.step_kwargs

        def decode_step(input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
            out = model(input_ids=input_ids, cache_position=cache_position, use_cache=True,
                        **{cache_kwarg: cache}, **extra(input_ids, cache_position))
            return out.logits[:, -1, :]

        return decode_step

    def inputs(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.tokens[i].reshape(self.batch, 1)
        pos = torch.tensor([self.prompt_len + i], device=self.device)
        return ids, pos


@dataclass
class DecodeRun:
    """Logits and timings of one plan over all decode steps of a session."""

    label: str
    logits: torch.Tensor                     # [(warmup + steps) * batch, vocab], float32 on CPU, step-major
    step_seconds: list[float] = field(repr=False)  # every step, warm-up included
    warmup: int = 1
    compile_seconds: float = 0.0             # first call: tracing + compiling + one step
    batch: int = 1
    dynamo: "DynamoCounts | None" = None     # recompiles / graph breaks, split into warm-up and timed steps

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
        return self.batch * 1e3 / self.median_ms if self.median_ms > 0 else math.inf


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def make_prompt(vocab_size: int, prompt_len: int, seed: int, device: torch.device, batch: int = 1) -> torch.Tensor:
    """Seeded random token ids ``[batch, prompt_len]`` (row 0 is the same for every batch size)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, prompt_len), generator=gen).to(device)


def _takes_position_ids(model: torch.nn.Module) -> bool:
    import inspect

    try:
        return "position_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _layer_attrs(cache: Any, pick: Callable[[Any], Any]) -> dict[tuple[int, str], Any]:
    """(layer index, attribute) -> ``pick(value)`` for every attribute of the cache layers it does not map to None."""
    out = {}
    for i, layer in enumerate(getattr(cache, "layers", [])):
        for name, value in vars(layer).items():
            picked = pick(value)
            if picked is not None:
                out[(i, name)] = picked
    return out


def _python_ints(cache: Any) -> dict[tuple[int, str], int]:
    """(layer index, attribute) -> value of every plain int attribute of the cache layers."""
    return _layer_attrs(cache, lambda v: v if isinstance(v, int) and not isinstance(v, bool) else None)


def _tensor_sizes(cache: Any) -> dict[tuple[int, str], tuple[int, ...]]:
    """(layer index, attribute) -> size of every tensor attribute of the cache layers."""
    return _layer_attrs(cache, lambda v: tuple(v.shape) if isinstance(v, torch.Tensor) else None)


def _grown(before: dict[tuple[int, str], tuple[int, ...]], after: dict[tuple[int, str], tuple[int, ...]]) -> list[str]:
    """``name:dim`` of every tensor attribute whose size differs between two :func:`_tensor_sizes`."""
    grown = set()
    for key, size in after.items():
        old = before.get(key)
        if old is not None and old != size:
            if len(old) != len(size):
                grown.add(key[1])
            else:
                grown.update(f"{key[1]}:{d}" for d, (a, b) in enumerate(zip(old, size)) if a != b)
    return sorted(grown)


def prepare(model: torch.nn.Module, *, prompt_len: int = 32, steps: int = 32, warmup: int = 4, seed: int = 0,
            device: str | torch.device | None = None, batch: int = 1, reference_tokens: bool = True,
            spare_slots: int = 1, text_ids: torch.Tensor | None = None) -> DecodeSession:
    """Prefill once and fix the token sequence all plans are fed (see module doc).

    ``text_ids``: token ids of a real text (``[n]``, n > prompt_len + warmup + steps): the prompt is its first
    ``prompt_len`` tokens and the decode steps are fed the text's next tokens (teacher-forced) instead of the
    greedy continuation, so every plan's logits can be scored against the text (:mod:`superkernel.tools.quality`);
    :attr:`DecodeSession.text_targets` holds the token each step should predict.

    ``reference_tokens=False`` skips the greedy reference decode (batch 1 only): ``tokens``
    is then each sequence's next token after the prompt, enough to run one decode step
    (static kernel builds and cold starts use this).

    ``spare_slots``: cache positions left free after the last decode step (where the model
    allows). A decode step that fills the cache's last slot takes another branch in
    transformers' mask preparation (``masking_utils._preprocess_mask_arguments``: a 2-D mask as
    long as the cache is used as is, a shorter one is padded), so models that build their
    own growing 2-D mask (BioGPT: ``torch.ones(batch, past + 1)``) recompiled on the last
    timed step; one spare slot keeps every timed step on the same branch, as in a real
    decode whose cache is longer than what it has written.
    """
    from transformers import StaticCache

    if prompt_len < 1 or steps < 1:
        raise ValueError(f"prompt length and steps must be >= 1 (got prompt_len={prompt_len}, steps={steps})")
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1: the first step of a compiled plan includes compiling (got {warmup})")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and max_pos <= 0:  # XLNet's -1: relative positions, no length limit
        max_pos = None
    max_cache_len = prompt_len + warmup + steps
    if max_pos is not None and max_cache_len > max_pos:
        raise ValueError(f"prompt_len + warmup + steps = {max_cache_len} exceeds the model's "
                         f"max_position_embeddings ({max_pos})")
    if batch < 1:
        raise ValueError(f"batch must be >= 1 (got {batch})")
    max_cache_len += max(0, min(spare_slots, (max_pos or max_cache_len + spare_slots) - max_cache_len))
    vocab = getattr(model.config, "vocab_size", None) or getattr(model.config.get_text_config(), "vocab_size")
    forced = None
    if text_ids is not None:
        text_ids = text_ids.reshape(-1).to(device)
        need = prompt_len + warmup + steps + 1  # the prompt, every step's input, the last step's target
        if text_ids.shape[0] < need:
            raise ValueError(f"the evaluation text has {text_ids.shape[0]} tokens; prompt_len + warmup + steps + 1 = "
                             f"{need} are needed")
        prompt = text_ids[:prompt_len].expand(batch, -1).contiguous()
        forced = text_ids[prompt_len:need]
    else:
        prompt = make_prompt(int(vocab), prompt_len, seed, device, batch)
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    cache_kwarg = cache_keyword(model)
    with torch.no_grad():
        synchronize(device)
        start = time.perf_counter()
        out = model(input_ids=prompt, cache_position=torch.arange(prompt_len, device=device), use_cache=True,
                    **{cache_kwarg: cache})
        synchronize(device)
        prefill_seconds = time.perf_counter() - start
    if not _cache_written(cache):
        raise ValueError(f"the model did not write the StaticCache it was given during prefill: {_cache_param(model)}")
    snapshot = snapshot_state(cache)
    session = DecodeSession(model=model, device=device, prompt_ids=prompt, tokens=torch.empty(0), cache=cache,
                            snapshot=snapshot, module_snapshot=snapshot_module_state(model), warmup=warmup,
                            steps=steps, prefill_seconds=prefill_seconds,
                            max_cache_len=max_cache_len, pass_position_ids=_takes_position_ids(model),
                            cache_kwarg=cache_kwarg)
    first = out.logits[:, -1].argmax(-1) if forced is None else forced[0].expand(batch)
    teacher = None if forced is None else forced[:session.total_steps].unsqueeze(1).expand(-1, batch)
    session.tokens = _greedy_tokens(session, first, teacher) if reference_tokens else first.reshape(1, batch)
    if _pass_static_mask(session) and reference_tokens and teacher is None:
        without = session.tokens
        session.tokens = _greedy_tokens(session, first)
        if not torch.equal(without, session.tokens):  # the full mask is not what the model's default means
            session.attention_mask, session.tokens = None, _greedy_tokens(session, first)
    if forced is not None:
        session.text_targets = forced[1:session.total_steps + 1].cpu()
    return session


def _cache_written(cache: Any) -> bool:
    """Did a forward write the cache: a layer initialized (``is_initialized`` and the like) or a nonzero tensor."""
    for layer in getattr(cache, "layers", []):
        for name, attr in vars(layer).items():
            for value in attr.values() if isinstance(attr, dict) else [attr]:  # per-state dicts (linear attention)
                if name.startswith("is_") and name.endswith("initialized") and value is True:
                    return True
                if isinstance(value, torch.Tensor) and value.numel() and bool(value.ne(0).any()):
                    return True
    return False


def _cache_param(model: torch.nn.Module) -> str:
    """Where the model's forward is and which cache keyword it takes (for the error above)."""
    import inspect

    forward = type(model).forward
    try:
        where = f"{inspect.getsourcefile(forward).split('site-packages/')[-1]}:{inspect.getsourcelines(forward)[1]}"
        params = inspect.signature(forward).parameters
    except (OSError, TypeError, ValueError):
        return f"{type(model).__name__}.forward"
    takes = [name for name in CACHE_KEYWORDS if name in params]
    return (f"{type(model).__name__}.forward ({where}) takes " + (" / ".join(takes) if takes else
            f"none of {', '.join(CACHE_KEYWORDS)}"))


def _pass_static_mask(session: DecodeSession) -> bool:
    """Give the session a full-length attention mask if the model's default one grows (see
    :mod:`superkernel.tools.default_mask`); True when it did (the caller decodes again with it
    and keeps the mask only if the greedy tokens stay the same)."""
    from superkernel.tools.default_mask import default_mask_grows, takes_attention_mask

    if session.attention_mask is not None or not takes_attention_mask(session.model):
        return False
    session.restore_cache()
    try:
        grows = default_mask_grows(session.step_fn(), [session.inputs(i) for i in range(min(2, len(session.tokens)))],
                                   session.batch)
    finally:
        session.restore_cache()
    if grows:
        session.attention_mask = torch.ones(session.batch, session.max_cache_len, dtype=torch.long,
                                            device=session.device)
    return grows


def _greedy_tokens(session: DecodeSession, first: torch.Tensor, teacher: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy decode with the uncompiled model; the result is the sequence every plan is fed (``teacher``
    ``[total_steps, batch]``: those tokens instead, a text's).

    Also records which Python ints of the cache changed over the decode (growing_ints) and which
    tensors of the cache changed size (growing_tensors).
    """
    tokens = [first.reshape(session.batch)]
    step = session.step_fn()
    session.restore_cache()
    before, sizes_before = _python_ints(session.cache), _tensor_sizes(session.cache)
    with torch.no_grad():
        for i in range(session.total_steps - 1):
            ids = tokens[-1].reshape(session.batch, 1)
            pos = torch.tensor([session.prompt_len + i], device=session.device)
            picked = step(ids, pos).argmax(-1).reshape(session.batch)
            tokens.append(picked if teacher is None else teacher[i + 1])
        if session.total_steps == 1:  # one step still shows which ints move
            step(tokens[0].reshape(session.batch, 1), torch.tensor([session.prompt_len], device=session.device))
    after = _python_ints(session.cache)
    session.growing_ints = sorted({name for key, name in after if before.get((key, name)) != after[(key, name)]})
    session.growing_tensors = _grown(sizes_before, _tensor_sizes(session.cache))
    session.restore_cache()
    return torch.stack(tokens).to(session.device)


@dataclass
class DynamoCounts:
    """What Dynamo did during one run, measured (not guessed) from its own records.

    ``recompiles_*`` count guard failures that made Dynamo compile the step again
    (``torch._dynamo.utils.guard_failures``); ``graph_breaks_*`` the graph breaks Dynamo
    traced (``counters["graph_break"]``); ``graphs_*`` graphs handed to a backend. "first"
    is the first call (the compile), "warmup" the other warm-up steps, "timed" the timed steps.
    """

    recompiles_first: int = 0
    recompiles_warmup: int = 0
    recompiles_timed: int = 0
    graph_breaks_first: int = 0
    graph_breaks_later: int = 0
    graphs_first: int = 0
    graphs_later: int = 0
    reasons: list[str] = field(default_factory=list)   # guard failures after the first call, first line each
    break_reasons: list[str] = field(default_factory=list)
    limit_hit: bool = False                            # Dynamo gave up and runs the step uncompiled

    @property
    def recompiles_in_steady_state(self) -> bool:
        return self.recompiles_timed > 0 or self.limit_hit

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _dynamo_marks() -> tuple[int, int, int, list[str], list[str]]:
    from torch._dynamo.utils import counters, guard_failures

    fails = [reason for reasons in guard_failures.values() for reason in reasons]
    breaks = list(counters["graph_break"].keys())
    return (len(fails), int(sum(counters["graph_break"].values())), int(counters["stats"]["unique_graphs"]),
            fails, breaks)


class DynamoWatch(logging.Handler):
    """Marks Dynamo's counters per phase and hears Dynamo say it gave up on a frame.

    Whether Dynamo hit its recompile limit is taken from Dynamo's own warning
    ("torch._dynamo hit config.recompile_limit"), logged where it decides: counting guard
    failures cannot tell, as Dynamo records one failure per cache entry it checked, and
    applies its limit per frame (per module instance for module frames).
    """

    LOGGER = "torch._dynamo.convert_frame"

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.marks = [_dynamo_marks()]
        self.limit_messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("torch._dynamo hit config."):
            self.limit_messages.append(" ".join(message.split())[:300])

    def __enter__(self) -> DynamoWatch:
        logging.getLogger(self.LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(self.LOGGER).removeHandler(self)

    def mark(self) -> None:
        self.marks.append(_dynamo_marks())

    def counts(self) -> DynamoCounts:
        """Counts with the marks taken: start, after the first call, after warm-up, end."""
        marks = list(self.marks)
        while len(marks) < 3:  # fewer steps than phases: a phase that did not run adds nothing
            marks.append(marks[-1])
        return _counts(marks[:3] + [_dynamo_marks()], self.limit_messages)


def _first_line(text: str) -> str:
    return " ".join(str(text).strip().splitlines()[0].split())[:300] if str(text).strip() else ""


def run_decode(session: DecodeSession, step: StepFn, *, label: str = "",
               on_step: Callable[[int, int], None] | None = None,
               before_step: Callable[[], None] | None = None) -> DecodeRun:
    """Run every decode step of the session through ``step`` and time each one.

    ``on_step(done, total)`` is called after each step (progress bars), ``before_step()``
    right before each step's clock starts (a distributed barrier). The run also counts
    Dynamo's recompiles and graph breaks per phase (:class:`DynamoCounts`).
    """
    session.restore_cache()
    device = session.device
    logits, times = [], []
    total = session.total_steps
    with torch.no_grad(), session.dynamo_config(), DynamoWatch() as watch:
        for i in range(total):
            ids, pos = session.inputs(i)
            synchronize(device)
            if before_step is not None:
                before_step()
            start = time.perf_counter()
            out = step(ids, pos)
            synchronize(device)
            times.append(time.perf_counter() - start)
            # Copy out at once: a CUDA-graph replay may reuse the output buffer on the next step.
            logits.append(out.detach().reshape(-1, out.shape[-1]).float().cpu().clone())
            if i == 0 or i == session.warmup - 1:
                watch.mark()
            if on_step is not None:
                on_step(i + 1, total)
    session.restore_cache()
    return DecodeRun(label=label, logits=torch.cat(logits), step_seconds=times, warmup=session.warmup,
                     compile_seconds=times[0], batch=session.batch, dynamo=watch.counts())


def _counts(marks: list[tuple[int, int, int, list[str], list[str]]], limit_messages: list[str]) -> DynamoCounts:
    start, first, warm, end = marks
    later_fails = end[3][first[0]:]
    new_breaks = [b for b in end[4] if b not in start[4]]
    return DynamoCounts(
        recompiles_first=first[0] - start[0], recompiles_warmup=warm[0] - first[0], recompiles_timed=end[0] - warm[0],
        graph_breaks_first=first[1] - start[1], graph_breaks_later=end[1] - first[1],
        graphs_first=first[2] - start[2], graphs_later=end[2] - first[2],
        reasons=list(dict.fromkeys(_first_line(r) for r in later_fails))[:5],
        break_reasons=[_first_line(b) for b in new_breaks][:5],
        limit_hit=bool(limit_messages) or any("recompile limit" in b.lower() for b in new_breaks))
