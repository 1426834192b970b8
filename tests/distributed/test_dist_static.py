"""``superkernel static-compile --nproc 2`` (gloo, CPU): one builder per node, every rank loads, a fresh
job compiles nothing; a package for another world size is a one-line error unless rebuilt."""

from __future__ import annotations

import json
import zipfile

import pytest

from superkernel.static_kernel.settings import ENV_REBUILD, RankLayoutError

from ._helpers import cli

BUILD = ("--nproc", "2", "--prompt-len", "4", "--max-cache-len", "9", "--json")


def _ranks(result) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout[result.stdout.index("{"):])


@pytest.fixture(scope="module")
def jobs(dense_checkpoint, tmp_path_factory):
    """The building job, then a fresh job (new processes) on the same build directory."""
    build = tmp_path_factory.mktemp("build")
    first = cli("static-compile", "--model", str(dense_checkpoint), "--build-dir", str(build), *BUILD)
    second = cli("static-compile", "--model", str(dense_checkpoint), "--build-dir", str(build), *BUILD)
    return dense_checkpoint, build, first, second


def test_the_node_leader_builds_and_every_rank_runs_from_the_package(jobs):
    _, _, first, _ = jobs
    data = _ranks(first)
    assert data["world_size"] == 2 and data["served_every_rank"] and len(data["packages"]) == 1
    leader, other = data["ranks"]
    assert leader["builder"] and not other["builder"]
    built, loaded = leader["batches"][0], other["batches"][0]
    assert built["written"] == data["packages"] and other["batches"][0]["written"] == []  # one builder
    assert built["counters"]["frames_built"] == 1 and built["counters"].get("native_built", 0) >= 1
    c = loaded["counters"]
    assert c.get("frames_built", 0) == 0 and c["frames_loaded"] == 1 and c.get("native_built", 0) == 0
    assert c.get("compiled", 0) == 0 and c.get("fallback", 0) == 0 and c.get("native_fallback", 0) == 0
    assert loaded["dynamo_graphs"] == 0 and loaded["package"] == data["packages"][0]


def test_a_fresh_job_starts_from_the_package_without_compiling(jobs):
    _, _, first, second = jobs
    before, after = _ranks(first), _ranks(second)
    assert after["packages"] == before["packages"] and after["served_every_rank"]
    for old, new in zip(before["ranks"], after["ranks"]):
        b = new["batches"][0]
        c = b["counters"]
        assert b["written"] == []  # nothing new to build
        assert c.get("frames_built", 0) == 0 and c.get("native_built", 0) == 0 and c.get("compiled", 0) == 0
        assert c["frames_loaded"] == 1 and c.get("native_loaded", 0) >= 1 and b["dynamo_graphs"] == 0
        assert b["logits_sha256"] == old["batches"][0]["logits_sha256"]  # the compiling run's output, per rank


def test_the_package_records_the_rank_layout(jobs):
    _, _, first, _ = jobs
    path = _ranks(first)["packages"][0]
    with zipfile.ZipFile(path) as zf:
        env = json.loads(zf.read("manifest.json"))["environment"]
    assert env["world_size"] == "2" and env["local_world_size"] == "2"


def test_another_world_size_is_one_error_line(jobs):
    model, build, _, _ = jobs
    result = cli("static-compile", "--model", str(model), "--build-dir", str(build), "--mode", "reduce-overhead",
                 "--prompt-len", "4", "--max-cache-len", "9")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert "package built for world size 2, this job has world size 1" in lines[0]
    assert "superkernel static-compile --rebuild" in lines[0]


def test_rebuild_lets_a_job_build_for_its_own_world_size(jobs, monkeypatch):
    """The store's decision, in this (1-process) process: an error, unless --rebuild (its variable) is set."""
    import torch

    from superkernel.static_kernel.store import check_layout
    from superkernel.tools.static_session import build_config

    _, build, _, _ = jobs
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", ENV_REBUILD):
        monkeypatch.delenv(name, raising=False)
    cfg, _ = build_config(torch.nn.Module(), build, mode="reduce-overhead")
    with pytest.raises(RankLayoutError, match="package built for world size 2, this job has world size 1"):
        check_layout(cfg, build)
    monkeypatch.setenv(ENV_REBUILD, "1")
    check_layout(cfg, build)  # (no error: the job builds its own package)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv(ENV_REBUILD)
    check_layout(cfg, build)  # the job the package was built for


def test_bad_input_is_one_line_before_any_rank_starts(tmp_path, capsys, monkeypatch):
    """In this process (the command's own main): nothing is launched for bad input."""
    from superkernel.tools.cli import main

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for bad, says in ((("--build-dir", str(tmp_path), "--mode", "max-autotune"), "builds reduce-overhead packages only"),
                      (("--build-dir", str(tmp_path / "missing")), "does not exist"),
                      (("--build-dir", str(tmp_path), "--prompt-len", "4", "--max-cache-len", "8"),
                       "at least prompt-len + 5")):
        code = main(["static-compile", "--model", "llama-tiny", "--nproc", "2", *bad])
        err = capsys.readouterr().err
        assert code == 2 and says in err and "rank" not in err
        assert len(err.strip().splitlines()) == 1
