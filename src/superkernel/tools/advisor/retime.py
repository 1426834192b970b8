"""The search's timer (auto, and a named strategy's showdown): kept compiled candidates timed again, interleaved with plain torch.compile.

Each candidate lives on its own copy of the decode session (model, cache, scopes applied) and
was compiled from its own code object (:func:`~superkernel.tools.advisor.compiling.own_code`),
so compiling the next plan leaves it valid: no recompile, no ``torch._dynamo.reset()``.
A round runs every named candidate's whole decode (warm-up + timed steps) once and takes its
median step; the order rotates from round to round so no candidate always follows the same one.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from superkernel.timing import interleave
from superkernel.tools.decode import DecodeSession, run_decode
from superkernel.tools.advisor.search import BASELINE, EAGER


def session_copy(session: DecodeSession) -> DecodeSession:
    """A deep copy (model, cache and its post-prefill snapshot): a plan's scopes and compiled step stay on it."""
    return copy.deepcopy(session)


class Interleaved:
    """:class:`~superkernel.tools.advisor.search.Timer` over real compiled steps."""

    def __init__(self, session: DecodeSession, baseline_step: Any, eager_step: Any = None):
        self.steps: dict[str, tuple[DecodeSession, Any]] = {BASELINE: (session, baseline_step)}
        if eager_step is not None:
            self.steps[EAGER] = (session, eager_step)

    def add(self, name: str, session: DecodeSession, step: Any) -> None:
        self.steps[name] = (session, step)

    def retime(self, names: list[str], rounds: int) -> dict[str, list[float]]:
        """One whole decode per name and round (:func:`superkernel.timing.interleave`: the order rotating)."""
        order = [BASELINE] + [n for n in names if n != BASELINE]
        return dict(zip(order, interleave([functools.partial(self._median_ms, n) for n in order], rounds)))

    def _median_ms(self, name: str) -> float:
        session, step = self.steps[name]
        return run_decode(session, step).median_ms

    def release(self, name: str) -> None:
        if name not in (BASELINE, EAGER):
            self.steps.pop(name, None)

    def close(self) -> None:
        self.steps.clear()
