"""The pipeline's data model, at the bottom of every other module.

Everything the stages hand to each other is defined here, so each stage imports this
module and none imports a later stage:

* scope annotations and their parsed options (:class:`ScopeOptions`, parsed once per
  distinct option string);
* :class:`Partition` / :class:`Segmentation` — what segmentation produces;
* :class:`Cut`, :class:`SegmentInfo`, :class:`GraphInfo`, :class:`Explanation` — what
  ``superkernel.explain()`` shows;
* :func:`device_kind` — the one place that decides which device a graph or a call runs on;
* :class:`SuperKernelScopeError`.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import torch
import torch.fx as fx
from torch._dynamo import exc as _dynamo_exc

# --- scope annotations ----------------------------------------------------------------

#: Key under ``node.meta["custom"]`` that holds a node's scope annotation.
ANNOTATION_KEY = "superkernel"

#: Allowed option keys and their allowed values; the first value is the default.
OPTION_VALUES: dict[str, tuple[str, ...]] = {
    "stream-fusion": ("0", "1"),
    "strict-scope-check": ("bypass", "abort"),
}


@dataclass(frozen=True)
class ScopeOptions:
    """Parsed ``key=value:key=value`` options of a scope (``text``: the string as written)."""

    stream_fusion: bool = False
    strict_scope_check: str = "bypass"
    text: str = field(default="", compare=False)

    @property
    def abort_on_cut(self) -> bool:
        return self.strict_scope_check == "abort"


def _allowed_text() -> str:
    return "; ".join(f"{k} in {{{', '.join(v)}}}" for k, v in OPTION_VALUES.items())


def parse_options(options: str | None) -> ScopeOptions:
    """Parse a scope options string such as ``"stream-fusion=1:strict-scope-check=abort"``.

    Raises ``ValueError`` naming the offending key and the allowed keys and values.
    """
    if options is None:
        return ScopeOptions()
    if not isinstance(options, str):
        raise TypeError(f"scope options must be a string like 'stream-fusion=1', got {type(options).__name__}")
    parsed = _PARSED.get(options)
    if parsed is None:
        values = option_values(options)
        parsed = _PARSED[options] = ScopeOptions(
            stream_fusion=values["stream-fusion"] == "1",
            strict_scope_check=values["strict-scope-check"],
            text=options,
        )
    return parsed


# Parsed once per distinct string, when the graph is segmented (not while Dynamo traces:
# see option_values).
_PARSED: dict[str, ScopeOptions] = {}


def option_values(options: str) -> dict[str, str]:
    """Validate ``options`` and return every key's value (defaults filled in).

    A pure function of the string with no global state: ``super_kernel()`` calls it while
    Dynamo traces the model, where touching a module-level cache would add guards on it.
    """
    values = {k: v[0] for k, v in OPTION_VALUES.items()}
    given: set[str] = set()
    for part in options.split(":"):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError(
                f"scope option {part!r} is missing '=': write key=value pairs joined by ':'; allowed: {_allowed_text()}"
            )
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in OPTION_VALUES:
            raise ValueError(f"unknown scope option {key!r}; allowed: {_allowed_text()}")
        if value not in OPTION_VALUES[key]:
            raise ValueError(
                f"invalid value {value!r} for scope option {key!r}; allowed values: {', '.join(OPTION_VALUES[key])}"
            )
        if key in given:
            raise ValueError(f"scope option {key!r} is given twice in {options!r}; give each key at most once")
        given.add(key)
        values[key] = value
    return values


def node_scope(node: Any) -> tuple[str, ScopeOptions]:
    """Return ``(scope, options)`` of an fx node; ``("", ScopeOptions())`` when it carries none."""
    ann = (node.meta.get("custom") or {}).get(ANNOTATION_KEY)
    if not ann:
        return "", ScopeOptions()
    return ann.get("scope", "") or "", parse_options(ann.get("options", "") or "")


# --- devices ----------------------------------------------------------------------------

def tensor_values(val: Any) -> list[torch.Tensor]:
    """The tensors in a value, a node's ``meta["val"]`` or a (nested) list of them."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [v for item in val for v in tensor_values(item)]
    return []


