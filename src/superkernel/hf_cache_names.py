"""The names transformers passes a decode cache under, across its versions.

Before 5.24 a causal LM's forward took its cache as ``past_key_values`` (``cache_params`` for
Mamba-style models, ``cache`` for XLM) and returned it under the same name. From 5.24 every
forward takes and returns ``cache``; the old names are deprecated aliases (removed in 5.40) that
warn on every use. Code that passes or reads a cache asks here instead of naming one.
"""

from __future__ import annotations

import inspect
from typing import Any

#: Keywords a forward may take its cache under, in the order they are looked for.
CACHE_KEYWORDS = ("past_key_values", "cache_params", "cache")


def cache_keyword(model: Any) -> str:
    """The keyword of :data:`CACHE_KEYWORDS` the model's forward takes (``past_key_values`` if none)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return CACHE_KEYWORDS[0]
    return next((name for name in CACHE_KEYWORDS if name in params), CACHE_KEYWORDS[0])


def output_cache(output: Any) -> Any:
    """The cache a model output holds (``cache`` from transformers 5.24, else an older name), or None.

    Reading ``output.past_key_values`` on 5.24 works but logs a deprecation warning; the output's
    keys are what it really holds (a None field is not among them)."""
    keys = output.keys() if hasattr(output, "keys") else ()
    return next((output[name] for name in ("cache", *CACHE_KEYWORDS) if name in keys), None)
