"""Where the real-width decode step's time goes in each tool's model: ONNX Runtime's profiler,
per node and per operator type, P1 / P2 / P3 / GA side by side.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python benchmarks/studies/onnx_decode_profile.py [--exporters legacy,dynamo] [--runs 15]

For each exporter of ``realsuite``'s ``qwen2_decode`` (the export ``onnx_real_width.py`` caches in
``--models``), P2 (ORT transformers optimizer), P3 (onnxscript optimize_for_ort) and GA
(graph-autofusion, calibrated and end-to-end checked) are made in ``--work`` (reused when
there), then the four run in one process under ORT's profiler (ORT_ENABLE_ALL, 1 thread, the
process warmed by a throw-away session, sessions created in a seeded random order, runs
interleaved). A node's time is the median of its kernel time over ``--runs`` runs (robust to
the preemptions of a shared machine); an operator type's time is the sum over its nodes.
Run it with glibc's huge-page tunable (above) to compare the tools rather than their sessions'
page luck: on 4 KiB pages a session of this ~1 GB model keeps a speed of its own (see
``onnx_real_width_decode.md``). Writes ``--out``/onnx_real_width_decode_profile.json and .md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)  # benchmarks/: results/ and the scripts this study builds on
sys.path[:0] = [HERE, BENCH]

import onnx_autofusion as OA  # noqa: E402
from onnx_real_width import model_path  # noqa: E402

from superkernel.onnx import realsuite  # noqa: E402
from superkernel.util import write_results  # noqa: E402

TOOLS = ("P1", "P2", "P3", "GA")


def make_tools(src: str, work: str, exporter: str) -> dict[str, str]:
    """P1 = ``src``; P2, P3 and GA written to ``work`` unless already there."""
    from superkernel.onnx.cli import main as gaf

    d = os.path.join(work, exporter)
    os.makedirs(d, exist_ok=True)
    sh = realsuite.SHAPES["qwen2_decode"]
    paths = {"P1": src}
    for tool, fn in (("P2", lambda dst: OA.run_p2(src, dst, sh.model_type, sh.heads, sh.hidden)),
                     ("P3", lambda dst: OA.run_p3(src, dst))):
        dst = os.path.join(d, f"{tool}.onnx")
        if not os.path.exists(dst):
            fn(dst)
        paths[tool] = dst
    ga = os.path.join(d, "GA.onnx")
    if not os.path.exists(ga):
        code = gaf(["--input", src, "--output", ga, "--report", os.path.join(d, "GA_report.md"), "--quiet",
                    "--threads", "1", "--calibration-cache", os.path.join(d, "calibration.json")])
        if code != 0:
            raise SystemExit(f"graph-autofusion failed on {src} (exit {code})")
    paths["GA"] = ga
    return paths


def profile(paths: dict[str, str], runs: int, seed: int = 0) -> dict:
    import onnxruntime as ort

    from superkernel.onnx import timing as T
    from superkernel.onnx import verify as V

    names = list(paths)
    with tempfile.TemporaryDirectory(prefix="sk_decode_profile_") as tmp:
        def make(name: str):
            so = ort.SessionOptions()
            so.intra_op_num_threads = so.inter_op_num_threads = 1
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.log_severity_level = 3
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(tmp, name)
            return ort.InferenceSession(paths[name], so, providers=["CPUExecutionProvider"])

        T.warm_process(lambda: V.session(paths["P1"], ort.GraphOptimizationLevel.ORT_ENABLE_ALL, 1),
                       lambda s: V.make_inputs(s, {}, V.VERIFY_DEFAULT_DIM, 0))
        sessions, order = T.create_in_order([lambda n=n: make(n) for n in names], seed)
        feeds = V.make_inputs(sessions[0], {}, V.VERIFY_DEFAULT_DIM, 0)
        T.time_interleaved([(s, feeds) for s in sessions], runs, warmup=3)
        huge = T.anon_huge_pages_kb()
        out = {"creation_order": [names[i] for i in order], "anon_huge_pages_kb": huge, "tools": {}}
        for name, s in zip(names, sessions):
            with open(s.end_profiling(), encoding="utf-8") as f:
                events = json.load(f)
            model_runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
            start = model_runs[-runs]["ts"]
            samples: dict[str, list[float]] = collections.defaultdict(list)
            op_of: dict[str, str] = {}
            for e in events:
                if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
                    node = e["name"][: -len("_kernel_time")]
                    samples[node].append(e["dur"])
                    op_of[node] = e["args"]["op_name"]
            per_node = {n: statistics.median(v) for n, v in samples.items()}
            per_op: collections.Counter[str] = collections.Counter()
            for n, us in per_node.items():
                per_op[op_of[n]] += us
            top = sorted(per_node.items(), key=lambda kv: -kv[1])[:6]
            out["tools"][name] = {"run_us": statistics.median(e["dur"] for e in model_runs[-runs:]),
                                  "kernel_us": sum(per_node.values()), "nodes": len(per_node),
                                  "per_op_us": dict(per_op), "top_nodes": [[n, op_of[n], us] for n, us in top]}
    return out


def markdown(result: dict) -> str:
    L = ["# Real-width decode step: kernel time per operator type, P1 / P2 / P3 / GA", "",
         f"{result['hardware']}; onnxruntime {result['onnxruntime']}; {result['runs']} profiled runs per tool after 3 "
         "warm-up runs, interleaved in one process (warmed, random creation order); a node's time is its median "
         "kernel time (per-node framework overhead is not in it); load (1 min) at start / end "
         f"{result['load'][0]:.2f} / {result['load'][1]:.2f}; GLIBC_TUNABLES={result['glibc_tunables'] or '-'}.", ""]
    for exp, r in result["exporters"].items():
        tools = list(r["tools"])
        L += [f"## qwen2_decode/{exp} (creation order {', '.join(r['creation_order'])}; anonymous memory on huge "
              f"pages: {r['anon_huge_pages_kb']} kB)", "",
              "| | " + " | ".join(tools) + " |", "|---|" + "---:|" * len(tools)]
        L.append("| model run, median us | " + " | ".join(f"{r['tools'][t]['run_us']:.0f}" for t in tools) + " |")
        L.append("| kernel sum, us | " + " | ".join(f"{r['tools'][t]['kernel_us']:.0f}" for t in tools) + " |")
        L.append("| nodes | " + " | ".join(str(r['tools'][t]['nodes']) for t in tools) + " |")
        ops = sorted({o for t in tools for o in r["tools"][t]["per_op_us"]},
                     key=lambda o: -max(r["tools"][t]["per_op_us"].get(o, 0) for t in tools))
        for o in ops:
            L.append(f"| {o} | " + " | ".join(f"{r['tools'][t]['per_op_us'].get(o, 0):.0f}" for t in tools) + " |")
        L += ["", "Largest nodes: " + "; ".join(
            f"{t}: " + ", ".join(f"{n} ({op}) {us:.0f} us" for n, op, us in r["tools"][t]["top_nodes"][:2])
            for t in tools), ""]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exporters", default="legacy,dynamo")
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--models", default=os.path.join(tempfile.gettempdir(), "superkernel_real_width_models"))
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "superkernel_decode_profile"),
                   help="where P2, P3 and GA are written (and reused)")
    p.add_argument("--out", default=os.path.join(BENCH, "results"))
    a = p.parse_args(argv)
    import onnxruntime as ort
    import torch

    from superkernel.tools.advisor.environment import hardware

    load0 = os.getloadavg()[0]
    result = {"hardware": hardware(torch.device("cpu")).split(", torch threads")[0] + ")",
              "onnxruntime": ort.__version__, "runs": a.runs, "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
              "exporters": {}}
    for exp in [e for e in a.exporters.split(",") if e]:
        paths = make_tools(model_path(a.models, "qwen2_decode", exp), a.work, exp)
        result["exporters"][exp] = profile(paths, a.runs)
        print(f"qwen2_decode/{exp}: " + ", ".join(f"{t} {v['run_us'] / 1e3:.1f} ms"
                                                  for t, v in result["exporters"][exp]["tools"].items()), flush=True)
    result["load"] = [load0, os.getloadavg()[0]]
    write_results(a.out, "onnx_real_width_decode_profile", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
