"""The static cache's length under a plan: a call longer than all before it gets a power of two, so that the calls
after it rarely compile the step again.

A compiled decode step is specialized to the static cache's shape. transformers sizes that cache to the call's
``prompt + max_new_tokens - 1``, at least the largest length of an earlier call on the model, so every call longer
than all before it compiled the step again: 22-60 s for SmolLM2-135M's plans, at every turn of a chat whose prompt
grows. Under a plan such a call (one that compiles anyway) gets the power of two at or above its length (capped at
the model's ``max_position_embeddings`` where that still holds the call), so the next compile comes only when a call
doubles it; the first call, and every call within the longest before it, keep transformers' length. Rounding every
call instead was measured and rejected: attention reads the whole static cache, so a longer cache costs every step
-- SmolLM2-135M's int8-weight max-autotune step at 1 thread, 69 positions 39.1 ms, 128: 44.3, 256: 50.9, 512: 58.3,
1024: 70.4 ms (``benchmarks/results/generate_cache_length_smollm2-135m_int8-weight_max-autotune.md``).

``max_cache_len`` (``apply_for_generate``): the smallest length every call gets (transformers' own
``generation_config.max_cache_len``): a server that knows its longest request sizes the cache once.

The rounding sits in the model's ``_prepare_static_cache`` (transformers' method that builds the cache, given the
length; ``_previous_max_cache_length`` is where it keeps the longest so far), overridden on this model instance only
and removed by :func:`remove`; where transformers has no such method, lengths are transformers' own.
"""

from __future__ import annotations

import types
from typing import Any

#: the method of transformers' ``GenerationMixin`` that builds a static cache of a given length
_METHOD = "_prepare_static_cache"
#: where :func:`install` keeps the generation config's ``max_cache_len`` it replaced
_BEFORE = "_superkernel_max_cache_len_before"


def bucket(length: int, ceiling: int | None = None) -> int:
    """The power of two at or above ``length``; ``ceiling`` (the model's positions) instead when that lies between."""
    rounded = 1 << max(0, int(length) - 1).bit_length()
    return ceiling if ceiling is not None and length <= ceiling < rounded else rounded


def _prepare_bucketed(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' method, a call longer than all before it rounded up (bound to the model: ``copy.deepcopy``
    rebinds it to the copy)."""
    longest = getattr(self, "_previous_max_cache_length", None)
    wanted = kwargs.get("max_cache_len")
    if isinstance(wanted, int) and isinstance(longest, int) and wanted > longest > 0:  # compiles anyway: headroom
        ceiling = getattr(self.config.get_text_config(decoder=True), "max_position_embeddings", None)
        kwargs["max_cache_len"] = bucket(wanted, ceiling if isinstance(ceiling, int) else None)
    return getattr(type(self), _METHOD)(self, *args, **kwargs)


def install(model: Any, max_cache_len: int | None = None) -> None:
    """Round the static cache's length of ``model``'s calls that grow it; ``max_cache_len``: the least length of every
    call (an earlier install is undone first)."""
    remove(model)
    if max_cache_len is not None:
        setattr(model, _BEFORE, getattr(model.generation_config, "max_cache_len", None))
        model.generation_config.max_cache_len = max_cache_len
    if callable(getattr(type(model), _METHOD, None)):
        setattr(model, _METHOD, types.MethodType(_prepare_bucketed, model))


def remove(model: Any) -> None:
    """Undo :func:`install`: transformers' lengths, the generation config's ``max_cache_len`` as it was."""
    model.__dict__.pop(_METHOD, None)
    if hasattr(model, _BEFORE):
        model.generation_config.max_cache_len = getattr(model, _BEFORE)
        delattr(model, _BEFORE)


__all__ = ["bucket", "install", "remove"]
