"""Terminal rendering of analysis and results (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from superkernel.tools.advisor.analysis import Analysis
from superkernel.tools.advisor.results import RunResult
from superkernel.tools.advisor.table import rich_table


def print_analysis(a: Analysis, console: Console) -> None:
    s = a.structure
    console.print(f"[bold]{a.model_name}[/]: {a.architecture}, {a.num_parameters / 1e6:.2f} M parameters")
    console.print(f"  decoder layers: {s.num_layers} at {s.layers_path}; attention: {s.attention_kind}; "
                  f"dense MLP layers: {len(s.mlp_paths)}; MoE layers: {len(s.moe_paths)}")
    console.print(f"  prefill/decode: {a.prefill_decode}")
    console.print(f"  KV cache: {a.kv_cache}")
    console.print(f"  decode step capture: {a.decode_graphs} graph(s), {len(a.breaks)} graph break(s)")
    for b in a.breaks:
        console.print(f"    break{' at ' + b.where if b.where else ''}: {b.reason}")
    layers = Table(title="module tree", header_style="bold")
    for col in ("layer", "attention", "feed-forward", "kind", "router", "experts", "shared experts", "norms"):
        layers.add_column(col)
    for p in s.layers:
        layers.add_row(str(p.index), p.attention or "-", p.ffn or "-", p.ffn_kind or "-", p.router or "-",
                       f"{p.experts} ({p.num_experts})" if p.experts and p.num_experts else (p.experts or "-"),
                       p.shared_experts or "-", ", ".join(n.rsplit(".", 1)[-1] for n in p.norms) or "-")
    console.print(layers)
    console.print(f"  suggested order: {' -> '.join(a.suggested_order)} ({a.suggestion_why})")
    for name, why in a.not_applicable.items():
        console.print(f"  not applicable: {name}: {why}")
    if not a.trials:
        return
    trials = Table(title="trial capture per candidate scope plan (exactness reference backend)", header_style="bold")
    for col in ("strategy", "scopes", "modules", "graphs", "graph breaks", "segments", "cuts", "unscoped ops",
                "ops", "capture s"):
        trials.add_column(col, justify="left" if col in ("strategy", "scopes") else "right", overflow="fold")
    for t in a.trials:
        if t.error:
            trials.add_row(t.plan.strategy, t.plan.describe(), str(len(t.wrapped)), "-", "-", "-", "-", "-", "-",
                           f"{t.seconds:.1f}")
            continue
        trials.add_row(t.plan.strategy, t.plan.describe(), str(len(t.wrapped)), str(t.graphs), str(t.graph_breaks),
                       str(len(t.segments)), str(len(t.cuts)), str(t.unscoped_ops), str(t.total_ops), f"{t.seconds:.1f}")
    console.print(trials)
    for t in a.trials:
        if t.error:
            console.print(f"  [red]{t.plan.strategy}: cannot be captured: {t.error}[/]")
        for c in t.cuts:
            console.print(f"  {t.plan.strategy}: cut {c.describe()}")
        if t.uncaptured:
            console.print(f"  [yellow]{t.plan.strategy}: scope(s) {', '.join(t.uncaptured)} reached no captured graph "
                          f"({t.graph_breaks} graph break(s)): they would not be fused[/]")
        elif not t.error and not t.cuts:
            console.print(f"  {t.plan.strategy}: no cuts — every scope is one run of fusable operators")
    issues = a.issues
    console.print("  potential issues: " + ("none found" if not issues else ""))
    for issue in issues:
        console.print(f"    - {issue}")


def print_results(results: list[RunResult], recommended: RunResult | None, title: str, console: Console) -> None:
    console.print(rich_table(results, recommended, title, width=console.width))
