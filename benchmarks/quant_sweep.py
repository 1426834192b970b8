"""Quantized models of the sweep's CI subset: reduce-overhead against its exactness reference and the quantized eager model.

    .venv/bin/python benchmarks/quant_sweep.py [--schemes int8-weight,w8a8,int4-weight]

For every model type of the CI subsets (``tools.models.registry.CI_SUBSET`` and the architecture sweep's,
``tools.models.archs.CI_SUBSET``, plus llama) and every scheme: the tiny model (seeded random weights) is
quantized with torchao (``superkernel.tools.quantize``), scoped per decoder layer and decoded through
:func:`superkernel.tools.models.sweep.sweep_one` — reduce-overhead bit for bit against its exactness
reference, and against the *quantized* eager model (greedy-token agreement, max logit difference: eager and
compiled transformers take different code paths, which activation quantization amplifies; see
docs/quantization.md). Writes ``benchmarks/results/quant_sweep.{json,md}``. The test suite runs two rows of it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemes", default="int8-weight,w8a8,int4-weight")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    import torch

    from superkernel.tools.models import archs, registry
    from superkernel.tools.models.sweep import sweep_one
    from superkernel.util import atomic_write

    torch.set_num_threads(1)
    types = sorted({*registry.CI_SUBSET, *(archs.ARCHS[name].model_type for name in archs.CI_SUBSET), "llama"})
    rows = []
    for model_type in types:
        for scheme in [s for s in args.schemes.split(",") if s]:
            row = sweep_one(model_type, quantize=scheme)
            row["scheme"] = scheme
            rows.append(row)
            print(model_type, scheme, {k: row.get(k) for k in ("exit", "bit_exact", "greedy_agreement_vs_eager",
                                                               "max_abs_diff_vs_eager", "reason")}, flush=True)
            torch._dynamo.reset()
    lines = ["# Quantized models of the sweep's CI subset (reduce-overhead, decoder_layer scopes)", "",
             f"torch {torch.__version__}; tiny models, seeded random weights; each plan against its exactness "
             "reference (bit for bit) and against the quantized eager model fed the same tokens.", "",
             "| model type | scheme | layers quantized | bit-exact vs reference | greedy tokens = quantized eager | "
             "max logit diff vs quantized eager | recompiles (timed) | result |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        q = r.get("quantization") or {}
        ok = r.get("exit") == 0
        lines.append(f"| {r['model_type']} | {r['scheme']} | {q.get('layers', '-')} | "
                     f"{r.get('bit_exact', '-') if ok else '-'} | "
                     f"{format(r['greedy_agreement_vs_eager'], '.0%') if ok else '-'} | "
                     f"{format(r['max_abs_diff_vs_eager'], '.2e') if ok else '-'} | {r.get('recompiles_timed', '-')} | "
                     f"{'ok' if ok else 'failed at ' + str(r.get('stage')) + ': ' + str(r.get('reason'))[:150]} |")
    args.output.mkdir(parents=True, exist_ok=True)
    atomic_write(args.output / "quant_sweep.json", json.dumps(rows, indent=2, default=str) + "\n")
    atomic_write(args.output / "quant_sweep.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r.get("exit") == 0 and r.get("bit_exact") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
