"""Can an architecture run the decode harness at all? Measured in eager, with the reason when not.

An architecture is *eligible* for the sweep when its tiny config (:mod:`.registry`) builds,
prefills and decodes on a transformers ``StaticCache`` uncompiled, and two eager decodes
from the restored cache give identical logits (the harness restores the complete cache
state; a difference means state it cannot restore, or a model that is not deterministic).
Everything else is listed with the first line of what failed and where: a failure of eager
itself, never hidden as a superkernel failure.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch

#: Stages of the probe, in order; a failure names the stage it happened in.
STAGES = ("config", "build", "prefill", "decode", "repeat")


#: Why an architecture's measured failure is transformers' design, not ours: read in transformers
#: 5.23's source and added to the row's reason (the probe still runs: a fixed model becomes eligible).
EXPLAINED = {
    "cpmant": "CPM-Ant prepends config.prompt_length prompt tokens to every input (models/cpmant/modeling_cpmant.py:"
              "606-617) and its generate feeds the whole sequence every step, forward slicing the cached prefix "
              "off (:699-701, :640-642): no one-token decode step on a static cache exists",
    "prophetnet": "ProphetNet's decoder mask is [input, input] in prefill (models/prophetnet/modeling_prophetnet.py:"
                  "1293-1315) and None once a cache is filled (:1165-1175): a static cache's unwritten slots "
                  "cannot be masked",
    "xlm": "XLM takes its cache as `cache`, builds its masks from the input length (models/xlm/modeling_xlm.py:"
           "57-79, :795) and expects the whole sequence every step, slicing the cached prefix off (:808-815): no "
           "one-token decode step on a static cache exists (sweeps before the harness passed `cache` decoded it "
           "from an empty state)",
    "xlnet": "XLNet keeps its decode state in `mems` (models/xlnet/modeling_xlnet.py:1295), not a transformers "
             "Cache; config.max_position_embeddings=-1 means no limit (relative positions)",
}


def _where(exc: BaseException) -> str:
    """The innermost transformers frame of an exception (file:line), for the reason column."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "transformers" in frame.filename:
            return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
    return f"{frames[-1].filename.split('/src/')[-1]}:{frames[-1].lineno}" if frames else "?"


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:240] or type(exc).__name__
    return f"{type(exc).__name__}: {text} ({_where(exc)})"


def probe(model_type: str, *, prompt_len: int = 20, steps: int = 3, seed: int = 0) -> dict[str, Any]:
    """Build the tiny ``model_type`` and decode it eagerly twice; a row for the sweep's table."""
    from superkernel.tools.decode import prepare, run_decode
    from superkernel.tools.models.registry import build_tiny, tiny_config

    row: dict[str, Any] = {"model_type": model_type, "eligible": False}
    start = time.perf_counter()
    stage = "config"
    try:
        tiny_config(model_type)
        stage = "build"
        model = build_tiny(model_type, seed=seed)
        row["class"] = type(model).__name__
        row["parameters"] = sum(p.numel() for p in model.parameters())
        stage = "prefill"
        session = prepare(model, prompt_len=prompt_len, steps=steps, warmup=1, seed=seed)
        row["cache_layers"] = sorted({type(layer).__name__ for layer in getattr(session.cache, "layers", [])})
        row["growing_ints"] = session.growing_ints
        row["growing_tensors"] = session.growing_tensors
        stage = "decode"
        first = run_decode(session, session.step_fn())
        if not torch.isfinite(first.logits).all():
            raise FloatingPointError("eager decode gives non-finite logits")
        stage = "repeat"
        second = run_decode(session, session.step_fn())
        if not torch.equal(first.logits, second.logits):
            diff = (first.logits - second.logits).abs().max().item()
            raise AssertionError(f"two eager decodes from the restored cache differ (max abs diff {diff:.3g})")
        row["eligible"] = True
    except Exception as exc:  # noqa: BLE001 - every failure of eager is a row of the table, with its reason
        row.update(stage=stage, reason=_reason(exc))
        if model_type in EXPLAINED:
            row["reason"] += f" — {EXPLAINED[model_type]}"
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row