def device_kind(values: Iterable[Any]) -> str:
    """``"cuda"`` when any tensor among ``values`` lives on a CUDA device, else ``"cpu"``
    (or, when only another device type is present, the first such type). Meta tensors
    say nothing beside others; only meta tensors (a graph without data) say ``"meta"``."""
    kinds = {t.device.type for v in values for t in tensor_values(v)}
    if "cuda" in kinds:
        return "cuda"
    if kinds == {"meta"}:
        return "meta"
    kinds.discard("meta")
    return "cpu" if not kinds or "cpu" in kinds else sorted(kinds)[0]


def graph_device(gm: fx.GraphModule) -> str:
    """:func:`device_kind` of every placeholder and operator output of a graph."""
    return device_kind(node.meta.get("val") for node in gm.graph.nodes)


# --- errors -----------------------------------------------------------------------------

_BaseScopeError = getattr(_dynamo_exc, "ShortenTraceback", RuntimeError)


class SuperKernelScopeError(_BaseScopeError):  # type: ignore[misc,valid-type]
    """Raised under ``strict-scope-check=abort`` when a scope would be cut.

    Derives from Dynamo's ShortenTraceback where it exists, so torch.compile passes it
    to the caller unchanged instead of wrapping it in BackendCompilerFailed.
    """

    def __init__(self, message: str, cut: "Cut | None" = None) -> None:
        if _BaseScopeError is RuntimeError:  # pragma: no cover - torch without ShortenTraceback
            super().__init__(message)
        else:
            super().__init__(message, first_useful_frame=None)
        self.cut = cut


# --- partitions -------------------------------------------------------------------------

@dataclass
class Partition:
    """A run of consecutive graph nodes realized together.

    kind: ``"segment"`` (scoped, fusable), ``"unscoped"`` (outside every scope) or
    ``"cut"`` (one scoped operator that cannot be fused; runs alone, eagerly).
    """

    kind: str
    scope: str
    options: ScopeOptions
    nodes: list[fx.Node] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    name: str = ""

    @property
    def first(self) -> int:
        return self.indices[0]

    @property
    def last(self) -> int:
        return self.indices[-1]

    @property
    def num_ops(self) -> int:
        return sum(1 for n in self.nodes if n.target is not operator.getitem)


@dataclass
class Segmentation:
    partitions: list[Partition]
    cuts: list["Cut"]
    #: unscoped operators that split a step's CUDA graph (host sync, CPU work...; asked for by the CUDA rows)
    step_cuts: list["Cut"] = field(default_factory=list)

    @property
    def segments(self) -> list[Partition]:
        return [p for p in self.partitions if p.kind == "segment"]


# --- what explain() shows -----------------------------------------------------------------

@dataclass
class Cut:
    """Where and why a scope was split."""

    scope: str
    node_index: int
    op: str
    reason: str
    source: str | None = None  # "file.py:123" of the model code, when the graph has it

    def describe(self) -> str:
        where = f" at {self.source}" if self.source else ""
        owner = f"scope {self.scope!r}" if self.scope else "outside every scope"
        return f"{owner}: {self.op} (node {self.node_index}){where}: {self.reason}"


@dataclass
class SegmentInfo:
    """A segment as explain() shows it; the realizer fills in ``realization`` and ``fallback``."""

    name: str
    scope: str
    first: int
    last: int
    num_ops: int
    realization: str = "pending"  # e.g. "cuda-graph", "cpu-flat", "inductor-cpp", "inductor-triton", "eager"
    fallback: str | None = None  # cause when the segment fell back to eager
    #: the autofusion planner's decisions (superkernel.ir.decision.record); empty when it did not run
    autofusion: list[dict[str, Any]] = field(default_factory=list)
    #: what superkernel rewrote in the segment before Inductor compiled it (e.g. a quantized GEMV)
    rewrites: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, part: Partition, realization: str = "pending") -> "SegmentInfo":
        return cls(part.name, part.scope, part.first, part.last, part.num_ops, realization)


@dataclass
class CaptureInfo:
    """One CUDA graph of a step: a run of partitions between cuts, captured and replayed as one launch."""

    name: str
    partitions: list[str]
    status: str = "pending"              # "captured", or "uncaptured: <why>"
    captures: int = 0                    # input signatures captured (the first and each recapture)
    recaptures: int = 0
    replays: int = 0
    failed_captures: int = 0
    uncaptured_calls: int = 0            # calls that ran without the graph (uncapturable, or past the bound)
    copies_per_replay: int = 0           # inputs copied into the graph's private buffers on each replay
    copied_bytes_per_replay: int = 0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        copies = f", {self.copies_per_replay} input copies ({self.copied_bytes_per_replay} B) per replay"
        counts = (f"{self.captures} capture(s), {self.recaptures} recapture(s), {self.replays} replay(s)"
                  + (f", {self.uncaptured_calls} uncaptured call(s)" if self.uncaptured_calls else ""))
        return f"{self.name} [{' + '.join(self.partitions)}]: {self.status}; {counts}{copies}"


