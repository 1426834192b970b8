"""graph-autofusion for PyTorch graphs: a planner over each CPU max-autotune segment's ATen graph.

Rules (one per module under :mod:`superkernel.autofusion.rules`), a benefit model with a per-core
cache capacity limit (:mod:`~superkernel.autofusion.benefit`), calibration by measurement at the real
shapes (:mod:`~superkernel.autofusion.calibrate`, cached by :mod:`~superkernel.autofusion.store`), and
one recorded decision per candidate (:mod:`~superkernel.autofusion.decision`), shown by ``explain()``.
Enabled by ``inductor.autofusion`` (see docs/autofusion_torch.md).
"""

from superkernel.autofusion.decision import Decision, describe
from superkernel.autofusion.planner import Planner

__all__ = ["Decision", "Planner", "describe"]
