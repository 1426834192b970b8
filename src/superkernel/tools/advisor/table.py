"""The terminal table of baselines and plans (also reused, as text, by the report)."""

from __future__ import annotations

from rich import box
from rich.table import Table

from superkernel.tools.advisor.results import RunResult

#: Column headers; the markdown report explains them under the table.
COLUMNS = ("strategy", "mode", "scopes", "segments", "cuts", "decode ms median / p90", "tokens/s",
           "vs eager", "vs torch.compile", "max abs diff vs reference", "max abs diff vs eager",
           "top-1 vs ref", "precision", "compile s", "recompiles (timed)")
_PRECISION = COLUMNS.index("precision")


def fmt_diff(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.2e}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def row(r: RunResult) -> list[str]:
    """Cells of one result, in COLUMNS order."""
    timed = r.median_ms is not None
    if r.kind == "baseline":
        strategy, mode, scopes, segs, cuts = r.name, "-", "-", "-", "-"
    else:
        strategy, mode = r.strategy or "-", r.mode or "-"
        scopes = str(len(r.scopes))
        segs = str(r.segments) if not r.error else "-"
        cuts = str(len(r.cuts)) if not r.error else "-"
    return [
        strategy, mode, scopes, segs, cuts,
        f"{r.median_ms:.3f} / {r.p90_ms:.3f}" if timed else "-",
        f"{r.tokens_per_s:.0f}" if timed else "-",
        _x(r.speedup_vs_eager), _x(r.speedup_vs_compile),
        fmt_diff(r.vs_reference.max_abs) if r.vs_reference else "-",
        fmt_diff(r.vs_eager.max_abs) if r.vs_eager else "-",
        f"{r.vs_reference.top1_agreement:.0%}" if r.vs_reference else "-",
        r.status if not r.error else "error",
        "-" if r.compile_s is None or r.name == "eager" or r.error else f"{r.compile_s:.1f}",
        _recompiles(r),
    ]


def _recompiles(r: RunResult) -> str:
    """Recompiles Dynamo made during the timed steps ("limit" when it gave up and ran eagerly)."""
    if r.dynamo is None or r.name == "eager":
        return "-"
    return f"{r.dynamo.recompiles_timed}" + (" (limit hit)" if r.dynamo.limit_hit else "")


_STYLE = {"passed": "green", "failed": "bold red", "error": "bold red", "baseline": "dim"}

#: Short headers for terminals narrower than the full table, same order as COLUMNS.
SHORT = ("strategy", "mode", "scopes", "segs", "cuts", "ms med / p90", "tok/s", "x eager", "x compile",
         "diff ref", "diff eager", "top-1", "status", "compile s", "recomp")
#: Columns left out below a terminal width (they stay in the report and results.json).
OPTIONAL = {"scopes": 140, "max abs diff vs eager": 140, "top-1 vs ref": 140,
            "tokens/s": 120, "cuts": 120, "compile s": 120}
FULL_WIDTH = 210


def rich_table(results: list[RunResult], recommended: RunResult | None, title: str, width: int = 240) -> Table:
    """The results table, with shorter headers (and fewer columns) to fit ``width``."""
    keep = [i for i, col in enumerate(COLUMNS) if width >= OPTIONAL.get(col, 0)]
    headers = COLUMNS if width >= FULL_WIDTH else SHORT
    caption = None if len(keep) == len(COLUMNS) else "narrow terminal: every column is in the report"
    compact = {} if width >= FULL_WIDTH else {"box": box.SIMPLE_HEAD, "pad_edge": False, "collapse_padding": True}
    table = Table(title=title, header_style="bold", caption=caption, **compact)
    for i in keep:
        col = COLUMNS[i]
        table.add_column(headers[i], justify="left" if col in ("strategy", "mode", "precision") else "right",
                         no_wrap=True, min_width=15 if col == "strategy" else None)
    for r in results:
        cells = row(r)
        cells[_PRECISION] = f"[{_STYLE.get(r.status, '')}]{cells[_PRECISION]}[/]"
        if recommended is r:
            cells[0] = f"[bold]* {cells[0]}[/]"
        table.add_row(*(cells[i] for i in keep))
    return table


def markdown_table(results: list[RunResult], recommended: RunResult | None) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results:
        cells = row(r)
        if recommended is r:
            cells[0] = f"**{cells[0]}** (recommended)"
        if r.status in ("failed", "error"):
            cells[_PRECISION] = f"**{cells[_PRECISION].upper()}**"
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
