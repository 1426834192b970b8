"""Precision verdicts: compare a plan's decode logits with the exactness reference and the eager model.

Rules (docs/workflow.md, "precision"):

* ``reduce-overhead`` (binary fusion) must be **bit-identical** to the exactness
  reference: ``torch.equal`` on the logits of every decode step.
* ``max-autotune`` (source fusion) may differ in the last bits: it passes when the
  max abs diff to the reference is at most ``tolerance * max(1, max|reference logits|)``.
  The default tolerance :data:`MAX_AUTOTUNE_TOLERANCE` = 1e-3 for float32 (see
  docs/workflow.md for why).
* The diff to the uncompiled model is reported for every plan and never decides the
  verdict: transformers takes other code paths under torch.compile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from superkernel.config import REDUCE_OVERHEAD

if TYPE_CHECKING:  # (torch is imported where logits are compared: the command line's parser reads this module)
    import torch

    from superkernel.tools.advisor.rounding_floor import RoundingFloor

#: Relative fp32 tolerance of max-autotune: fp32 rounding from reordered reductions stays
#: far below it (1e-6 relative on the zoo), while a semantic error moves logits by O(1).
MAX_AUTOTUNE_TOLERANCE = 1e-3

#: max-autotune's default tolerance per dtype (relative to the logit scale, as above). 16-bit floats round
#: at 2^-11 (float16) and 2^-8 (bfloat16) per operation, and a fused kernel keeps intermediates in float32
#: where eager rounds every operator: over a deep stack that moves logits by a few units of the rounding
#: (an H200 run of a 1B bf16 step, 2026-11-27: 0.15 on logits of scale ~3 for Inductor and superkernel
#: alike). A wrong result (a stale or frozen cache, a wrong kernel) moves them by O(0.1-1) of the scale.
DTYPE_TOLERANCE = {"float32": MAX_AUTOTUNE_TOLERANCE, "float16": 2e-2, "bfloat16": 1e-1}
#: W8A8 quantizes every activation per token: a last-bit difference upstream moves a value across an int8
#: rounding boundary, one step of 1/127 of the token's range, and that step propagates (llama-tiny: 8.7e-3
#: between two exact runs that differ by 4e-7 before quantization; docs/quantization.md). The least W8A8
#: tolerance: over a deep stack the workflow measures eager's own floor and widens it (rounding_floor.py).
W8A8_TOLERANCE = 5e-2
#: the attribute ``superkernel.tools.quantize.quantize_model`` leaves on a model: its scheme
QUANTIZATION_TAG = "_superkernel_quantization"


def measures_floor(model: object) -> bool:
    """Whether the workflow measures eager's rounding floor for ``model`` before judging plans: W8A8 models."""
    from superkernel.runtime.quant_schemes import scheme

    row = scheme(getattr(model, QUANTIZATION_TAG, None) or "")
    return row is not None and row.rounds_activations


def default_tolerance(model: object, floor: RoundingFloor | None = None) -> float:
    """max-autotune's tolerance for ``model``: by the dtype it computes in, looser for W8A8 (see above), and for
    W8A8 at least ``floor.widened`` (two of eager's measured rounding floors) when one is given."""
    dtype = next((str(p.dtype).replace("torch.", "") for p in model.parameters()  # type: ignore[attr-defined]
                  if p.is_floating_point()), "float32")
    tolerance = DTYPE_TOLERANCE.get(dtype, MAX_AUTOTUNE_TOLERANCE)
    if measures_floor(model):
        tolerance = max(tolerance, W8A8_TOLERANCE)
        if floor is not None:
            tolerance = max(tolerance, floor.widened)
    return tolerance


@dataclass(frozen=True)
class Diff:
    """How one run's logits differ from another's over all decode steps."""

    max_abs: float
    top1_agreement: float       # fraction of steps whose argmax token matches
    identical: bool             # torch.equal on all logits
    steps: int

    def to_dict(self) -> dict:
        return {"max_abs": self.max_abs, "top1_agreement": self.top1_agreement, "identical": self.identical,
                "steps": self.steps}


def compare(logits: torch.Tensor, reference: torch.Tensor) -> Diff:
    """Compare ``[steps, vocab]`` logits; shapes must match."""
    import torch

    if logits.shape != reference.shape:
        raise ValueError(f"logits shape {tuple(logits.shape)} differs from reference {tuple(reference.shape)}")
    diff = (logits.double() - reference.double()).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    if not torch.isfinite(logits).all():
        max_abs = float("inf")
    agree = (logits.argmax(-1) == reference.argmax(-1)).double().mean().item() if len(logits) else 1.0
    return Diff(max_abs=max_abs, top1_agreement=agree, identical=torch.equal(logits, reference), steps=len(logits))


@dataclass(frozen=True)
class Verdict:
    passed: bool
    rule: str           # what was required, in words
    reason: str         # why it passed or failed, with numbers


def allowed_abs(reference: torch.Tensor, tolerance: float) -> float:
    scale = max(1.0, float(reference.abs().max())) if reference.numel() else 1.0
    return tolerance * scale


def judge(mode: str, vs_reference: Diff, reference: torch.Tensor, tolerance: float = MAX_AUTOTUNE_TOLERANCE) -> Verdict:
    if mode == REDUCE_OVERHEAD:
        rule = "bit-identical to the exactness reference (torch.equal)"
        if vs_reference.identical:
            return Verdict(True, rule, "bit-identical on every decode step (max abs diff 0)")
        return Verdict(False, rule, f"not bit-identical: max abs diff {vs_reference.max_abs:.3g}, "
                                    f"top-1 agreement {vs_reference.top1_agreement:.0%}")
    limit = allowed_abs(reference, tolerance)
    rule = f"max abs diff to the exactness reference <= {limit:.3g} ({tolerance:g} x logit scale)"
    if vs_reference.max_abs <= limit:
        return Verdict(True, rule, f"max abs diff {vs_reference.max_abs:.3g} <= {limit:.3g}")
    return Verdict(False, rule, f"max abs diff {vs_reference.max_abs:.3g} > {limit:.3g}, "
                                f"top-1 agreement {vs_reference.top1_agreement:.0%}")
