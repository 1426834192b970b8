"""Session-order check: does the order in which ORT sessions are created change a measured ratio?

    .venv/bin/python benchmarks/studies/onnx_session_order.py [--model A.onnx --fused B.onnx] [--pairs 4]

The ratio B/A (median of per-round paired ratios, 95 % interval) is measured in fresh
processes, half of them creating A's session first and half B's, each both ways:

- ``raw``: no throw-away session (what a plain harness does: the first session created in
  the process is a timed one);
- ``warmed``: a throw-away session first, then one session each;
- ``balanced``: superkernel.onnx.timing.PairSampler (warm-up, then two sessions per model
  created ABBA when A is "first", BAAB when B is), what calibration and the end-to-end
  check use.

Verdict per way: the order effect (median ratio with A first minus with B first, over the
processes) against the noise (the typical half-width of one process's interval). "within
noise" when the effect is smaller than the noise. Default models: the tiny suite's Llama decode
step (legacy export) and graph-autofusion's output for it.
Writes benchmarks/results/onnx_session_order.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)  # benchmarks/: results/ and the scripts this study builds on
RESULTS = os.path.join(BENCH, "results")
WAYS = ("raw", "warmed", "balanced")


def child(a: str, b: str, first: str, way: str, rounds: int) -> dict:
    import onnxruntime as ort

    from superkernel.onnx import timing as T
    from superkernel.onnx import verify as V

    level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    feeds = V.make_inputs(V.session(a, ort.GraphOptimizationLevel.ORT_DISABLE_ALL), {}, V.VERIFY_DEFAULT_DIM, 0)
    # (the DISABLE_ALL session above only reads input metadata; it is never run, so it does not warm anything)
    if way == "balanced":
        seed = next(s for s in range(100) if T.balanced_order(s)[0] == (0 if first == "A" else 1))
        sampler = T.PairSampler(a, b, feeds, warmup=3, seed=seed)
        pairs = sampler.sample(rounds)
        e = T.ratio_estimate(pairs)
        return {"first": first, "way": way, "ratio": e.ratio, "lo": e.lo, "hi": e.hi, "rounds": rounds,
                "a_ms": statistics.median(x for x, _ in pairs), "b_ms": statistics.median(y for _, y in pairs)}
    if way == "warmed":
        T.warm_process(lambda: V.session(a, level, 1), feeds)
    make = {"A": lambda: V.session(a, level, 1), "B": lambda: V.session(b, level, 1)}
    order = [first, "B" if first == "A" else "A"]
    sess = {k: make[k]() for k in order}
    xs = T.time_interleaved([(sess["A"], feeds), (sess["B"], feeds)], rounds, 3)
    e = T.ratio_estimate(list(zip(xs[0], xs[1])))
    return {"first": first, "way": way, "ratio": e.ratio, "lo": e.lo, "hi": e.hi, "rounds": rounds,
            "a_ms": statistics.median(xs[0]) * 1e3, "b_ms": statistics.median(xs[1]) * 1e3}


def default_models(tmp: str) -> tuple[str, str]:
    from superkernel.onnx import hfsuite
    from superkernel.onnx.cli import main as gaf

    a = hfsuite.export("llama_decode", "legacy", os.path.join(tmp, "decode.onnx"))
    b = os.path.join(tmp, "decode_ga.onnx")
    if gaf(["--input", a, "--output", b, "--quiet", "--threads", "1",
            "--calibration-cache", os.path.join(tmp, "cal.json")]) != 0:
        raise SystemExit("graph-autofusion failed on the default model")
    return a, b


def verdicts(rows: list[dict]) -> dict:
    out = {}
    for way in WAYS:
        rs = [r for r in rows if r["way"] == way]
        a_first = [r["ratio"] for r in rs if r["first"] == "A"]
        b_first = [r["ratio"] for r in rs if r["first"] == "B"]
        if not a_first or not b_first:
            continue
        effect = statistics.median(a_first) - statistics.median(b_first)
        noise = statistics.median((r["hi"] - r["lo"]) / 2 for r in rs)
        out[way] = {
            "ratio_a_first": statistics.median(a_first), "ratio_b_first": statistics.median(b_first),
            "order_effect": effect, "noise_half_width": noise,
            "verdict": "within noise" if abs(effect) <= noise else "order changes the ratio"}
    return out


def main(argv=None) -> int:
    from superkernel.timing import rotation

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="")
    p.add_argument("--fused", default="")
    p.add_argument("--pairs", type=int, default=4, help="processes per (way, first) combination")
    p.add_argument("--ways", default=",".join(WAYS))
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        ma, mb, first, way, rounds = a.child
        print(json.dumps(child(ma, mb, first, way, int(rounds))))
        return 0
    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ma, mb = (a.model, a.fused) if a.model and a.fused else default_models(tmp)
        for i in range(a.pairs):
            for way in a.ways.split(","):
                for first in (("A", "B")[j] for j in rotation(2, i)):
                    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", ma, mb, first, way,
                                          str(a.rounds)], capture_output=True, text=True, check=True).stdout
                    rows.append(json.loads(out.strip().splitlines()[-1]))
                    r = rows[-1]
                    print(f"{r['way']:<8} {r['first']} first: B/A {r['ratio']:.3f} "
                          f"[{r['lo']:.3f}-{r['hi']:.3f}]", flush=True)
        models = {"A": os.path.basename(ma), "B": os.path.basename(mb)}
    v = verdicts(rows)
    result = {"benchmark": "onnx_session_order", "models": models, "rounds": a.rounds, "pairs": a.pairs,
              "load": [round(load0, 2), round(os.getloadavg()[0], 2)], "cpu_count": os.cpu_count(),
              "verdicts": v, "processes": rows, "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    from superkernel.util import atomic_write

    os.makedirs(a.out, exist_ok=True)
    atomic_write(os.path.join(a.out, "onnx_session_order.json"), json.dumps(result, indent=1))
    L = ["# Session creation order vs measured ratio", "",
         f"A = {models['A']}, B = {models['B']}; {a.pairs} processes per (way, who is created first), "
         f"{a.rounds} interleaved rounds each, 1 thread; {os.cpu_count()} cores shared, 1-min load "
         f"{result['load'][0]} / {result['load'][1]} at start / end; {result['time']}.", "",
         "| way | B/A, A created first | B/A, B created first | order effect | noise (half 95 % interval) | verdict |",
         "|---|---|---|---|---|---|"]
    for k, x in v.items():
        L.append(f"| {k} | {x['ratio_a_first']:.3f} | {x['ratio_b_first']:.3f} | {x['order_effect']:+.3f} | "
                 f"{x['noise_half_width']:.3f} | {x['verdict']} |")
    atomic_write(os.path.join(a.out, "onnx_session_order.md"), "\n".join(L) + "\n")
    print(json.dumps(v, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
