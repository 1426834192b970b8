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
    console.print(f"  decoder layers: {s.stack_description}; attention: {s.attention_kind}; "
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


def print_profile(profile, forecasts, console: Console) -> None:
    """``analyze --profile``: time per module kind and layer, the top modules, each plan's coverage."""
    from superkernel.tools.advisor.profile import KINDS

    step = profile.step_ms or float("nan")
    console.print(f"  decode step profile ({profile.steps} steps, eager): {profile.step_ms:.3f} ms with module hooks, "
                  f"{profile.measured_ms:.3f} ms without ({profile.coverage:.2f}x); {profile.ops:.0f} operators, "
                  f"{profile.launches:.0f} launches, {profile.weight_bytes / 2**20:.2f} MiB of weights per step",
                  highlight=False)
    kinds = Table(title="where the eager decode step spends its time", header_style="bold")
    for col in ("kind", "ms/step", "share", "operators", "launches", "weights MiB", "covered by"):
        kinds.add_column(col, justify="left" if col in ("kind", "covered by") else "right")
    for kind in KINDS:
        rows = [r for r in profile.rows if r.kind == kind]
        if rows:
            ms = sum(r.ms for r in rows)
            kinds.add_row(kind, f"{ms:.3f}", f"{ms / step:.1%}", f"{sum(r.ops for r in rows):.0f}",
                          f"{sum(r.launches for r in rows):.0f}", f"{sum(r.weight_bytes for r in rows) / 2**20:.2f}",
                          rows[0].covered_by or ("decoder_layer / all_layers (layer glue)" if kind == "other" else "-"))
    console.print(kinds)
    top = Table(title="top modules", header_style="bold")
    for col in ("module", "layer", "ms/step", "share", "launches", "covered by"):
        top.add_column(col, justify="left" if col in ("module", "covered by") else "right", overflow="fold")
    for r in profile.top(8):
        top.add_row(f"{r.kind}: {', '.join(r.modules[:2]) or '(outside marked modules)'}",
                    "-" if r.layer is None else str(r.layer), f"{r.ms:.3f}", f"{r.ms / step:.1%}", f"{r.launches:.0f}",
                    r.covered_by or ("decoder_layer / all_layers" if r.layer is not None else "-"))
    console.print(top)
    if not forecasts:
        return
    plans = Table(title="candidate plans: what the profile says they cover", header_style="bold")
    for col in ("plan", "covered share", "fused fraction", "launches removed", "segments", "cuts"):
        plans.add_column(col, justify="left" if col == "plan" else "right")
    for f in forecasts:
        plans.add_row(f.strategy, f"{f.share:.0%}", f"{f.fused_fraction:.0%}", str(f.launches_removed),
                      str(f.segments), str(f.cuts) + (" (capture failed)" if f.trial_error else ""))
    console.print(plans)
