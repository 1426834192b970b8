"""The shape of one row of the realization table: a :class:`Realization` class, and what it is handed.

A row is made per compiled graph (``cls(context)``) and asked for one callable per partition:
:meth:`~Realization.segment`, :meth:`~Realization.unscoped`, :meth:`~Realization.cut`. Each
request comes with a :class:`Job`: the partition, its explain record, its flat program, and
the guard (``job.guarded``, ``job.fallback``) the pipeline's ``Realizer`` owns. The class
methods answer, before anything is realized, what other stages need to know: the
decompositions capture applies, whether partitions are compiled by Inductor, whether the
graph's native modules can be packaged, and the extra cut rule segmentation applies.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, ContextManager, Protocol

import torch
import torch.fx as fx

from superkernel.config import CompilerConfig
from superkernel.ir.graph import SegmentInfo
from superkernel.runtime.realizations.static import NullStaticCompiler, StaticCompilerSeam

Program = Callable[..., Any]


class PartitionLike(Protocol):
    """One partition as a standalone graph (``superkernel.pipeline.partition.PartitionModule``)."""

    partition: Any  # superkernel.ir.graph.Partition: kind, scope, options, name
    gm: fx.GraphModule
    inputs: list[fx.Node]

    @property
    def example_inputs(self) -> list[Any]: ...

    @property
    def mutated_inputs(self) -> list[int]: ...


class Job(Protocol):
    """One partition to realize, with the guard around it (implemented by the pipeline's Realizer)."""

    module: PartitionLike
    info: SegmentInfo | None  # the segment's explain record (None for unscoped runs and cuts)

    def flat(self) -> Program:
        """Operator by operator: the partition's straight-line ATen program (built on first use)."""
        ...

    def guarded(self, build: Callable[[], tuple[Program, str]], fallback: Callable[[], Program]) -> Program:
        """``build()`` -> (callable, realization label); if it raises, ``fallback()`` with one warning."""
        ...

    def fallback(self, exc: BaseException, realization: str = "eager") -> None:
        """Report that the partition runs its fallback (a warning; ``strict-scope-check=abort`` raises)."""
        ...


@dataclass
class GraphContext:
    """Everything about one compiled graph a realization may use, built by the backend and handed down."""

    config: CompilerConfig
    device: str
    counters: Counter[str] = field(default_factory=Counter)
    static: StaticCompilerSeam = field(default_factory=NullStaticCompiler)
    #: the real example inputs Dynamo gave the backend for this graph (None when not known,
    #: e.g. a precompiled frame); matched to the ATen graph's placeholders before any use
    real_inputs: list[Any] | None = None
    #: what outlives one graph and belongs to the backend (e.g. the CUDA graph memory pool its graphs share)
    shared: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def inference_graph() -> bool:
        """The graph being compiled is an inference graph: AOTAutograd says no output requires grad."""
        infos = getattr(_fw_metadata(), "output_info", None)
        return infos is not None and not any(getattr(o, "requires_grad", False) for o in infos)

    @staticmethod
    def training_graph() -> bool:
        """The graph is the forward of a training step (an output requires grad)."""
        return any(getattr(o, "requires_grad", False) for o in getattr(_fw_metadata(), "output_info", None) or ())

    @staticmethod
    def static_input_indices() -> list[int]:
        """Positions of Dynamo's static inputs (parameters, buffers) among the graph's inputs."""
        return list(getattr(_fw_metadata(), "static_input_indices", None) or ())


def _fw_metadata() -> Any:
    return getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)


class Realization:
    """One row of the table: how partitions of one (mode, device) become callables.

    Subclasses override what differs; the defaults run every partition operator by operator.
    """

    #: one line for docs and errors
    summary: ClassVar[str] = "operator by operator"

    def __init__(self, context: GraphContext) -> None:
        self.context = context
        self.config = context.config
        self.counters = context.counters

    # -- questions other stages ask before a graph is realized ------------------------------------
    @classmethod
    def decompositions(cls, config: CompilerConfig) -> dict[Any, Any] | None:
        """The decomposition table capture (AOTAutograd) applies; None: ATen as Dynamo traced it."""
        return None

    @classmethod
    def tracing(cls, config: CompilerConfig) -> ContextManager[Any]:
        """Settings in force while capture (AOTAutograd) traces the graph with :meth:`decompositions`
        (some decompositions read compiler settings at trace time)."""
        return contextlib.nullcontext()

    @classmethod
    def compiles(cls, config: CompilerConfig) -> bool:
        """Whether partitions are compiled by TorchInductor (else static kernels only record shapes)."""
        return False

    @classmethod
    def packs_native(cls, config: CompilerConfig, device: str) -> bool:
        """Whether graphs become native CPU modules a static-kernel package carries."""
        return False

    @classmethod
    def cut_reason(cls, node: fx.Node) -> str | None:
        """An extra reason ``node`` cannot run inside a segment of this realization (None: no objection)."""
        return None

    @classmethod
    def splits_unscoped(cls, config: CompilerConfig) -> bool:
        """Whether unscoped operators that break this row's step (host syncs, CPU work in a CUDA graph)
        are cut out of the unscoped runs too (rows that capture the whole step)."""
        return False

    # -- one callable per partition ----------------------------------------------------------------
    def segment(self, job: Job) -> Program:
        """A scope segment (the one unit superkernel fuses)."""
        if job.info is not None:
            job.info.realization = "eager"
        return job.flat()

    def unscoped(self, job: Job) -> Program:
        """Operators outside every scope."""
        return job.flat()

    def cut(self, job: Job) -> Program:
        """An operator cut out of its scope: alone, operator by operator."""
        return job.flat()

    def step(self, gm: fx.GraphModule, modules: list[Any], callables: list[Program], info: Any,
             problem: Callable[[str, list[Any]], None]) -> Program | None:
        """The graph's whole step from its partitions' callables, when this row makes it itself (the CUDA
        rows: one CUDA graph per run between cuts); None: the pipeline assembles the calls in order.
        ``problem(text, modules)``: report that these partitions cannot run as planned (a warning, or an
        error under ``strict-scope-check=abort``)."""
        return None

    def finish(self) -> None:
        """Build what is still pending for the graph, now rather than at the first call."""
