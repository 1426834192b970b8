"""One planner decision about one candidate (or one rule that did not match), as explain() lists it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

APPLIED = "applied"
REJECTED = "rejected"
NOT_MATCHED = "not matched"
NOT_BUILT = "not built"


@dataclass
class Decision:
    rule: str
    status: str                      # APPLIED / REJECTED / NOT_MATCHED / NOT_BUILT
    where: str                       # the nodes of the segment graph it is about
    reason: str
    shapes: str = ""
    predicted_us: float | None = None  # benefit model: µs saved per call (negative: a loss)
    measured: dict[str, Any] = field(default_factory=dict)  # unfused_us, fused_us, ratio, cached
    capacity: dict[str, Any] = field(default_factory=dict)  # working_set, cache, source

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe(d: dict[str, Any]) -> str:
    """One line of explain() for a decision dict (as stored in the segment's explain record)."""
    parts = [f"{d['rule']}: {d['status']}", d["where"]]
    if d.get("shapes"):
        parts.append(d["shapes"])
    if d.get("predicted_us") is not None:
        parts.append(f"predicted {d['predicted_us']:+.2f} us")
    m = d.get("measured") or {}
    if "fused_us" in m:
        parts.append(f"measured {m['unfused_us'] - m['fused_us']:+.2f} us "
                     f"({m['unfused_us']:.2f} -> {m['fused_us']:.2f} us{', cached' if m.get('cached') else ''})")
    cap = d.get("capacity") or {}
    if "working_set" in cap:
        parts.append(f"working set {cap['working_set']} B / cache {cap['cache']} B")
    return " | ".join(parts) + f" -- {d['reason']}"


def record(decisions: list[Decision], *, frozen_kept: bool, timings_ms: dict[str, float]) -> list[dict[str, Any]]:
    """The segment's explain record: the decisions (made on its frozen compile), and which compile was kept —
    a rewrite applied to the frozen variant runs only when that variant won its measurement."""
    out = [d.to_dict() for d in decisions]
    timing = ", ".join(f"{k} {v:.3f} ms" for k, v in timings_ms.items())
    if not decisions:
        kept, why = "plain", "the planner did not run: the segment has no frozen compile (no freezable weight reaches a GEMM)"
    else:
        kept = "frozen (with the applied rewrites)" if frozen_kept else "plain (the rewrites above do not run)"
        why = f"segment timed {timing}" if timing else "not timed"
    out.append(Decision("variant", "kept", kept, why).to_dict())
    return out
