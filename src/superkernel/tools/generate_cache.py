"""The static cache's length under a plan: a power of two, so that a longer ``generate()`` rarely compiles again.

A compiled decode step is specialized to the static cache's shape. transformers sizes that cache to the call's
``prompt + max_new_tokens`` (at least the largest length of an earlier call on the model), so every call longer
than all before it compiled the step again: 22 s for SmolLM2-135M's float32 reduce-overhead plan, at every turn of
a chat whose prompt grows. Under a plan the length is rounded up to a power of two (capped at the model's
``max_position_embeddings`` where that still holds the call): a call compiles again only when it doubles the
longest before it. The cost is attention over up to twice the positions: SmolLM2-135M's reduce-overhead step at 1
thread, 5 interleaved rounds, took 24.9 ms with the cache at the call's 69 positions, 24.4 / 24.9 / 25.0 ms at 128
/ 256 / 512 and 26.5 ms at 1024 (within the box's noise up to 512).

``max_cache_len`` (``apply_for_generate``): the smallest length every call gets (transformers' own
``generation_config.max_cache_len``): a server that knows its longest request sizes the cache once.

The rounding sits in the model's ``_prepare_static_cache`` (transformers' method that builds the cache, given the
length), overridden on this model instance only and removed by :func:`remove`; where transformers has no such
method, lengths are transformers' own.
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
    """transformers' method with the length rounded (bound to the model: ``copy.deepcopy`` rebinds it to the copy)."""
    if "max_cache_len" in kwargs:
        ceiling = getattr(self.config.get_text_config(decoder=True), "max_position_embeddings", None)
        kwargs["max_cache_len"] = bucket(kwargs["max_cache_len"], ceiling if isinstance(ceiling, int) else None)
    return getattr(type(self), _METHOD)(self, *args, **kwargs)


def install(model: Any, max_cache_len: int | None = None) -> None:
    """Round the static cache's length on ``model``; ``max_cache_len``: the least length of every call."""
    if max_cache_len is not None:
        if not hasattr(model, _BEFORE):
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
