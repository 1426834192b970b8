"""superkernel inside vLLM (issue 60; docs/vllm.md).

vLLM takes a compile backend by qualified name; give it one of superkernel's plans::

    LLM(model=..., compilation_config={"mode": 2,
        "backend": "superkernel.integrations.vllm.backends.decoder_layer"})

``mode`` 2 is vLLM's ``DYNAMO_TRACE_ONCE`` (Dynamo traces the model's forward once, the backend compiles that
graph; vLLM's own piecewise backend is mode 3). The modules, one job each:

* :mod:`.scopes` -- scopes on vLLM's own model classes by module path (``attention``, ``mlp``,
  ``decoder_layer``, ``all_layers``, ``full_model``), put on the traced graph from the module paths Dynamo
  records, so vLLM's model code is not touched;
* :mod:`.fallback` -- a graph that fails to compile runs as Dynamo traced it, with one warning naming the scope
  and the reason: the engine keeps serving;
* :mod:`.backend` -- :class:`~.backend.VllmBackend`, the superkernel backend with both of the above;
* :mod:`.backends` -- the plans by name, the attributes vLLM resolves (``<strategy>`` for reduce-overhead,
  ``<strategy>_max_autotune``, ``from_env``).
"""

from __future__ import annotations

__all__ = ["backend", "backends", "fallback", "scopes"]
