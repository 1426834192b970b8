"""One vLLM engine in one process, for the integration tests: ``python vllm_run.py SPEC.json OUT.json``.

SPEC: {"model": folder, "dtype": "float32", "backend": qualified name or null (vLLM's eager path),
"batches": [[prompt, ...], ...], "max_tokens": n, "env": {...}}. OUT: the greedy token ids and texts per prompt
of each batch (one generate call each), the prompt tokens each took from the prefix cache, the warnings the process
raised (the compile runs here: engine core and worker in this process), and what superkernel's vLLM backends
compiled (plans, scopes annotated, fallbacks, explain text).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    os.environ.update(spec.get("env", {}))
    from vllm import LLM, SamplingParams

    kwargs = dict(model=spec["model"], dtype=spec.get("dtype", "float32"), max_model_len=spec.get("max_model_len", 512),
                  seed=0, gpu_memory_utilization=spec.get("memory", 0.2), distributed_executor_backend="uni")
    if spec.get("backend"):
        kwargs["compilation_config"] = {"mode": 2, "backend": spec["backend"]}
    else:
        kwargs["enforce_eager"] = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = LLM(**kwargs)
        params = SamplingParams(temperature=0, max_tokens=spec.get("max_tokens", 16))
        batches = [llm.generate(batch, params) for batch in spec["batches"]]  # each list of prompts: one call
    result = {
        "token_ids": [[list(o.outputs[0].token_ids) for o in outs] for outs in batches],
        "texts": [[o.outputs[0].text for o in outs] for outs in batches],
        "cached": [[o.num_cached_tokens for o in outs] for outs in batches],  # prompt tokens from the prefix cache
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "backends": [],
    }
    if "superkernel.integrations.vllm.backends" in sys.modules:
        import superkernel
        from superkernel.integrations.vllm import backends

        for name, b in backends._made.items():
            result["backends"].append({"name": name, "plan": b.plan, "annotated": b.annotated, "aten_ops": b.aten_ops,
                                       "fallbacks": b.fallbacks, "explain": str(superkernel.explain(b))})
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
