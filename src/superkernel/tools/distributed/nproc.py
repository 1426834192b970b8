"""``--nproc N`` / ``--tp-plan FILE`` of the ``superkernel`` commands: launch a job or run as one rank.

Without ``RANK``/``WORLD_SIZE`` in the environment the command checks its input, then
starts N ranks of itself (:func:`.launcher.launch`) and waits; each rank (or each process
torchrun started) runs the distributed workflow.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from superkernel.util import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=positive_int("--nproc"), default=None, metavar="N",
                   help="tensor-parallel decode over N processes on this node (gloo on CPU, NCCL on CUDA); under "
                        "torchrun the command joins the job and --nproc may be left out (docs/distributed.md)")
    p.add_argument("--tp-plan", type=Path, default=None, metavar="FILE",
                   help="tensor-parallel plan as YAML/JSON {module or parameter glob: style} (default: the model's "
                        "transformers tp_plan)")
    p.add_argument("--no-torch-compile-baseline", action="store_true",
                   help="with --nproc: skip the torch.compile baseline of the tensor-parallel job (it compiles the "
                        "whole step once more; for quick checks)")


def wanted(args: argparse.Namespace) -> bool:
    from superkernel.tools.distributed.launcher import in_job

    return getattr(args, "nproc", None) is not None or in_job()


def check_single_process(args: argparse.Namespace) -> None:
    """A flag of the tensor-parallel job given to a single-process run is refused, not ignored."""
    if getattr(args, "no_torch_compile_baseline", False) and not wanted(args):
        raise ValueError("--no-torch-compile-baseline goes with --nproc: a single-process run always measures "
                         "torch.compile, the baseline its recommendation and speed-ups are judged against")


def optimize(args: argparse.Namespace, opts) -> int:
    """``superkernel optimize --nproc N``: launch (parent) or run this rank's part (child).

    The job measures every plan in every mode once, on every rank (``--search exhaustive``): the predicted
    search and the interleaved re-timing run in one process only, so another ``--search`` is refused."""
    from superkernel.tools.advisor.strategies import EXHAUSTIVE

    if opts.search not in (None, EXHAUSTIVE):
        raise ValueError(f"--search {opts.search}: a tensor-parallel run (--nproc) measures every plan in every mode "
                         f"once (--search {EXHAUSTIVE})")
    opts.search = EXHAUSTIVE
    return _run(args, opts, write_files=True)


def bench(args: argparse.Namespace) -> int:
    """``superkernel bench --nproc N``: the plan's scopes and mode on a tensor-parallel job; the
    report goes to stdout, nothing is written."""
    from superkernel.tools.advisor.plan_file import SUPERKERNEL, read_plan
    from superkernel.tools.advisor.workflow import OptimizeOptions

    spec = read_plan(args.config)
    if spec.backend != SUPERKERNEL:
        raise ValueError(f"{args.config} is a 'backend: {spec.backend}' plan; bench --nproc measures superkernel "
                         "plans (scopes and a mode)")
    model = args.model or spec.model
    if not model:
        raise ValueError(f"{args.config} names no model; pass --model NAME|PATH")
    opts = OptimizeOptions(model=model, strategy="custom", modes=(args.mode or spec.mode,),
                           custom_scopes={k: list(v) for k, v in spec.scopes.items()}, options=spec.options,
                           steps=args.steps, warmup=args.warmup, prompt_len=args.prompt_len, seed=args.seed,
                           device=args.device, tolerance=args.tolerance, threads=args.threads, quiet=args.quiet,
                           inputs=[args.config], dtype=args.dtype, batch_size=args.batch_size)
    return _run(args, opts, write_files=False)


def _run(args: argparse.Namespace, opts, *, write_files: bool) -> int:
    from superkernel.tools.advisor.workflow import check_options
    from superkernel.tools.distributed.launcher import check_gpus, check_nproc, in_job
    from superkernel.tools.distributed.optimize import DistOptions, load_tp_plan, run

    check_nproc(args.nproc)
    if not in_job():
        check_gpus(args.nproc, getattr(args, "device", None))
    plan = load_tp_plan(args.tp_plan) if args.tp_plan is not None else None
    if not in_job():
        check_options(opts)  # a bad input is one line here, before any rank starts
        return _launch(args, "superkernel")
    source = _plan_source(args.tp_plan)
    opts.inputs = list(opts.inputs) + ([args.tp_plan] if args.tp_plan is not None else [])
    return run(DistOptions(base=opts, tp_plan=plan, tp_plan_source=source,
                           inductor_baseline=not args.no_torch_compile_baseline, write_files=write_files))


def static_compile(args: argparse.Namespace) -> int:
    """``superkernel static-compile --nproc N``: launch (parent) or build/load this rank's part (child)."""
    from superkernel.static_kernel.settings import resolve_build_dir
    from superkernel.tools.distributed.launcher import LaunchError, check_gpus, check_nproc, in_job
    from superkernel.tools.distributed.optimize import load_tp_plan
    from superkernel.tools.distributed.static_build import StaticBuildOptions, build_rank, check_mode
    from superkernel.tools.static_session import check_cache_len, check_plan

    try:
        check_nproc(args.nproc)
        if not in_job():
            check_gpus(args.nproc, getattr(args, "device", None))
    except LaunchError as exc:
        sys.stderr.write(f"superkernel static-compile: error: {exc}\n")
        return 2
    plan = load_tp_plan(args.tp_plan) if args.tp_plan is not None else None
    build_dir = resolve_build_dir(args.build_dir)
    check_plan(args.config)  # bad input is one line here, before any rank starts
    check_mode(args.mode, args.config)
    check_cache_len(args.prompt_len, args.max_cache_len or args.prompt_len + 36)
    if not in_job():
        return _launch(args, "superkernel static-compile")
    source = _plan_source(args.tp_plan)
    return build_rank(StaticBuildOptions(
        model=args.model, build_dir=build_dir, batch_sizes=args.batch_sizes, plan=args.config, mode=args.mode,
        prompt_len=args.prompt_len, max_cache_len=args.max_cache_len, seed=args.seed, threads=args.threads,
        tp_plan=plan, tp_plan_source=source, as_json=args.json))


def _launch(args: argparse.Namespace, prog: str) -> int:
    """Start the job's ranks (this process becomes their watchdog); a launch failure is one line, exit 1."""
    from superkernel.tools.distributed.launcher import LaunchError, launch

    try:
        return launch(args.argv, args.nproc)
    except LaunchError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 1


def _plan_source(tp_plan: Path | None) -> str:
    return f"--tp-plan {tp_plan}" if tp_plan is not None else "the model's transformers tp_plan"
