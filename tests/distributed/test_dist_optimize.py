"""``superkernel optimize --nproc 2`` end to end (gloo, CPU) on a dense + MoE model, and its failures.

The model is a two-layer checkpoint (seeded random weights, conftest.py): a dense decoder layer and a MoE one, so
one job shards attention, a dense MLP and experts. The job compiles its one plan on both ranks and in the
single-process reference, so it is kept small: one strategy (whole decoder layers), one mode, 1 warm-up + 2 timed
steps, no torch.compile baseline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from superkernel.tools.cli import main

from ._helpers import cli as _cli
from ._helpers import cli_env

ARGS = ("--nproc", "2", "--mode", "reduce-overhead", "--steps", "2", "--warmup", "1", "--prompt-len", "4",
        "--no-torch-compile-baseline", "--quiet")


@pytest.fixture(scope="module")
def job(hybrid_checkpoint, tmp_path_factory):
    strategy = "decoder_layer"
    out = tmp_path_factory.mktemp("hybrid_out")
    result = _cli("optimize", "--model", str(hybrid_checkpoint), "--strategy", strategy, "--output", str(out), *ARGS)
    return result, out, strategy


def test_exits_zero_with_a_plan_that_passes_on_both_ranks(job):
    result, out, strategy = job
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["world_size"] == 2 and data["backend"] == "gloo"
    assert data["recommended"] == f"{strategy} / reduce-overhead"
    plan = next(r for r in data["results"] if r["name"] == data["recommended"])
    assert plan["passed_every_rank"] and plan["bit_exact_every_rank"]
    assert len(plan["rank_ms"]) == 2 and plan["job_ms"] >= max(plan["rank_ms"]) * 0.999
    assert [g["rank"] for g in data["per_rank"]] == [0, 1]
    for rank in data["per_rank"]:
        run = next(r for r in rank["runs"] if r["name"] == data["recommended"])
        assert run["bit_exact"] and run["passed"] and run["vs_single_max_abs"] < 1e-3
        assert run["recompiles_timed"] == 0 and run["recompiles_warmup"] == 0  # counted per rank (Dynamo's own)
    assert plan["recompiles_timed"] == [0, 0]
    styles = data["sharded"]
    assert styles["model.layers.0.self_attn.q_proj"] == "colwise" and styles["model.layers.1.self_attn.o_proj"] == "rowwise"
    assert styles["model.layers.0.mlp.down_proj"] == "rowwise"           # the dense MLP
    assert styles["model.layers.1.mlp.experts"] == "moe_tp_experts"      # the experts


def test_report_has_per_rank_times_collective_share_and_single_process(job):
    result, out, strategy = job
    report = (out / "superkernel_optimization_report.md").read_text()
    assert "rank 0 ms | rank 1 ms" in report and "Single-process run (same cores)" in report
    assert "recompiles (timed, per rank)" in report and " | 0 / 0 | passed" in report
    data = json.loads((out / "results.json").read_text())
    for rank_shares in data["collective_share"]:
        share = rank_shares[data["recommended"]]
        assert 0 < share["share"] <= 1.0 and share["events"]  # the profiler saw the all-reduces
    names = [r["name"] for r in data["single_process"]["runs"]]
    assert names[0] == "eager" and data["recommended"] in names
    assert (out / "superkernel.yaml").read_text().count("world_size: 2") == 1


def test_a_killed_rank_ends_the_job_with_one_line(tmp_path):
    """SIGKILL rank 1 of a running job: the command ends within 60 s, one error line, nothing written."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "superkernel", "optimize", "--model", "llama-tiny",
                             "--output", str(out), *ARGS], env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    children: list[int] = []
    deadline = time.monotonic() + 120
    while len(children) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        except OSError:
            children = []
    assert len(children) == 2, "the ranks did not start"
    time.sleep(3)
    os.kill(children[1], signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=90)
    assert time.monotonic() - killed < 60
    assert proc.returncode == 1
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("superkernel: error: rank 1 of 2 was killed by SIGKILL")
    assert not out.exists() or not any(out.iterdir())
    for pid in children:  # every rank is gone
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_bad_input_is_one_line_before_any_rank_starts(tmp_path, capsys, monkeypatch):
    """In this process (the command's own main): nothing is launched for bad input."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    code = main(["optimize", "--model", "llama-tiny", "--nproc", "2", "--mode", "fast", "--output", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [err.strip()] and "unknown mode" in err
    plan = tmp_path / "plan.yaml"
    plan.write_text("model.layers.*.mlp.down_proj: diagonal\n")
    code = main(["optimize", "--model", "llama-tiny", "--nproc", "2", "--tp-plan", str(plan), "--output",
                 str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code != 0
    assert "unknown style(s) diagonal" in err and len(err.strip().splitlines()) == 1
    for command in (["optimize", "--model", "llama-tiny", "--output", str(tmp_path / "o")],
                    ["bench", "--config", str(plan)]):  # a flag of the job, given to one process: refused
        code = main([*command, "--no-torch-compile-baseline"])
        err = capsys.readouterr().err
        assert code == 2 and "--no-torch-compile-baseline goes with --nproc" in err, err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_bench_reruns_the_plan_on_two_ranks(job):
    """``bench --nproc 2`` with the plan the job wrote: the report on stdout, nothing written."""
    result, out, strategy = job
    plan = out / "superkernel.yaml"
    before = sorted(p.name for p in out.iterdir())
    model = json.loads((out / "results.json").read_text())["model"]
    bench = _cli("bench", "--config", str(plan), "--model", model, *ARGS)
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert "tensor parallel over 2 ranks" in bench.stdout and "custom / reduce-overhead" in bench.stdout
    assert "passed, bit-exact" in bench.stdout
    assert sorted(p.name for p in out.iterdir()) == before
