"""W8A8's rounding floor: how far eager's own logits move when its input moves by one unit in the last place.

W8A8 rounds every activation to 1/127 of its token's range. A last-bit difference upstream -- the kind any compiler
makes when it sums a norm's squares in another order -- moves some value across a rounding boundary, one int8 step
that the following layers carry; over a deep stack the logits move by a few percent of their scale (a 24-layer
Qwen2-0.5B-shaped model: 5.0e-2 for eager with its RMSNorm's sum reordered, 5.8-6.3e-2 for eager with its
embeddings moved one ulp, torch.compile and a correct max-autotune plan 4.9-5.1e-2; see
benchmarks/results/w8a8_floor_seeds.md and w8a8_gate_bench_qwen2_24l.md).
A fixed tolerance cannot tell a correct plan from eager's own rounding at that depth, so for a W8A8 model the
workflow measures the floor in the same run -- eager once more with the embeddings' output moved up or down one ulp
at random (seeded), fed the same tokens -- and judges max-autotune at ``max(W8A8 tolerance, FLOOR_FACTOR x floor)``
(:func:`superkernel.tools.advisor.precision.default_tolerance`). A wrong kernel moves logits by O(1) of their scale.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from superkernel.tools.decode import DecodeSession, run_decode

#: a plan may differ from the exactness reference by this many floors: the floor is one draw of the same
#: rounding noise a correct plan shows (three draws on the 24-layer model lie within 1.1x of each other)
FLOOR_FACTOR = 2.0
SEED = 0


@dataclass(frozen=True)
class RoundingFloor:
    """Eager against eager with its input one ulp off, on every decode step of the session."""

    max_abs: float
    relative: float             # max_abs / max(1, max |eager logits|): the unit the tolerance is in
    top1_agreement: float
    perturbed: str              # the module whose output was moved

    @property
    def widened(self) -> float:
        """The relative tolerance this floor asks for: ``FLOOR_FACTOR`` floors."""
        return FLOOR_FACTOR * self.relative

    def to_dict(self) -> dict:
        return {"max_abs": self.max_abs, "relative": self.relative, "top1_agreement": self.top1_agreement,
                "perturbed": self.perturbed, "factor": FLOOR_FACTOR}


def one_ulp_off(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``t`` with every element moved to its next float up or down (chosen at random)."""
    up = torch.rand(t.shape, generator=generator) < 0.5
    return torch.where(up.to(t.device), torch.nextafter(t, torch.full_like(t, float("inf"))),
                       torch.nextafter(t, torch.full_like(t, float("-inf"))))


@contextmanager
def embeddings_one_ulp_off(model: torch.nn.Module, seed: int = SEED) -> Iterator[str]:
    """While inside, the model's input embeddings return their output one ulp off (a forward hook, removed after)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if not isinstance(embeddings, torch.nn.Module):
        raise ValueError(f"{type(model).__name__} has no input embeddings module to perturb")
    generator = torch.Generator().manual_seed(seed)
    handle = embeddings.register_forward_hook(lambda module, args, out: one_ulp_off(out, generator))
    try:
        yield type(embeddings).__name__
    finally:
        handle.remove()


def rounding_floor(session: DecodeSession, eager_logits: torch.Tensor) -> RoundingFloor:
    """Decode the session once more in eager with the embeddings one ulp off; compare with ``eager_logits``."""
    with embeddings_one_ulp_off(session.model) as perturbed:
        logits = run_decode(session, session.step_fn()).logits
    max_abs = float((logits.double() - eager_logits.double()).abs().max())
    relative = max_abs / max(1.0, float(eager_logits.abs().max()))  # the logit scale, as precision.allowed_abs
    agree = float((logits.argmax(-1) == eager_logits.argmax(-1)).double().mean())
    return RoundingFloor(max_abs=max_abs, relative=relative, top1_agreement=agree, perturbed=perturbed)
