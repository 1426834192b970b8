"""Is a peer (a baseline such as torch.compile) right on this round? Checked every round, not once.

A peer's time means nothing when its output is wrong, and a wrong peer can be right once:
a compiled step that folds state it should read (Inductor freezing treating a KV cache as
a constant is the known case) gives the right logits on the cache it was compiled with
and wrong ones on the next. So every timed round of every peer is compared with eager
(the uncompiled model fed the same tokens), and a peer wrong on any round is marked
wrong and never used as a baseline without a flag.

The rule is the max-autotune one (docs/workflow.md, "Precision") against eager, with a
tolerance per dtype: a correct compiled peer differs from eager by rounding only, a wrong
one by a sizeable fraction of the logit scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from superkernel.tools.advisor.precision import DTYPE_TOLERANCE, MAX_AUTOTUNE_TOLERANCE, Diff, allowed_abs, compare


def peer_tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance against eager per dtype: max-autotune's (``precision.DTYPE_TOLERANCE``); for a model,
    quantization included, ``precision.default_tolerance(model)``."""
    return DTYPE_TOLERANCE.get(str(dtype).replace("torch.", ""), MAX_AUTOTUNE_TOLERANCE)


@dataclass
class PeerCheck:
    """A peer's agreement with eager over every round it ran."""

    tolerance: float
    rounds: int = 0
    wrong_rounds: list[int] = field(default_factory=list)   # 0-based round numbers
    worst: Diff | None = None
    limit: float | None = None                                # the absolute bound of the last check

    @property
    def wrong(self) -> bool:
        return bool(self.wrong_rounds)

    def check(self, logits: torch.Tensor, eager_logits: torch.Tensor) -> bool:
        """Record one round; True when it agrees with eager within the tolerance."""
        diff = compare(logits, eager_logits)
        self.limit = allowed_abs(eager_logits, self.tolerance)
        ok = diff.max_abs <= self.limit
        if not ok:
            self.wrong_rounds.append(self.rounds)
        if self.worst is None or diff.max_abs > self.worst.max_abs:
            self.worst = diff
        self.rounds += 1
        return ok

    def summary(self) -> str:
        """One cell for a table: ``ok (n rounds)`` or ``WRONG in rounds 2, 3 of 3 (max abs diff 0.69)``."""
        if self.rounds == 0:
            return "-"
        worst = self.worst.max_abs if self.worst is not None else float("nan")
        if not self.wrong:
            return f"ok ({self.rounds} rounds, max abs diff {worst:.2g})"
        listed = ", ".join(str(r + 1) for r in self.wrong_rounds)
        return (f"WRONG in round(s) {listed} of {self.rounds} (max abs diff {worst:.3g} > {self.limit:.3g}, "
                f"top-1 {self.worst.top1_agreement:.0%})")

    def to_dict(self) -> dict:
        return {"tolerance": self.tolerance, "rounds": self.rounds, "wrong_rounds": [r + 1 for r in self.wrong_rounds],
                "wrong": self.wrong, "max_abs_diff": self.worst.max_abs if self.worst else None,
                "top1_agreement": self.worst.top1_agreement if self.worst else None, "limit": self.limit}
