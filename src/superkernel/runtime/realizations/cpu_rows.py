"""reduce-overhead on CPU: one native call per segment (the same ATen operators, called from C++)."""

from __future__ import annotations

from typing import Any

from superkernel.config import CompilerConfig
from superkernel.ir.graph import SuperKernelScopeError
from superkernel.runtime.realizations.base import Job, Program, Realization


class CpuNative(Realization):
    """A segment runs as one native call running its ATen program from C++ (``cpu-native``); the
    flat Python program with ``cpu.native`` off, for what the emitter cannot express, or when the
    build fails (``cpu-flat``). Unscoped runs are called from the graph's native module too (same
    operators, same order), without superkernel treatment. Bit-identical to the eager reference."""

    summary = "one native call per segment (cpu-native), else the flat program (cpu-flat)"

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._native: Any = None  # NativeGroup of this graph's native segments, built as one module

    @classmethod
    def packs_native(cls, config: CompilerConfig, device: str) -> bool:
        return device == "cpu" and bool(config.cpu.native) and not config.debug.run_eagerly

    def segment(self, job: Job) -> Program:
        flat = job.flat()
        if not self.config.cpu.native:
            self.counters["segments_flat"] += 1
            _label(job, "cpu-flat")
            return flat
        group = self._group()

        def failed(exc: BaseException) -> None:  # the build failed at the first call: flat, reported
            self.counters["segments_native"] -= 1
            self.counters["segments_flat"] += 1
            job.fallback(exc, realization="cpu-flat")

        try:
            segment = group.add(job.module.partition.name, job.module.gm, flat, on_failure=failed,
                                inference=self.context.inference_graph())
        except SuperKernelScopeError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. an operator the emitter cannot express: flat, reported
            from superkernel.runtime.realizations.collectives import describe_cpu_collectives

            self.counters["segments_flat"] += 1
            job.fallback(describe_cpu_collectives(job.module.gm, exc), realization="cpu-flat")
            return flat
        self.counters["segments_native"] += 1
        _label(job, "cpu-native")
        return segment

    def unscoped(self, job: Job) -> Program:
        """Still operator by operator; the native module only calls them from C++ instead of Python.
        Anything it cannot express, or a failed build, runs the flat program without a warning: no
        segment was asked for here."""
        flat = job.flat()
        if self.context.device != "cpu" or not self.config.cpu.native:
            return flat
        from superkernel.runtime.cpu.native import NativeUnsupported

        try:
            return self._group().add(job.module.partition.name, job.module.gm, flat,
                                     inference=self.context.inference_graph())
        except NativeUnsupported:
            return flat

    def _group(self) -> Any:
        """This graph's NativeGroup; with static kernels, its module comes from the package (or is packaged)."""
        if self._native is None:
            from superkernel.runtime.cpu.native import NativeGroup

            self._native = NativeGroup(provider=self.context.static.native_provider(self.context.device))
        return self._native

    def finish(self) -> None:
        if self._native is not None:
            self._native.build()


def _label(job: Job, realization: str) -> None:
    if job.info is not None:
        job.info.realization = realization
