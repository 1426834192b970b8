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
