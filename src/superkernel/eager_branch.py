"""transformers' one-token GQA attention: the branch eager takes, while a compile that must match eager traces.

transformers' SDPA attention (5.2x) packs a one-token query's heads onto the key/value heads (``pack_gqa``) in
eager, but repeats K and V under Dynamo: its test is ``q_length == 1 and not is_torchdynamo_compiling()``
(``transformers/integrations/sdpa_attention.py``). The two orders round differently, so a captured decode step
of a GQA model could never be bit-identical to the eager model, and W8A8's per-token activation quantization
turns that last-bit difference into a visible one (a 24-layer step's logits 0.14 apart, top-1 0.75). While a
reduce-overhead compile or an exactness reference traces, that one test reads "not compiling", so the graph
computes what eager computes. Every other compile in the process (max-autotune, torch.compile's own, another
backend) traces as before, and outside a compile the test answers what it always did.

Whoever traces for superkernel says so: the backend's compile-start callback (``pipeline.tracing``) and the
AOT precompile of a frame (``static_kernel.frames``, :func:`traced_for`).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from typing import Any, Iterator

import torch

#: transformers' module holding the test, and the name of the test
MODULE, TEST = "transformers.integrations.sdpa_attention", "is_torchdynamo_compiling"

_config: contextvars.ContextVar[Any] = contextvars.ContextVar("superkernel_tracing_config", default=None)
_installed = False


def tracing_for(config: Any) -> contextvars.Token:
    """A superkernel compile with ``config`` traces from now until :func:`done` with the returned token."""
    return _config.set(config)


def done(token: contextvars.Token) -> None:
    try:
        _config.reset(token)
    except ValueError:  # set in another context (a compile started in one task, ended in another): just clear it
        _config.set(None)


@contextlib.contextmanager
def traced_for(config: Any) -> Iterator[None]:
    """The block traces for a superkernel compile with ``config`` (an AOT precompile: no compile-start callback)."""
    install()
    token = tracing_for(config)
    try:
        yield
    finally:
        done(token)


def _wanted() -> bool:
    """Whether the compile tracing now must compute what eager does (reduce-overhead, or an exactness reference)."""
    cfg = _config.get()
    if cfg is None:
        return False
    from superkernel.config import REDUCE_OVERHEAD

    return cfg.mode == REDUCE_OVERHEAD or bool(cfg.debug.run_eagerly)


# evaluated while Dynamo traces and kept as a constant without a guard: the answer belongs to the compile, not to
# the call (a guard on it would fail on every later call, which runs outside the compile)
_wanted_while_tracing = torch._dynamo.assume_constant_result(_wanted)


def compiling_unless_eager_branch() -> bool:
    """transformers' ``is_torchdynamo_compiling`` for its SDPA attention module, but False while a superkernel
    compile that must match eager traces."""
    return torch.compiler.is_compiling() and not _wanted_while_tracing()


def install() -> None:
    """Put :func:`compiling_unless_eager_branch` in transformers' SDPA attention module, once that module is loaded
    (until then each call looks again: a dict lookup); a transformers without the ``pack_gqa`` branch is left as
    it is. Called on every superkernel call: once done, a global read."""
    global _installed
    if _installed:
        return
    module = sys.modules.get(MODULE)
    if module is None:
        return
    _installed = True
    if hasattr(module, "pack_gqa") and callable(getattr(module, TEST, None)):
        setattr(module, TEST, compiling_unless_eager_branch)
