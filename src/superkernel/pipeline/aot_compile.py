"""A superkernel backend under Dynamo's AOT compile (``torch.compile(...).aot_compile``, vLLM's default path).

Dynamo's AOT compile calls the backend with AOTAutograd's cache forced on and bundled
(``torch._functorch.config``: ``force_autograd_cache``, ``bundled_autograd_cache``), so that the compiled
forward can be serialized: AOTAutograd then insists that the forward compiler returned Inductor's
``OutputCode`` and fails on anything else (``AssertionError: expected OutputCode, got GraphModule``). A
superkernel step is Python callables around native and Inductor modules, not one ``OutputCode``, so:

* :func:`plain_autograd_cache` runs our capture with those two settings off (AOTAutograd compiles as in a
  plain ``torch.compile``; nothing is written to or read from its cache for this graph);
* :func:`serializable` hands Dynamo the step as the ``SerializableCallable`` it requires; serializing it raises
  :class:`NotSerialized` with the reason (vLLM catches that, logs "unable to save AOT compiled function" and
  serves; the next start compiles again -- superkernel's own static-kernel packages are the cache that works).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

_FORCED = ("force_autograd_cache", "bundled_autograd_cache")


class NotSerialized(RuntimeError):
    """A superkernel step cannot go into Dynamo's AOT artifact."""


def under_aot_compile() -> bool:
    """True while Dynamo's AOT compile (or a caller imitating it) forces AOTAutograd's bundled cache."""
    import torch._functorch.config as cfg

    return any(bool(getattr(cfg, name, False)) for name in _FORCED)


@contextlib.contextmanager
def plain_autograd_cache(active: bool) -> Iterator[None]:
    if not active:
        yield
        return
    import torch._functorch.config as cfg

    with cfg.patch({name: False for name in _FORCED if hasattr(cfg, name)}):
        yield


def serializable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as Dynamo's ``SerializableCallable`` (``fn`` itself where this torch has no such class)."""
    try:
        from torch._dynamo.aot_compile_types import SerializableCallable
    except ImportError:  # torch without AOT compile
        return fn

    class SuperKernelStep(SerializableCallable):
        def __init__(self, step: Callable[..., Any]) -> None:
            self.step = step

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self.step(*args, **kwargs)

        @classmethod
        def serialize_compile_artifacts(cls, fn: Any) -> bytes:
            raise NotSerialized("a superkernel step is not serialized into Dynamo's AOT artifact (its parts are "
                                "native and Inductor modules held in memory); the next process compiles it again, "
                                "or loads them from a superkernel static-kernel package")

        @classmethod
        def deserialize_compile_artifacts(cls, data: bytes) -> Any:
            raise NotSerialized("superkernel wrote no AOT artifact to load")

    return SuperKernelStep(fn)


__all__ = ["NotSerialized", "plain_autograd_cache", "serializable", "under_aot_compile"]
