"""PNG chart of decode latency per plan (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import io

from superkernel.tools.advisor.results import RunResult


def latency_chart(results: list[RunResult], recommended: RunResult | None, title: str) -> bytes:
    """Horizontal bars of the median decode step (p90 as error bar); failed plans hatched red."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    timed = [r for r in results if r.median_ms is not None]
    labels = [r.name for r in timed]
    medians = [r.median_ms for r in timed]
    spread = [max(0.0, (r.p90_ms or r.median_ms) - r.median_ms) for r in timed]
    colors, hatches = [], []
    for r in timed:
        if r.kind == "baseline":
            colors.append("#9e9e9e")
        elif r is recommended:
            colors.append("#2e7d32")
        elif r.passed:
            colors.append("#64b5f6")
        else:
            colors.append("#e57373")
        hatches.append("//" if r.kind == "plan" and not r.passed else "")
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(timed) + 1.6), dpi=110)
    bars = ax.barh(range(len(timed)), medians, xerr=[[0] * len(timed), spread], color=colors, capsize=3,
                   error_kw={"ecolor": "#616161", "elinewidth": 1})
    for bar, hatch in zip(bars, hatches):
        bar.set_hatch(hatch)
    right = max([m + d for m, d in zip(medians, spread)] + [1e-9])
    for i, (r, m, d) in enumerate(zip(timed, medians, spread)):
        tag = " (recommended)" if r is recommended else (" FAILED" if r.kind == "plan" and not r.passed else "")
        ax.text(m + d + right * 0.01, i, f"{m:.3f} ms{tag}", va="center", fontsize=8)
    ax.set_yticks(range(len(timed)), labels=labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("decode step latency, ms (median; bar to p90)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, right * 1.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
