"""Start N ranks of a test script with torchrun's variables, as the launcher does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import superkernel

SRC = str(Path(superkernel.__file__).resolve().parents[1])


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")  # this checkout's superkernel
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    return env


def run_ranks(script: Path, args: list[str], world: int = 2, timeout: float = 240) -> list[dict]:
    from superkernel.tools.distributed.launcher import free_port

    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(script), *args], env=rank_env(r, world, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-2000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT "):]))
    return results


SMALL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, tie_word_embeddings=False)


def checkpoint(directory: Path, kind: str) -> Path:
    """A checkpoint with seeded random weights: ``dense`` (one Llama layer) or ``hybrid`` (Qwen3-MoE, two layers:
    a dense MLP, then a MoE block — one job shards attention, dense MLP and experts)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3MoeConfig

    if kind == "dense":
        config = LlamaConfig(**SMALL, intermediate_size=128)
    elif kind == "hybrid":
        config = Qwen3MoeConfig(**{**SMALL, "num_hidden_layers": 2}, intermediate_size=128, moe_intermediate_size=32,
                                head_dim=16, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                norm_topk_prob=True, mlp_only_layers=[0])
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory, safe_serialization=True)
    return directory


def cli_env() -> dict:
    """This process's environment without a job's variables, importing this checkout's superkernel."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m superkernel *argv`` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "superkernel", *argv], env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)
