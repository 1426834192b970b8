"""``graph-autofusion``: ONNX in, fused ONNX out, runnable in ONNX Runtime.

    graph-autofusion --input m.onnx --output m_fused.onnx --fusion-rules all --opt-level 3

Exit codes: 0 ok, 1 verification failed (nothing written to --output), 2 bad input
(one-line error, nothing written; with verification on, also an input ONNX Runtime cannot run or
that is not deterministic: :mod:`superkernel.onnx.input_check`). See docs/graph_autofusion.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from superkernel.util import (
    InputFileError, OutputError, atomic_write, check_output_file, check_write_path, exception_summary,
    non_negative_int, positive_int,
)

from . import benefit as B
from . import catalog, engine, modelio, report
from .catalog import RuleSelectionError
from .modelio import InputError

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_BAD_INPUT = 0, 1, 2
ESTIMATE_DEFAULT_DIM = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graph-autofusion",
        description="Fuse operators of an ONNX model into operators ONNX Runtime's CPU provider runs, "
                    "keeping only fusions with a positive estimated benefit, and verify the result.",
        epilog="exit codes: 0 ok, 1 verification failed (nothing written), 2 bad input (nothing written)")
    p.add_argument("--input", help="input ONNX model")
    p.add_argument("--output", help="fused ONNX model to write (must differ from --input)")
    p.add_argument("--fusion-rules", default="all", metavar="SPEC",
                   help="'all', 'rule,rule' or 'all,-rule' (see --list-rules); default all")
    p.add_argument("--list-rules", action="store_true", help="print the rule catalog and exit")
    p.add_argument("--opt-level", type=int, choices=range(0, 4), default=3, metavar="{0,1,2,3}",
                   help="0 validate and copy; 1 norms and activations; 2 + MatMul epilogues; "
                        "3 + rotary and attention (default 3)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="fix a symbolic dimension for the benefit estimate and the verification inputs "
                        "(repeatable)")
    p.add_argument("--debug", action="store_true",
                   help="record on every fused node the names of the nodes it replaced")
    p.add_argument("--report", metavar="PATH.md", help="write a Markdown report and a JSON twin (PATH.json)")
    p.add_argument("--benchmark", action="store_true",
                   help="time original (ORT_DISABLE_ALL, ORT_ENABLE_ALL) and fused (ORT_ENABLE_ALL) in ONNX Runtime")
    p.add_argument("--bench-repeat", type=positive_int("--bench-repeat"), default=100, metavar="N", help="timed runs per model (default 100)")
    p.add_argument("--bench-warmup", type=non_negative_int("--bench-warmup"), default=10, metavar="N",
                   help="warm-up runs (default 10)")
    p.add_argument("--threads", type=non_negative_int("--threads"), default=0, metavar="N",
                   help="ONNX Runtime intra-op threads for the benchmark (default: ORT's choice)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="decide with the static estimate only (no micro-benchmarks, no end-to-end check)")
    p.add_argument("--no-e2e-check", action="store_true",
                   help="skip the end-to-end timing that drops fusion kinds which make the whole model slower")
    p.add_argument("--calibration-cache", metavar="PATH", default=None,
                   help="JSON cache of micro-benchmark results (default: the user cache directory)")
    p.add_argument("--no-verify", action="store_true", help="skip the comparison in ONNX Runtime")
    p.add_argument("--seed", type=int, default=0, help="seed of the random verification inputs (default 0)")
    p.add_argument("--atol", type=float, default=None, help="override the per-dtype absolute tolerance")
    p.add_argument("--rtol", type=float, default=None, help="override the per-dtype relative tolerance")
    p.add_argument("--quiet", action="store_true", help="no progress display and no summary")
    return p


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise InputError(f"--dim {item!r}: expected NAME=VALUE")
        try:
            v = int(value)
        except ValueError:
            raise InputError(f"--dim {item!r}: VALUE must be a positive integer") from None
        if v <= 0:
            raise InputError(f"--dim {item!r}: VALUE must be a positive integer")
        dims[name.strip()] = v
    return dims


def print_catalog(console: Console) -> None:
    console.print("graph-autofusion rule catalog (name, opt level, fused op, pattern, description)")
    for r in catalog.CATALOG:
        console.print(f"{r.name:<24} level {r.opt_level}  -> {r.fused_op}", markup=False)
        console.print(f"{'':<24} pattern: {r.pattern}", markup=False)
        console.print(f"{'':<24} {r.description}", markup=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help is 0, a usage error is 2
        return int(e.code or 0)
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)

    def fail(msg: str) -> int:
        err.print(f"graph-autofusion: error: {msg}", markup=False)
        return EXIT_BAD_INPUT

    if args.list_rules:
        print_catalog(out)
        return EXIT_OK
    if not args.input or not args.output:
        return fail("--input and --output are required")
    try:
        dims = parse_dims(args.dim)
        specs = catalog.select_rules(args.fusion_rules, args.opt_level)
        loaded = modelio.load(args.input)
        modelio.check_output_path(args.input, args.output, loaded.external_files)
        if args.report:
            modelio.check_output_path(args.input, args.report, loaded.external_files, flag="--report")
            for path in (args.report, report.json_twin(args.report)):  # neither may replace a file of this run
                check_write_path(path, report_inputs(args, loaded), "--report")
        if args.calibration_cache:  # a file of this run is never a cache (nor the cache a link)
            check_output_file(args.calibration_cache, "--calibration-cache", calibration_inputs(args, loaded))
    except (InputError, RuleSelectionError, OutputError, InputFileError) as e:
        return fail(str(e))

    from . import verify as V  # onnxruntime import is slow; only when there is work

    if not args.no_verify:  # verification can only blame the fusion for an input that runs, alike, twice
        from .input_check import check_input

        try:
            check_input(args.input, loaded.model, dims=dims, default_dim=V.VERIFY_DEFAULT_DIM, seed=args.seed,
                        atol=args.atol, rtol=args.rtol)
        except InputError as e:
            return fail(str(e))

    cost_model = B.CPU_DEFAULT
    staged = None
    verification = bench = e2e = None
    calibrator = None
    if not args.no_calibrate and specs:
        from .calibrate import Calibrator

        calibrator = Calibrator(threads=args.threads or 1, cache_path=args.calibration_cache, dims=dims,
                                default_dim=ESTIMATE_DEFAULT_DIM, inputs=calibration_inputs(args, loaded))
    status, code, message = "ok", EXIT_OK, ""
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                        transient=True, disable=args.quiet)
    try:
        with progress:
            task = progress.add_task("fusing", total=None)

            def on_stage(names: str, i: int, n: int) -> None:
                progress.update(task, description=f"stage {i + 1}/{n}: {names}")

            def fuse_and_stage(excluded: set[str], model=None):
                chosen = [sp for sp in specs if sp.name not in excluded]
                m = model if model is not None else modelio.load(args.input).model
                f = engine.fuse(m, chosen, dims=dims, default_dim=ESTIMATE_DEFAULT_DIM, debug=args.debug,
                                cost_model=cost_model, progress=on_stage, calibrator=calibrator)
                return f, modelio.stage_model(m, args.output, external_data=loaded.external_data)

            fusion, staged = fuse_and_stage(set(), loaded.model)
            if calibrator is not None and not args.no_e2e_check and fusion.applied:
                from .e2e import guard

                progress.update(task, description="end-to-end check in ONNX Runtime")
                try:
                    fusion, staged, e2e = guard(args.input, fusion, staged, fuse_and_stage, dims=dims,
                                                seed=args.seed, threads=args.threads or 1)
                except Exception as e:  # noqa: BLE001 - e.g. the fused model does not load; verification says so
                    e2e = {"error": f"{exception_summary(e, 340, first_line=False)}"}
            if not args.no_verify:
                progress.update(task, description="verifying in ONNX Runtime")
                try:
                    verification = V.verify(args.input, staged.model_path, dims=dims, seed=args.seed,
                                            atol=args.atol, rtol=args.rtol)
                except Exception as e:  # noqa: BLE001 - ORT refuses the fused model: a failed verification
                    status, code = "verification failed", EXIT_VERIFY_FAILED
                    message = f"the fused model does not run in ONNX Runtime: {exception_summary(e, 340, first_line=False)}"
                    verification = None
                if verification is not None and not verification.ok:
                    status, code = "verification failed", EXIT_VERIFY_FAILED
                    message = "outputs above tolerance: " + ", ".join(
                        f"{o.name} ({o.reason})" for o in verification.failed)
            if code == EXIT_OK and args.benchmark:
                from .bench import benchmark

                progress.update(task, description="benchmarking in ONNX Runtime")
                s = V.session(args.input, V.ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
                feeds = V.make_inputs(s, dims, V.VERIFY_DEFAULT_DIM, args.seed)
                bench = benchmark(args.input, staged.model_path, feeds, warmup=args.bench_warmup,
                                  repeat=args.bench_repeat, threads=args.threads)
            data = report.build(input_path=args.input, output_path=args.output, opset=loaded.opset,
                                opt_level=args.opt_level, rules=[s.name for s in specs], dims=dims, fusion=fusion,
                                verification=verification, benchmark=bench, status=status, exit_code=code,
                                written=staged.targets if code == EXIT_OK else [],
                                cost_model=dataclasses.asdict(cost_model), message=message,
                                calibration=_calibration_info(calibrator), e2e=e2e)
            # The report is written before the model is moved into place: a report that
            # cannot be written leaves nothing written, as the exit code says.
            if args.report:
                try:
                    _write_report(args, loaded, data)
                except OSError as e:
                    return fail(f"--report: cannot write {args.report}: {exception_summary(e)}; nothing written")
            if code == EXIT_OK:
                try:
                    staged.commit()
                except OSError as e:
                    return fail(f"--output: cannot write {args.output}: {exception_summary(e)}; nothing written "
                                "(the report describes the run)")
    finally:
        if staged is not None:
            staged.discard()

    if not args.quiet:
        print_summary(out, data)
    if code == EXIT_VERIFY_FAILED:
        err.print(f"graph-autofusion: verification failed, nothing written: {message}", markup=False)
    return code


def _write_report(args: argparse.Namespace, loaded: modelio.LoadedModel, data: dict) -> None:
    """Write ``--report`` and its JSON twin (each atomically; OSError when that fails)."""
    import json

    atomic_write(args.report, report.markdown(data), report_inputs(args, loaded))
    atomic_write(report.json_twin(args.report), json.dumps(data, indent=2, default=str), report_inputs(args, loaded))


def _calibration_info(calibrator) -> dict | None:
    if calibrator is None:
        return None
    return {"cache": calibrator.cache_path if calibrator.use_cache else None, "env": calibrator.env,
            "measured": calibrator.measured, "reused_from_cache": calibrator.reused}


def report_inputs(args: argparse.Namespace, loaded: modelio.LoadedModel) -> list[str]:
    """Files the report and its JSON twin must not replace: the input model, its external data, the output."""
    return [args.input, *loaded.external_files, args.output, modelio.external_data_path(args.output)]


def calibration_inputs(args: argparse.Namespace, loaded: modelio.LoadedModel) -> list[str]:
    """Files the calibration cache must not replace: those of :func:`report_inputs` and the reports."""
    reports = [args.report, report.json_twin(args.report)] if args.report else []
    return [*report_inputs(args, loaded), *reports]


def print_summary(console: Console, d: dict) -> None:
    console.print(f"[bold]graph-autofusion[/bold] {d['input']} -> {d['output']}  "
                  f"(opset {d['opset']}, opt level {d['opt_level']})")
    console.print(f"operators: {d['nodes_before']} -> {d['nodes_after']}   candidates: {d['candidates']}   "
                  f"applied: {len(d['applied'])}   skipped: {len(d['skipped'])}   "
                  f"near misses: {len(d['near_misses'])}")
    counts: dict[str, list] = {}
    for c in d["applied"]:
        e = counts.setdefault(c["rule"], [c["fused_op"], 0, 0, 0.0])
        e[1] += 1
        e[2] += c["benefit"]["bytes_saved"]
        e[3] += c["benefit"]["net_us"]
    if counts:
        t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for h in ("rule", "fused op", "count", "bytes saved", "est. net us", "measured saved us"):
            t.add_column(h)
        for k, (op, n, b, us) in counts.items():
            ms = [c["measured"]["saved_us"] for c in d["applied"] if c["rule"] == k and c.get("measured")]
            t.add_row(k, op, str(n), str(b), f"{us:+.2f}", f"{sum(ms):+.2f}" if ms else "-")
        console.print(t)
    skipped = d["skipped"][:5]
    for c in skipped:
        console.print(f"  skipped {c['rule']} at {c['root']}: {c['reason']}", markup=False)
    if len(d["skipped"]) > 5:
        console.print(f"  ... {len(d['skipped']) - 5} more skipped (see --report)")
    v = d["verification"]
    if v is None:
        console.print("verification: not run")
    else:
        worst = max((o["max_abs_diff"] for o in v["outputs"]), default=0.0)
        console.print(f"verification: {'passed' if v['ok'] else 'FAILED'} ({len(v['outputs'])} outputs, "
                      f"max |diff| {worst:.3g})")
        for o in v["outputs"]:
            if not o["ok"]:
                console.print(f"  output {o['name']}: {o['reason']}", markup=False)
    b = d["benchmark"]
    if b is not None:
        t = {(x["model"], x["level"]): x["median_ms"] for x in b["timings"]}
        console.print(f"benchmark (median ms): original DISABLE_ALL {t[('original', 'ORT_DISABLE_ALL')]:.4f}, "
                      f"original ENABLE_ALL {t[('original', 'ORT_ENABLE_ALL')]:.4f}, "
                      f"fused ENABLE_ALL {t[('fused', 'ORT_ENABLE_ALL')]:.4f}; "
                      f"speedup vs ORT_ENABLE_ALL {b['speedup_vs_ort_enable_all']:.3f}x")
    e = d.get("end_to_end")
    if e and "error" in e:
        console.print(f"end-to-end check failed: {e['error']}", markup=False)
    elif e:
        console.print(f"end-to-end (ORT_ENABLE_ALL): original {e['original_ms']:.4f} ms, fused {e['fused_ms']:.4f} ms "
                      f"(x{e['ratio']:.3f}"
                      + (f", {int(e['confidence'] * 100)} % interval {e['ratio_lo']:.3f}-{e['ratio_hi']:.3f}, "
                         f"{e['rounds']} rounds: {e['verdict']}" if "ratio_lo" in e else "")
                      + f"); dropped rules: {', '.join(e['dropped_rules']) or 'none'}")
    console.print(f"written: {', '.join(d['written']) or 'nothing'}")


if __name__ == "__main__":
    sys.exit(main())
