"""PNG chart of where the decode step spends its time (matplotlib, Agg backend).

Top: the eager step as one bar stacked by module kind, and each profiled plan as one bar
(a compiled step is not split by module). Bottom: the eager step per layer, stacked by kind.
"""

from __future__ import annotations

import io

from superkernel.tools.advisor.profile import KINDS, StepProfile

COLORS = {"embedding": "#8d6e63", "attention": "#1e88e5", "moe": "#8e24aa", "mlp": "#43a047", "norm": "#fdd835",
          "lm_head": "#fb8c00", "other": "#bdbdbd"}
PLAN_COLOR = "#2e7d32"


def profile_chart(eager: StepProfile, plans: list[StepProfile], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    layers = sorted({r.layer for r in eager.rows if r.layer is not None})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 2.0 + 0.45 * (1 + len(plans)) + 0.3 * len(layers)), dpi=110,
                                      gridspec_kw={"height_ratios": [1 + len(plans), max(2, len(layers))]})
    totals = eager.kind_totals()
    left = 0.0
    for kind in KINDS:
        ms = totals[kind]
        if ms <= 0:
            continue
        top.barh(0, ms, left=left, color=COLORS[kind], label=kind, edgecolor="white", linewidth=0.5)
        if ms / max(eager.step_ms, 1e-9) >= 0.08:
            top.text(left + ms / 2, 0, f"{ms / eager.step_ms:.0%}", ha="center", va="center", fontsize=7)
        left += ms
    top.text(left, 0, f" {eager.step_ms:.3f} ms, {eager.launches:.0f} launches", va="center", fontsize=7)
    for i, p in enumerate(plans, start=1):
        top.barh(i, p.step_ms, color=PLAN_COLOR, edgecolor="white")
        top.text(p.step_ms, i, f" {p.step_ms:.3f} ms, {p.launches:.0f} launches", va="center", fontsize=7)
    top.set_yticks(range(1 + len(plans)), labels=["eager"] + [p.label for p in plans], fontsize=8)
    top.invert_yaxis()
    top.set_xlim(0, max([eager.step_ms] + [p.step_ms for p in plans]) * 1.45)
    top.set_xlabel("ms per decode step (profiled; hooks' wall clock for eager)", fontsize=8)
    top.legend(fontsize=7, ncol=len(KINDS), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    top.set_title(title, fontsize=10, pad=18)
    for j, layer in enumerate(layers):
        left = 0.0
        for kind in KINDS:
            ms = sum(r.ms for r in eager.rows if r.layer == layer and r.kind == kind)
            if ms > 0:
                bottom.barh(j, ms, left=left, color=COLORS[kind], edgecolor="white", linewidth=0.5)
                left += ms
    bottom.set_yticks(range(len(layers)), labels=[f"layer {i}" for i in layers], fontsize=8)
    bottom.invert_yaxis()
    bottom.set_xlabel("eager ms per layer (attention, MLP/MoE, norms, the layer's own glue as 'other')", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
