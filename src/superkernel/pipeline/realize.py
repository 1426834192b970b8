"""Realize one partition of the graph as one callable: the graph's realization row, guarded.

Which callable a partition becomes is decided by one row of the realization table
(:mod:`superkernel.runtime.realizations`: (mode, device kind) -> :class:`Realization`; the
table and how to add a device are in docs/api.md). The :class:`Realizer` only guards: a
partition that fails to compile or capture falls back to running operator by operator,
alone, with one warning; ``strict-scope-check=abort`` raises instead.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from superkernel.ir.graph import SegmentInfo, SuperKernelScopeError
from superkernel.pipeline.partition import PartitionModule
from superkernel.runtime.realizations import GraphContext, Realization, realization_for
from superkernel.util import exception_summary

Program = Callable[..., Any]


class SuperKernelFallbackWarning(UserWarning):
    """A segment could not be compiled or captured and runs eagerly instead."""


class Realizer:
    """The callables of one graph's partitions, made by the graph's realization row."""

    def __init__(self, context: GraphContext, row: type[Realization] | None = None) -> None:
        self.context = context
        self.realization = (row or realization_for(context.config, context.device))(context)

    def realize(self, module: PartitionModule, info: SegmentInfo | None) -> Program:
        job = _Job(self, module, info)
        kind = module.partition.kind
        if kind == "cut":
            return self.realization.cut(job)
        if kind == "unscoped":
            return self.realization.unscoped(job)
        return self.realization.segment(job)

    def finish(self) -> None:
        """Build what is still pending (the graph's native module), now rather than at the first call."""
        self.realization.finish()

    def step(self, gm: Any, modules: list[PartitionModule], callables: list[Program], info: Any) -> Program | None:
        """The graph's step when the row makes it itself (CUDA: its graphs), else None."""
        return self.realization.step(gm, modules, callables, info, self.step_problem)

    def step_problem(self, text: str, modules: list[PartitionModule]) -> None:
        """Part of the step cannot run as planned (e.g. a CUDA graph that cannot be captured): one warning,
        or an error when one of its segments says ``strict-scope-check=abort``."""
        strict = [m.partition for m in modules if m.partition.kind == "segment" and m.partition.options.abort_on_cut]
        if strict:
            raise SuperKernelScopeError(f"strict-scope-check=abort: segment {strict[0].name!r} of scope "
                                        f"{strict[0].scope!r}: {text}")
        self.context.counters["step_fallbacks"] += 1
        warnings.warn(f"superkernel: {text}", SuperKernelFallbackWarning, stacklevel=3)

    def fallback(self, module: PartitionModule, info: SegmentInfo | None, exc: BaseException,
                 realization: str = "eager") -> None:
        part = module.partition
        cause = exception_summary(exc)
        where = f"segment {part.name!r} of scope {part.scope!r}" if part.scope else f"unscoped partition {part.name!r}"
        flat = realization != "eager"  # (still one segment: its flat ATen program, e.g. cpu-flat)
        if part.kind == "segment" and part.options.abort_on_cut:
            failed = "cannot run as a native module" if flat else "failed to compile/capture"
            raise SuperKernelScopeError(f"strict-scope-check=abort: {where} {failed}: {cause}") from exc
        if flat:
            warnings.warn(f"superkernel: {where} is not native; it runs as one flat ATen program ({realization}: "
                          f"same operators, not split, bit-exact): {cause}", SuperKernelFallbackWarning, stacklevel=4)
        else:
            warnings.warn(f"superkernel: {where} falls back to eager: {cause}", SuperKernelFallbackWarning,
                          stacklevel=4)
        self.context.counters["fallbacks"] += 1
        if info is not None:
            info.realization = realization
            info.fallback = cause


class _Job:
    """One partition handed to the realization row, with the Realizer's guard around it."""

    __slots__ = ("realizer", "module", "info", "_flat")

    def __init__(self, realizer: Realizer, module: PartitionModule, info: SegmentInfo | None) -> None:
        self.realizer, self.module, self.info = realizer, module, info
        self._flat: Program | None = None

    def flat(self) -> Program:
        """Operator by operator: the partition's straight-line ATen program (same kernels).
        Built only where it runs (generating it for a large partition takes a while)."""
        if self._flat is None:
            from superkernel.runtime.cpu.flat import flat_program

            self._flat = flat_program(self.module.gm)
        return self._flat

    def guarded(self, build: Callable[[], tuple[Program, str]], fallback: Callable[[], Program]) -> Program:
        """``build()``; if it fails, the fallback ``fallback()`` (with one warning)."""
        try:
            fn, realization = build()
        except SuperKernelScopeError:
            raise
        except Exception as exc:  # noqa: BLE001 - any compiler failure falls back, reported
            self.fallback(exc)
            return fallback()
        if self.info is not None:
            self.info.realization = realization
        return fn

    def fallback(self, exc: BaseException, realization: str = "eager") -> None:
        self.realizer.fallback(self.module, self.info, exc, realization)
