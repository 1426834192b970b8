"""graph-autofusion for PyTorch graphs: a planner over each CPU max-autotune segment's ATen graph.

Rules (one per module under :mod:`superkernel.runtime.inductor.autofusion.rules`), a benefit model with a per-core
cache capacity limit (:mod:`~superkernel.runtime.inductor.autofusion.benefit`), calibration by measurement at the real
shapes (:mod:`~superkernel.runtime.inductor.autofusion.calibrate`, cached by :mod:`~superkernel.runtime.inductor.autofusion.store`), and
one recorded decision per candidate (:mod:`~superkernel.ir.decision`), shown by ``explain()``.
Enabled by ``inductor.autofusion`` (see docs/autofusion_torch.md).
"""

from superkernel.ir.decision import Decision, describe
from superkernel.runtime.inductor.autofusion.planner import Planner

__all__ = ["Decision", "Planner", "describe"]
