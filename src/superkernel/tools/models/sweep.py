"""One architecture through the harness ``superkernel analyze`` / ``optimize`` use, in this process.

:func:`sweep_one` is what ``benchmarks/hf_sweep.py`` runs for every causal-LM architecture
transformers registers (:mod:`.registry`), and what the CI subset in ``tests/`` runs for a
few: eligibility in eager (:mod:`.eligibility`), the structure analysis and the
``decoder_layer`` plan, then the reduce-overhead plan against its exactness reference
(bit-exact, ``torch.equal``) with Dynamo's recompiles counted in the timed steps. It skips
what costs the most and is not about the architecture: the plain torch.compile baseline
and the speed measurement (``optimize`` does both).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

PROMPT_LEN, STEPS, WARMUP = 20, 4, 2  # the prompt is longer than the tiny sliding windows (16): they roll


def sweep_one(model_type: str, *, strategy: str = "decoder_layer", mode: str = "reduce-overhead",
              steps: int = STEPS, warmup: int = WARMUP, prompt_len: int = PROMPT_LEN,
              quantize: str | None = None) -> dict[str, Any]:
    """A row of the sweep's table for ``model_type`` (see module doc); never raises for the model's sake.
    ``quantize``: the model is quantized first (``superkernel.tools.quantize``; the row compares the plan with
    the *quantized* eager model: greedy-token agreement and max logit difference)."""
    import superkernel
    from superkernel.pipeline.capture_fallback import SuperKernelCaptureFallbackWarning
    from superkernel.tools.advisor.compiling import compile_superkernel
    from superkernel.tools.advisor.strategies import plan_for
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.decode import prepare, run_decode
    from superkernel.tools.models.eligibility import _reason, probe
    from superkernel.tools.models.registry import build_tiny

    row = probe(model_type, prompt_len=prompt_len)
    if not row["eligible"]:
        return row
    start = time.perf_counter()
    stage = "analyze"
    model = build_tiny(model_type)
    try:
        if quantize:
            from superkernel.tools.quantize import quantize_model

            stage = "quantize"
            row["quantization"] = quantize_model(model, quantize).to_dict()
            stage = "analyze"
        structure = analyze_structure(model)
        plan = plan_for(strategy, structure)
        row["scopes"] = len(plan.scopes)
        row["strategy"] = strategy
        if structure.parallel_lists:  # no module per layer: each layer's scope is entry i of these lists
            row["layer_lists"] = structure.parallel_lists
        if not plan.scopes:
            row.update(exit=1, stage=stage, reason=f"strategy {strategy} finds no module to scope")
            return row
        stage = "prepare"
        session = prepare(model, prompt_len=prompt_len, steps=steps, warmup=warmup, seed=0)
        eager = run_decode(session, session.step_fn())
        row["static_mask"] = session.attention_mask is not None  # the model's default mask grows (tools.default_mask)
        superkernel.apply_scopes(model, plan.scopes)
        torch._dynamo.reset()  # no frame compiled before (another model, another test) meets this row's guards
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                stage = "reference"
                ref_step, _ = compile_superkernel(session, mode, run_eagerly=True)
                reference = run_decode(session, ref_step)
                torch._dynamo.reset()  # the plan's first call must not fail the reference's guards
                stage = "plan"
                step, backend = compile_superkernel(session, mode)
                planned = run_decode(session, step)
                ex = superkernel.explain(backend)
        finally:
            superkernel.remove_scopes(model)
            torch._dynamo.reset()
        fallbacks = sorted({str(w.message)[:300] for w in caught
                            if issubclass(w.category, SuperKernelCaptureFallbackWarning)})
        row.update(
            exit=0,
            bit_exact=bool(torch.equal(planned.logits, reference.logits)),
            max_abs_diff_vs_eager=float((planned.logits - eager.logits).abs().max()),
            greedy_agreement_vs_eager=float((planned.logits.argmax(-1) == eager.logits.argmax(-1)).double().mean()),
            recompiles_timed=max(reference.dynamo.recompiles_timed, planned.dynamo.recompiles_timed),
            recompiles_warmup=max(reference.dynamo.recompiles_warmup, planned.dynamo.recompiles_warmup),
            recompile_reasons=(planned.dynamo.reasons or reference.dynamo.reasons)[:3],
            limit_hit=planned.dynamo.limit_hit or reference.dynamo.limit_hit,
            graphs=len(ex.graphs), segments=sum(len(g.segments) for g in ex.graphs),
            graph_breaks=planned.dynamo.graph_breaks_first, capture_fallbacks=fallbacks,
            dynamic_sources=session.dynamic_sources, dynamic_shapes=session.compile_dynamic,
            compile_seconds=round(planned.compile_seconds, 2), reference_compile_seconds=round(
                reference.compile_seconds, 2))
    except Exception as exc:  # noqa: BLE001 - a failure of superkernel on this model is the row's result
        row.update(exit=1, stage=stage, reason=_reason(exc))
    row["sweep_seconds"] = round(time.perf_counter() - start, 2)
    return row
