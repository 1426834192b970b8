"""Decode steps that read their KV cache from a holder, so a round can run on a brand-new cache.

``DecodeSession.step_fn`` closes over the session's one cache, restored in place between
runs: its tensors keep their addresses, which is what compiled steps and CUDA graphs of
the measured plans expect. A user's next ``generate()`` call, though, builds a *new*
``StaticCache``. A compiled peer that folded the first cache into its graph (Inductor
freezing) is right on the cache it was compiled with and wrong on the new one; only a run
on a fresh cache shows it, and only when that cache holds *other* contents (another
prompt): a stale cache of the same prompt gives the same logits. :func:`holder_step` reads
``holder.cache`` at every call and :func:`fresh_cache` builds that new cache, prefilled by
the uncompiled model with the session's prompt or, given ``seed``, another seeded prompt of
the same shape. The cache goes under the keyword the model takes (``session.cache_kwarg``); a
model that keeps decode state on its modules gets it from this prefill, and the session's own
state back with :meth:`DecodeSession.restore_cache`.
"""

from __future__ import annotations

from typing import Any

import torch

from superkernel.tools.decode import DecodeSession, StepFn, synchronize


class CacheHolder:
    """The cache a :func:`holder_step` reads; swap ``cache`` between runs."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache


def fresh_cache(session: DecodeSession, model: torch.nn.Module | None = None, seed: int | None = None) -> Any:
    """A new ``StaticCache`` like the session's, prefilled (uncompiled, unscoped) with its prompt,
    or with a prompt of the same shape drawn from ``seed``."""
    from transformers import StaticCache

    from superkernel.tools.decode import make_prompt

    model = model if model is not None else session.model
    prompt = session.prompt_ids
    if seed is not None:
        vocab = getattr(model.config, "vocab_size", None) or model.config.get_text_config().vocab_size
        prompt = make_prompt(int(vocab), session.prompt_len, seed, session.device, session.batch)
    cache = StaticCache(config=model.config, max_cache_len=session.max_cache_len)
    with torch.no_grad():
        model(input_ids=prompt, use_cache=True, cache_position=torch.arange(session.prompt_len, device=session.device),
              **{session.cache_kwarg: cache})
    synchronize(session.device)
    return cache


def holder_step(session: DecodeSession, holder: CacheHolder, model: torch.nn.Module | None = None) -> StepFn:
    """The session's decode step (same signature and output as ``session.step_fn()``) on ``holder.cache``."""
    model = model if model is not None else session.model
    extra = session.step_kwargs

    def decode_step(input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=input_ids, cache_position=cache_position, use_cache=True,
                    **{session.cache_kwarg: holder.cache}, **extra(input_ids, cache_position))
        return out.logits[:, -1, :]

    return decode_step
