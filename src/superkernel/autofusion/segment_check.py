"""The last check of a planned segment: the frozen compile with the planner's rewrites against the same
segment compiled frozen without them, both as Inductor compiled them, timed alternately on real inputs.

A candidate's own measurement (:mod:`superkernel.autofusion.compiled_timing`) times its GEMMs alone;
inside the segment a rewrite can cost elsewhere (a split output that an epilogue fusion or a
consumer no longer gets contiguous). The rewrites are kept only when the whole segment is measured
faster beyond noise (the same rule as a candidate's: :func:`superkernel.autofusion.calibrate.faster`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

#: rounds of calls per side: a decode segment call is 0.1-1 ms on CPU
ROUNDS = 21
CALLS = 5


def check(rewritten: Callable[..., Any], compile_without: Callable[[], Callable[..., Any]],
          args: list[Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    """(the compile to keep, the record): ``rewritten`` when measured faster than ``compile_without()``."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from superkernel.autofusion.calibrate import clock, faster, paired

    without = compile_without()
    now, clock_name = clock()
    with unset_fake_temporarily(), torch.no_grad():
        got = paired(lambda: without(*args), lambda: rewritten(*args), now, ROUNDS, CALLS)
    got["clock"] = clock_name
    keep = faster(got)
    got["kept"] = "with the rewrites" if keep else "without the rewrites"
    return (rewritten if keep else without), got