@dataclass
class GraphInfo:
    name: str
    num_ops: int
    mode: str
    device: str
    segments: list[SegmentInfo] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    unscoped_ops: int = 0
    compile_seconds: float = 0.0
    #: CUDA rows: the step's CUDA graphs, in order (one when nothing splits the step)
    cuda_graphs: list[CaptureInfo] = field(default_factory=list)
    #: CUDA rows: unscoped operators that split the step's CUDA graph
    step_cuts: list[Cut] = field(default_factory=list)

    @property
    def scopes(self) -> list[str]:
        seen: dict[str, None] = {}
        for s in self.segments:
            seen.setdefault(s.scope)
        return list(seen)


@dataclass
class Explanation:
    graphs: list[GraphInfo] = field(default_factory=list)
    graph_breaks: int = 0
    #: which checks a call of the compiled object runs: "full-guards" (Dynamo's guard tree), "precompiled"
    #: (a precompiled frame and its state watch) or "precompiled-frame-guards"; None for a bare backend
    guard_path: str | None = None
    #: measured cost of one check (µs) where one was taken, e.g. {"frame_guards": 41.0}
    guard_cost_us: dict[str, float] = field(default_factory=dict)

    @property
    def scopes(self) -> list[str]:
        seen: dict[str, None] = {}
        for g in self.graphs:
            for s in g.scopes:
                seen.setdefault(s)
        return list(seen)

    @property
    def segments(self) -> list[SegmentInfo]:
        return [s for g in self.graphs for s in g.segments]

    @property
    def cuts(self) -> list[Cut]:
        return [c for g in self.graphs for c in g.cuts]

    @property
    def fallbacks(self) -> list[SegmentInfo]:
        return [s for s in self.segments if s.fallback]

    def to_dict(self) -> dict[str, Any]:
        return {"graph_breaks": self.graph_breaks, "guard_path": self.guard_path, "guard_cost_us": self.guard_cost_us,
                "graphs": [asdict(g) for g in self.graphs]}

    def __str__(self) -> str:
        lines = [f"superkernel: {len(self.graphs)} graph(s), {len(self.scopes)} scope(s), "
                 f"{len(self.segments)} segment(s), {len(self.cuts)} cut(s), {self.graph_breaks} graph break(s)"]
        if self.guard_path:
            costs = ", ".join(f"{k} {v:.1f} us" for k, v in self.guard_cost_us.items())
            lines.append(f"guard path: {self.guard_path}{f' ({costs})' if costs else ''}")
        for g in self.graphs:
            lines.append(f"\n[{g.name}] mode={g.mode} device={g.device} ops={g.num_ops} unscoped_ops={g.unscoped_ops}"
                         f" compile={g.compile_seconds:.2f}s")
            header = f"  {'segment':<40} {'scope':<20} {'ops':>5} {'nodes':>11}  {'realization':<16} fallback"
            lines.append(header)
            lines.append("  " + "-" * (len(header) + 6))
            for s in g.segments:
                lines.append(f"  {s.name:<40} {s.scope:<20} {s.num_ops:>5} {f'{s.first}-{s.last}':>11}  "
                             f"{s.realization:<16} {s.fallback or '-'}")
                if s.autofusion:
                    from superkernel.ir.decision import describe

                    lines.extend(f"    autofusion {describe(d)}" for d in s.autofusion)
                lines.extend(f"    rewrite: {r}" for r in s.rewrites)
            for c in g.cuts:
                lines.append(f"  cut: {c.describe()}")
            if g.cuda_graphs:
                lines.append(f"  CUDA graphs per call: {len(g.cuda_graphs)}")
                lines.extend(f"    {c.describe()}" for c in g.cuda_graphs)
                lines.extend(f"    splits the step: {c.describe()}" for c in g.step_cuts)
        return "\n".join(lines)
