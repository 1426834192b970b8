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


SEGMENT_CHECK = "segment_check"


def record(decisions: list[Decision], *, frozen_kept: bool, timings_ms: dict[str, float],
           rewrite_check: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The segment's explain record: the decisions (made on its frozen compile), the check of the planned
    segment against it unplanned (``rewrite_check``; the applied decisions become rejected when it lost),
    and which compile was kept — a rewrite applied to the frozen variant runs only when that variant won
    its measurement."""
    check = rewrite_check or {}
    lost = check.get("kept") == "without the rewrites"
    for d in decisions:
        if lost and d.status == APPLIED:
            d.status = REJECTED
            d.reason = (f"measured faster alone, but the compiled segment with the rewrites was not faster "
                        f"(segment ratio {check['ratio']:.3f}): dropped")
    out = [d.to_dict() for d in decisions]
    if check:
        m = {k: check[k] for k in ("unfused_us", "fused_us", "ratio", "ratio_q3", "clock") if k in check}
        why = check.get("error") or (f"the compiled segment with / without the rewrites, ratio {check['ratio']:.3f} "
                                     f"(kept only if <= 0.97 with upper quartile < 1)")
        out.append(Decision(SEGMENT_CHECK, APPLIED if not lost else REJECTED, "segment", why,
                            measured=m).to_dict())
    timing = ", ".join(f"{k} {v:.3f} ms" for k, v in timings_ms.items())
    if not decisions:
        kept, why = "plain", "the planner did not run: the segment has no frozen compile (no freezable weight reaches a GEMM)"
    else:
        kept = "frozen (with the applied rewrites)" if frozen_kept else "plain (the rewrites above do not run)"
        why = f"segment timed {timing}" if timing else "not timed"
    out.append(Decision("variant", "kept", kept, why).to_dict())
    return out
