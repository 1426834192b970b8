"""Which ONNX Runtime operator forms are faster for the non-GEMM time left in real-width encoders?

    .venv/bin/python benchmarks/studies/onnx_kernel_alternatives.py [--rounds 200]

The candidates issue 25 names for graph-autofusion's remaining encoder time
(``results/onnx_op_shares_ga.md``), each as a pair of one-op-or-few micro-models at the real-width
shapes: the form ONNX Runtime runs today (A) and an exact alternative written with operators it
has (B). Both run under ORT_ENABLE_ALL (so A gets ONNX Runtime's own fusions), 1 intra-op
thread, in one process warmed by a throw-away session, interleaved paired rounds; the ratio B/A is
the median of per-round ratios with its 95 % interval (``superkernel.onnx.timing``). Outputs of
A and B are compared first (exact equality where the rewrite is exact). A ratio below 1 means the
alternative is a rule worth writing; above 1, not.
Writes benchmarks/results/onnx_kernel_alternatives.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)  # benchmarks/: results/ and the scripts this study builds on
RESULTS = os.path.join(BENCH, "results")
F32 = TensorProto.FLOAT


def _model(nodes, inputs, inits, opset=17) -> bytes:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F32, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", F32, None)],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()


def residual_layernorm(s: int, d: int) -> tuple[bytes, bytes, dict, bool]:
    """Add + LayerNormalization (ONNX Runtime fuses it into SkipLayerNormalization) vs Sum + LayerNormalization."""
    rng = np.random.default_rng(0)
    inits = {"g": rng.standard_normal(d).astype(np.float32), "b": rng.standard_normal(d).astype(np.float32)}
    ins = [("x", [1, s, d]), ("r", [1, s, d])]

    def form(op):
        return _model([helper.make_node(op, ["x", "r"], ["s"]),
                       helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-12)], ins,
                      inits)

    feeds = {"x": rng.standard_normal((1, s, d)).astype(np.float32), "r": rng.standard_normal((1, s, d)).astype(np.float32)}
    return form("Add"), form("Sum"), feeds, False  # different kernels: within tolerance, not bit-equal


def gelu_erf_unfused(s: int, f: int) -> tuple[bytes, bytes, dict, bool]:
    """com.microsoft Gelu vs the erf chain with its Add written as Sum (so ONNX Runtime cannot fuse it back)."""
    rng = np.random.default_rng(0)
    c = {"r2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    a = _model([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")], [("x", [1, s, f])], {})
    b = _model([helper.make_node("Div", ["x", "r2"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
                helper.make_node("Sum", ["e", "one"], ["p"]), helper.make_node("Mul", ["x", "p"], ["m"]),
                helper.make_node("Mul", ["m", "half"], ["y"])], [("x", [1, s, f])], c)
    return a, b, {"x": rng.standard_normal((1, s, f)).astype(np.float32)}, False


def attention_output_transposes(s: int, heads: int, hd: int) -> tuple[bytes, bytes, dict, bool]:
    """The legacy export's output chain after fused attention (Reshape, Transpose, no-op Reshape,
    Transpose back, Reshape) vs the two Reshapes alone: does ONNX Runtime already cancel it?"""
    d = heads * hd
    i64 = {"s1": np.array([0, 0, heads, hd]), "s2": np.array([1, -1, s, hd]), "s3": np.array([1, s, -1])}
    a = _model([helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3]),
                helper.make_node("Reshape", ["b", "s2"], ["c"]), helper.make_node("Transpose", ["c"], ["e"], perm=[0, 2, 1, 3]),
                helper.make_node("Reshape", ["e", "s3"], ["y"])], [("x", [1, s, d])], i64)
    b = _model([helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s3"], ["y"])],
               [("x", [1, s, d])], {"s1": i64["s1"], "s3": i64["s3"]})
    return a, b, {"x": np.random.default_rng(0).standard_normal((1, s, d)).astype(np.float32)}, True


def relative_position_gather(s: int, heads: int, k: int) -> tuple[bytes, bytes, dict, bool]:
    """DeBERTa's c2p GatherElements over [1, N, S, 2k] by constant relative-position ids vs a Gather
    of the flattened rows by constant flat ids."""
    idx = np.clip(np.arange(s)[:, None] - np.arange(s)[None, :] + k // 2, 0, k - 1).astype(np.int64)
    a = _model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=-1)], [("x", [1, heads, s, k])],
               {"i": np.broadcast_to(idx, (1, heads, s, s)).copy()})
    flat = (np.arange(s)[:, None] * k + idx).reshape(-1).astype(np.int64)
    b = _model([helper.make_node("Reshape", ["x", "s1"], ["a"]), helper.make_node("Gather", ["a", "f"], ["g"], axis=2),
                helper.make_node("Reshape", ["g", "s2"], ["y"])], [("x", [1, heads, s, k])],
               {"s1": np.array([1, heads, s * k]), "f": flat, "s2": np.array([1, heads, s, s])})
    return a, b, {"x": np.random.default_rng(0).standard_normal((1, heads, s, k)).astype(np.float32)}, True


CASES = {
    "residual LayerNorm, BERT [1,128,768]: Add+LN (ORT -> SkipLayerNormalization) vs Sum+LN": lambda: residual_layernorm(128, 768),
    "residual LayerNorm, CLIP [1,77,512]: Add+LN (ORT -> SkipLayerNormalization) vs Sum+LN": lambda: residual_layernorm(77, 512),
    "GELU, BERT FFN [1,128,3072]: com.microsoft Gelu vs erf chain (Sum, so ORT cannot re-fuse it)": lambda: gelu_erf_unfused(128, 3072),
    "attention output, BERT legacy [1,128,768]: R,T,R,T,R chain vs R,R": lambda: attention_output_transposes(128, 12, 64),
    "DeBERTa c2p gather [1,12,128,256]: GatherElements vs flat Gather": lambda: relative_position_gather(128, 12, 256),
}


def run(rounds: int) -> list[dict]:
    import onnxruntime as ort

    from superkernel.onnx import timing as T

    level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    rows = []
    for name, build in CASES.items():
        a, b, feeds, exact = build()
        sa, sb = T.session(a, level, 1), T.session(b, level, 1)
        ya, yb = sa.run(None, feeds)[0], sb.run(None, feeds)[0]
        same = bool(np.array_equal(ya, yb))
        diff = float(np.max(np.abs(ya.astype(np.float64) - yb)))
        if exact and not same:
            raise AssertionError(f"{name}: the alternative is meant to be exact but differs by {diff}")
        del sa, sb
        sessions, order = T.open_sessions([lambda m=a: T.session(m, level, 1), lambda m=b: T.session(m, level, 1)],
                                          len(rows), warm_feeds=feeds)
        ts = T.time_interleaved([(s, feeds) for s in sessions], rounds, 20)
        est = T.ratio_estimate(list(zip(ts[0], ts[1])))
        rows.append({"case": name, "a_us": float(np.median(ts[0]) * 1e6), "b_us": float(np.median(ts[1]) * 1e6),
                     "b_vs_a": est.ratio, "b_vs_a_ci": [est.lo, est.hi], "rounds": est.rounds,
                     "bit_equal": same, "max_abs_diff": diff, "created_first": "AB"[order[0]]})
        print(f"{name}: A {rows[-1]['a_us']:.1f} us, B {rows[-1]['b_us']:.1f} us, B/A {est.ratio:.3f} "
              f"[{est.lo:.3f}-{est.hi:.3f}]", flush=True)
    return rows


def markdown(result: dict) -> str:
    L = ["# ONNX Runtime kernel alternatives for the encoders' remaining non-GEMM time", "",
         f"{result['cpu']}, {result['cores']} cores (shared with other jobs); onnxruntime {result['onnxruntime']}; "
         f"ORT_ENABLE_ALL, 1 intra-op thread; {result['rounds']} interleaved paired rounds after 20 warm-up rounds, "
         "process warmed by a throw-away session, sessions in a seeded random order; B/A = median per-round ratio "
         f"[95 % interval]. Load (1 min) at start / end: {result['load'][0]:.2f} / {result['load'][1]:.2f}.", "",
         "| candidate (A vs B) | A us | B us | B/A [95 %] | outputs |", "|---|---:|---:|---:|---|"]
    for r in result["cases"]:
        out = "bit-equal" if r["bit_equal"] else f"max abs diff {r['max_abs_diff']:.1e}"
        L.append(f"| {r['case']} | {r['a_us']:.1f} | {r['b_us']:.1f} | {r['b_vs_a']:.3f} "
                 f"[{r['b_vs_a_ci'][0]:.3f}-{r['b_vs_a_ci'][1]:.3f}] | {out} |")
    L += ["", "Below 1: the alternative is faster (a rule worth writing: `sum_layernorm` is the first row). "
          "Above or at 1: ONNX Runtime's form stays."]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--out", default=RESULTS)
    a = p.parse_args(argv)
    import onnxruntime as ort

    from superkernel.util import cpu_name, write_results

    load0 = os.getloadavg()[0]
    rows = run(a.rounds)
    result = {"benchmark": "onnx_kernel_alternatives", "cpu": cpu_name(), "cores": os.cpu_count(),
              "onnxruntime": ort.__version__, "onnx": onnx.__version__, "rounds": a.rounds,
              "load": [load0, os.getloadavg()[0]], "cases": rows}
    write_results(a.out, "onnx_kernel_alternatives", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
