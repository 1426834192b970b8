"""Does a model build its default attention mask from the cache's length? Measured in eager.

Some models (the BERT family's decoders: RemBERT, RoFormer, BigBird, Megatron-BERT) build
``torch.ones(batch, past + seq)`` when no ``attention_mask`` is given, with ``past`` read from
the cache (``StaticCache.get_seq_length()``, a tensor). Compiled, that length is a
data-dependent value (captured with ``capture_scalar_outputs``): the mask gets an unbacked
size, Dynamo resolves the branches on it for one value (``masking_utils`` pads a shorter 2-D
mask to the cache's length; the traced graph assumes it already is that long) and the step
fails at run time (``IndexError``) or at trace time (a broadcast of the scores, ``[.., 27]``,
with the mask, ``[.., 21]``). Without capturing it the length is a constant that changes every
step: a recompile per step.

``generate()`` never takes that path: it always passes a mask, and for a static cache turns it
into one as long as the cache. The decode harness does the same for the models that need it:
:func:`default_mask_grows` watches one eager step per position for a 2-D ``torch.ones`` of
``[batch, position + 1]``, growing with the position, and the session then passes a
full-length all-ones mask (what ``masking_utils`` pads a shorter one to; the model computes
the same: ``decode.prepare`` keeps the mask only if the greedy tokens stay the same).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

_FACTORIES = (torch.ones,)


class _RecordOnes(TorchFunctionMode):
    """Records the sizes of 2-D ``torch.ones`` calls made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[tuple[int, ...]] = []

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _FACTORIES:
            size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
            size = kwargs.get("size", size)
            try:
                dims = tuple(int(d) for d in size)
            except (TypeError, ValueError):
                dims = ()
            if len(dims) == 2:
                self.sizes.append(dims)
        return func(*args, **kwargs)


def takes_attention_mask(model: torch.nn.Module) -> bool:
    try:
        return "attention_mask" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def default_mask_grows(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                       inputs: list[tuple[torch.Tensor, torch.Tensor]], batch: int) -> bool:
    """Whether every eager ``step(ids, position)`` builds a ``torch.ones(batch, position + 1)``.

    ``inputs``: the (ids, cache_position) of consecutive decode steps from the restored cache
    (two or more tell growth from a size that only happens to match once).
    """
    if not inputs:
        return False
    with torch.no_grad():
        for ids, pos in inputs:
            recorder = _RecordOnes()
            with recorder:
                step(ids, pos)
            if (batch, int(pos[-1]) + 1) not in recorder.sizes:
                return False
    return True
