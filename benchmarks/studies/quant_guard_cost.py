"""What Dynamo's guard check costs a quantized decode step: the same superkernel max-autotune step with every
guard and with none, in one process, interleaved rounds.

    .venv/bin/python benchmarks/studies/quant_guard_cost.py [--scheme w8a8] [--layers 24] [--rounds 7]

A torchao-quantized weight is a tensor subclass: Dynamo guards it and its inner tensors (about 200 guards a
layer of a Qwen2-0.5B-shaped decoder), and the whole guard tree runs before every step. ``precompile_step``
(which replaces the tree by a state watch) cannot take torchao's tensors, so this measures what the tree costs
by compiling the same step a second time with ``guard_filter_fn`` dropping every guard — a measurement
only: such a step would not notice a changed model — and by calling the first step under torch's
``skip_guard_eval_unsafe`` stance (``torch.compiler.set_stance``), which runs only the guards that tell compiled
entries apart: what a loop that owns its steady state could use. Writes ``benchmarks/results/quant_guard_cost.md``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="w8a8")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precompiled", action="store_true",
                        help="add superkernel.precompile_step of the same step (its frame skips the quantized weights' "
                             "guards; the watch stands in for them); implies --stance-only")
    parser.add_argument("--stance-only", action="store_true",
                        help="leave out the second compile (every guard dropped): compare with the stance only")
    args = parser.parse_args(argv)
    args.stance_only = args.stance_only or args.precompiled
    torch.set_num_threads(args.threads)
    import superkernel as sk
    from quant_decode import build
    from superkernel.tools.advisor.compiling import own_code
    from superkernel.tools.advisor.strategies import plan_for
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.decode import prepare, run_decode
    from superkernel.tools.quantize import quantize_model
    from superkernel.util import atomic_write

    base = build(args.layers)
    model = copy.deepcopy(base)
    quantize_model(model, args.scheme)
    sk.apply_scopes(model, plan_for("all_layers", analyze_structure(base)).scopes)
    session = prepare(model, prompt_len=32, steps=16, warmup=3)
    backend = sk.get_backend(sk.CompilerConfig.from_dict({"mode": "max-autotune"}))
    guarded = torch.compile(own_code(session.step_fn(), "guarded"), backend=backend)

    def steady(*args: object) -> object:
        """The same compiled step, called under torch's ``skip_guard_eval_unsafe`` stance: Dynamo runs only the
        guards that tell its compiled entries apart (none with one entry)."""
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return guarded(*args)

    steps = {"every guard": guarded}
    if not args.stance_only:
        steps["no guard"] = torch.compile(own_code(session.step_fn(), "unguarded"), backend=backend,
                                          options={"guard_filter_fn": lambda entries: [False] * len(entries)})
    steps["skip_guard_eval_unsafe"] = steady
    if args.precompiled:
        with torch.no_grad(), session.dynamo_config():
            steps["precompile_step"] = sk.precompile_step(own_code(session.step_fn(), "precompiled"),
                                                          session.inputs(0), sk.CompilerConfig.from_dict(
                                                              {"mode": "max-autotune"}))
    times: dict[str, list[float]] = {name: [] for name in steps}
    with torch.no_grad(), session.dynamo_config():
        first = {name: run_decode(session, step).logits for name, step in steps.items()}
        assert all(torch.equal(first["every guard"], v) for v in first.values()), "the steps must compute the same"
        for r in range(args.rounds):
            for name in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
                start = time.perf_counter()
                run_decode(session, steps[name])
                times[name].append((time.perf_counter() - start) * 1e3)
    med = {name: statistics.median(t) for name, t in times.items()}
    calls = 19  # a decode run: 3 warm-up + 16 timed steps through the compiled step (the prompt runs eagerly)
    lines = [f"# Dynamo's guard check on a quantized decode step ({args.scheme}, {args.layers} layers)", "",
             f"torch {torch.__version__}, {args.threads} thread(s), superkernel max-autotune all_layers, "
             f"{args.rounds} interleaved rounds, each one decode run ({calls} calls of the compiled step and the "
             "prompt); median per run, and that over the calls. Same process, same compiled graph, outputs "
             "equal. `benchmarks/studies/quant_guard_cost.py`.", "",
             "| step | ms per decode run | ms per step (run / 19) | vs every guard |", "|---|---|---|---|"]
    lines += [f"| {name} | {med[name]:.1f} | {med[name] / calls:.2f} | {med[name] / med['every guard']:.3f} |"
              for name in steps]
    name = ("quant_guard_cost_precompiled.md" if args.precompiled else
            "quant_guard_cost_stance.md" if args.stance_only else "quant_guard_cost.md")
    out = HERE.parent / "results" / name
    atomic_write(out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
