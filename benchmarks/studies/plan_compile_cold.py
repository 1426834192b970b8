"""One scope plan's compile on the real model, in a fresh process: compile seconds, what the backend shared, step ms.

    SUPERKERNEL_CACHE_DIR=<empty> TORCHINDUCTOR_CACHE_DIR=<empty> PYTHONPATH=src \
        .venv/bin/python benchmarks/studies/plan_compile_cold.py decoder_layer max-autotune [smollm2-135m]

Compile = the first decode step (Dynamo, AOTAutograd, the plan's build); then 36 decode steps (4 warm-up) at
1 thread, median ms. Used for demo_time.md's "decoder_layer vs all_layers" figures (issue 59: identical layers
compiled once).
"""

from __future__ import annotations

import sys
import time

import torch

import superkernel
from superkernel.tools.advisor.compiling import compile_superkernel
from superkernel.tools.advisor.strategies import parse_strategy, select_plans
from superkernel.tools.advisor.structure import analyze_structure
from superkernel.tools.decode import prepare, run_decode
from superkernel.tools.models import load_model


def main(strategy: str, mode: str, model: str = "smollm2-135m") -> None:
    torch.set_num_threads(1)
    loaded = load_model(model, seed=0, device="cpu")
    session = prepare(loaded.model, prompt_len=32, steps=32, warmup=4, seed=0, device="cpu")
    plan = select_plans(parse_strategy(strategy, None, {}), analyze_structure(loaded.model))[0]
    superkernel.apply_scopes(loaded.model, plan.scopes)
    start = time.perf_counter()
    step, backend = compile_superkernel(session, mode)
    with torch.no_grad(), session.dynamo_config():
        step(*session.inputs(0))
    print(f"{model} {strategy} / {mode}: compile {time.perf_counter() - start:.1f} s", flush=True)
    print(dict(backend.counters))
    session.restore_cache()
    print(f"median {run_decode(session, step, label=plan.strategy).median_ms:.2f} ms per step (1 thread)")


if __name__ == "__main__":
    main(*sys.argv[1:])
