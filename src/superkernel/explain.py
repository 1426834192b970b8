"""What the backend did: graphs, scopes, segments, cuts and realizations.

``superkernel.explain(obj)`` accepts a backend returned by ``get_backend``, or a
model/function compiled with one, and returns an :class:`Explanation` whose
``str()`` is a readable table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
        return f"scope {self.scope!r}: {self.op} (node {self.node_index}){where}: {self.reason}"


@dataclass
class SegmentInfo:
    name: str
    scope: str
    first: int
    last: int
    num_ops: int
    realization: str = "pending"  # e.g. "cuda-graph", "cpu-flat", "inductor-cpp", "inductor-triton", "eager"
    fallback: str | None = None  # cause when the segment fell back to eager


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
        from dataclasses import asdict

        return {"graph_breaks": self.graph_breaks, "graphs": [asdict(g) for g in self.graphs]}

    def __str__(self) -> str:
        lines = [f"superkernel: {len(self.graphs)} graph(s), {len(self.scopes)} scope(s), "
                 f"{len(self.segments)} segment(s), {len(self.cuts)} cut(s), {self.graph_breaks} graph break(s)"]
        for g in self.graphs:
            lines.append(f"\n[{g.name}] mode={g.mode} device={g.device} ops={g.num_ops} unscoped_ops={g.unscoped_ops}"
                         f" compile={g.compile_seconds:.2f}s")
            header = f"  {'segment':<40} {'scope':<20} {'ops':>5} {'nodes':>11}  {'realization':<16} fallback"
            lines.append(header)
            lines.append("  " + "-" * (len(header) + 6))
            for s in g.segments:
                lines.append(f"  {s.name:<40} {s.scope:<20} {s.num_ops:>5} {f'{s.first}-{s.last}':>11}  "
                             f"{s.realization:<16} {s.fallback or '-'}")
            for c in g.cuts:
                lines.append(f"  cut: {c.describe()}")
        return "\n".join(lines)


def explain(obj: Any) -> Explanation:
    """Return the Explanation of a superkernel backend or of a model compiled with one."""
    from .backend import find_backend

    backend = find_backend(obj)
    return backend.explanation()
