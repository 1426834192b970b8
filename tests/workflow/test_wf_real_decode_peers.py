"""benchmarks/real_decode_peers.py (issue 59): its rows and ratios, and a smoke run on the real model (structure and
checks only, no timing assertions; llama.cpp rows say "not installed" where llama-cpp-python is absent)."""

from __future__ import annotations

import json

import pytest

from tests._benchmarks import load_benchmark


def _report():
    load_benchmark("real_decode_peers")  # puts benchmarks/ on sys.path for its helper modules
    import real_decode_peers_report

    return real_decode_peers_report


def test_runner_names_are_checked_and_the_default_leaves_quantized_eager_out(capsys):
    bench = load_benchmark("real_decode_peers")
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--runners", "eager-float32,vllm-float32"])
    assert exc.value.code == 2 and "vllm-float32" in capsys.readouterr().err
    args = bench.parse_args([])
    assert "eager-w8a8" not in args.wanted and "superkernel-w8a8" in args.wanted and "llamacpp-Q4_0" in args.wanted
    smoke = bench.parse_args(["--smoke", "--skip", "llamacpp-F32"])
    assert (smoke.layers, smoke.rounds) == (2, 1) and "llamacpp-F32" not in smoke.wanted


def test_ratios_are_to_the_fastest_checked_peer_of_the_type():
    rep = _report()
    ok = {"passed": True}

    def runner(name, kind, model, ms, check=ok):
        return rep.Runner(name, kind, model, round_ms=ms, steps_ms=ms, check=check)

    runners = [runner("eager-float32", "eager", "float32", [40.0, 44.0]),
               runner("compile-float32", "torch.compile", "float32", [30.0, 33.0], {"passed": False}),  # wrong: no peer
               runner("llamacpp-F32", "llama.cpp", "F32", [20.0, 22.0]),
               runner("superkernel-float32", "superkernel", "float32", [10.0, 10.0]),
               runner("superkernel-int8-weight", "superkernel", "int8-weight", [5.0, 5.0]),
               rep.Runner("llamacpp-Q8_0", "llama.cpp", "Q8_0", note="not installed")]
    rows = {r["runner"]: r for r in (rep.row(r, runners) for r in runners)}
    sk = rows["superkernel-float32"]
    assert sk["fastest_peer"] == "llamacpp-F32" and sk["vs_fastest_peer"] == pytest.approx((0.5 + 10 / 22) / 2)
    assert sk["vs_llamacpp"]["file"] == "F32"
    assert "fastest_peer" not in rows["superkernel-int8-weight"]  # its peer did not run
    assert rows["llamacpp-Q8_0"]["median_ms"] is None and rows["llamacpp-Q8_0"]["type"] == "int8"


@pytest.mark.slow
def test_smoke_run_writes_checked_rows(tmp_path):
    from superkernel.tools.models.real import RealModelMissing, locate

    try:
        locate("smollm2-135m")
    except RealModelMissing as exc:
        pytest.skip(str(exc))
    bench = load_benchmark("real_decode_peers")
    runners = "eager-float32,compile-float32,superkernel-w8a8,llamacpp-Q8_0"
    args = ["--smoke", "--layers", "1", "--runners", runners, "--out", str(tmp_path), "--tag", "_t", "--warm-cache"]
    assert bench.main(args) == 0
    result = json.loads((tmp_path / "real_decode_peers_t.json").read_text())
    text = (tmp_path / "real_decode_peers_t.md").read_text()
    assert result["smoke"] and result["layers"] == 1 and result["cpu"]["name"] and "avx2" in result["cpu"]["flags"]
    rows = {r["runner"]: r for r in result["rows"]}
    assert list(rows) == runners.split(",")
    for name in ("eager-float32", "compile-float32", "superkernel-w8a8"):
        r = rows[name]
        assert r["check"]["passed"] and r["check"]["rounds"] == 2, (name, r["check"])  # the compile run + 1 round
        assert r["median_ms"] > 0 and r["quality"]["tokens"] == 4 and f"| {name} |" in text
        assert "greedy_agreement_min" in r["check"]
    assert rows["superkernel-w8a8"]["note"].startswith("step: precompiled")
    assert "W8A8 rounding floor" in result["models"]["w8a8"]
    assert rows["compile-float32"]["vs_fastest_peer"] is not None
    llama = rows["llamacpp-Q8_0"]
    if result["llamacpp"]["installed"]:
        assert llama["check"]["passed"] and llama["check"]["rounds"] == 2 and llama["median_ms"] > 0
    else:
        assert llama["note"] == "not installed" and "| llamacpp-Q8_0 | int8 | not installed |" in text
