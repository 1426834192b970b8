"""superkernel's plans for vLLM, by the qualified name vLLM's ``compilation_config["backend"]`` takes.

* ``superkernel.integrations.vllm.backends.<strategy>``: reduce-overhead (the same kernels, bit-exact);
* ``superkernel.integrations.vllm.backends.<strategy>_max_autotune``: TorchInductor per segment;
* ``superkernel.integrations.vllm.backends.from_env``: the plan in the environment of vLLM's worker processes:
  ``SUPERKERNEL_VLLM_STRATEGY`` (default ``decoder_layer``), ``SUPERKERNEL_VLLM_MODE`` (default
  ``reduce-overhead``), ``SUPERKERNEL_VLLM_OPTIONS`` (scope options, e.g. ``strict-scope-check=abort``),
  ``SUPERKERNEL_VLLM_UNFUSABLE`` (operators to register unfusable first, comma-separated: ``aten::embedding``).

``<strategy>`` is one of :data:`~superkernel.integrations.vllm.scopes.STRATEGIES`. Each backend is built on
first access, once per process (vLLM resolves the name in its worker).
"""

from __future__ import annotations

import os
from typing import Any

from superkernel.integrations.vllm.scopes import STRATEGIES

_made: dict[str, Any] = {}


def plan_of(name: str) -> tuple[str, str, str] | None:
    """(strategy, mode, options) of attribute ``name``, or None."""
    if name == "from_env":
        return (os.environ.get("SUPERKERNEL_VLLM_STRATEGY", "decoder_layer"),
                os.environ.get("SUPERKERNEL_VLLM_MODE", "reduce-overhead"),
                os.environ.get("SUPERKERNEL_VLLM_OPTIONS", ""))
    if name in STRATEGIES:
        return name, "reduce-overhead", ""
    if name.endswith("_max_autotune") and name[: -len("_max_autotune")] in STRATEGIES:
        return name[: -len("_max_autotune")], "max-autotune", ""
    return None


def __getattr__(name: str) -> Any:
    plan = plan_of(name)
    if plan is None:
        raise AttributeError(f"{__name__} has no plan {name!r}: use one of {', '.join(STRATEGIES)}, "
                             f"<strategy>_max_autotune or from_env")
    if name not in _made:
        from superkernel.integrations.vllm.backend import VllmBackend

        strategy, mode, options = plan
        if name == "from_env":
            from superkernel.pipeline.segments import register_unfusable

            for op in filter(None, (o.strip() for o in os.environ.get("SUPERKERNEL_VLLM_UNFUSABLE", "").split(","))):
                register_unfusable(op, "registered unfusable by SUPERKERNEL_VLLM_UNFUSABLE")
        _made[name] = VllmBackend(strategy, mode, options)
    return _made[name]


def __dir__() -> list[str]:
    return [*STRATEGIES, *(f"{s}_max_autotune" for s in STRATEGIES), "from_env"]
