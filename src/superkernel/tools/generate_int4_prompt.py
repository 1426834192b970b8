"""``generate()``'s prompt under a max-autotune plan on an int4 model: superkernel's int4 kernel, not ATen's loop.

transformers runs the prompt (prefill) uncompiled, where torchao's CPU int4 linear calls ATen's float32
``_weight_int4pack_mm_for_cpu``, a reference loop (:mod:`superkernel.runtime.cpu.int4_eager` has the figures).
:func:`install` puts a forward pre-hook and an always-called forward hook on the model: its uncompiled calls run in
an :class:`~superkernel.runtime.cpu.int4_eager.Int4Kernel` mode; inside a compile (the decode step, traced by Dynamo)
both hooks do nothing. ``apply_for_generate`` installs it for max-autotune plans only: a reduce-overhead plan's
prompt stays eager's, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

#: where :func:`install` keeps its hooks and its count of routed calls on the model
ATTR = "_superkernel_int4_prompt_kernel"


class Int4PromptKernel:
    """The hooks on one model; ``routed``: the int4 calls its prompts sent to the kernel."""

    def __init__(self, model: Any) -> None:
        self.routed = 0
        self._modes: list[Any] = []
        self._handles = [model.register_forward_pre_hook(self._enter),
                         model.register_forward_hook(self._leave, always_call=True)]

    def _enter(self, module: Any, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        from superkernel.runtime.cpu.int4_eager import Int4Kernel

        mode = Int4Kernel()
        mode.__enter__()
        self._modes.append(mode)

    def _leave(self, module: Any, args: Any, out: Any) -> None:
        if torch.compiler.is_compiling() or not self._modes:
            return
        mode = self._modes.pop()
        mode.__exit__(None, None, None)
        self.routed += mode.routed

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def install(model: Any) -> None:
    """On a model with torchao CPU int4 weights, where this CPU has superkernel's vector int4 kernel."""
    if not any(type(p).__name__ == "Int4OpaqueTensor" for p in model.parameters()):
        return
    from superkernel.runtime.cpu import int4_eager

    if int4_eager.available():
        setattr(model, ATTR, Int4PromptKernel(model))


def remove(model: Any) -> None:
    if hasattr(model, ATTR):
        getattr(model, ATTR).remove()
        delattr(model, ATTR)


__all__ = ["ATTR", "Int4PromptKernel", "install", "remove"]
