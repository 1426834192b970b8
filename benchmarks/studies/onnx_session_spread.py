"""How far apart do sessions of the SAME model run? With and without transparent huge pages.

    .venv/bin/python benchmarks/studies/onnx_session_spread.py [--case qwen2_decode] [--exporter dynamo] [--sessions 4]

One model (a ``realsuite`` export, cached by ``onnx_real_width.py`` in ``--models``), ``--sessions``
sessions of it in one process (warmed by a throw-away session, 1 intra-op thread), timed in
interleaved rounds over ``--looks`` looks of ``--rounds`` rounds each (the same sessions: this
measures whether a session keeps a speed of its own). Each session's statistic is its median
per-round ratio to session 0 with the 95 % sign-test interval. Done twice, each in a fresh
child process: with the environment as it is (4 KiB pages unless the system says otherwise)
and with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``; each records how much of its memory was on
huge pages. Writes ``--out``/onnx_real_width_decode_sessions.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)  # benchmarks/: results/ and the scripts this study builds on
sys.path[:0] = [HERE, BENCH]

from superkernel.util import write_results  # noqa: E402

TUNABLE = "glibc.malloc.hugetlb=1"


def child(path: str, sessions: int, looks: int, rounds: int) -> dict:
    import onnxruntime as ort

    from superkernel.onnx import timing as T
    from superkernel.onnx import verify as V

    lvl = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    make = lambda: V.session(path, lvl, 1)  # noqa: E731
    T.warm_process(make, lambda s: V.make_inputs(s, {}, V.VERIFY_DEFAULT_DIM, 0))
    ss = [make() for _ in range(sessions)]
    feeds = V.make_inputs(ss[0], {}, V.VERIFY_DEFAULT_DIM, 0)
    out = {"glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""), "looks": []}
    for _ in range(looks):
        xs = T.time_interleaved([(s, feeds) for s in ss], rounds, warmup=2)
        look = []
        for x in xs:
            e = T.ratio_estimate(list(zip(xs[0], x)))
            look.append({"median_ms": statistics.median(x) * 1e3, "vs_session0": e.ratio, "lo": e.lo, "hi": e.hi})
        out["looks"].append(look)
    out["anon_huge_pages_kb"] = T.anon_huge_pages_kb()
    return out


def markdown(r: dict) -> str:
    L = ["# Sessions of one real-width model in one process: how far apart, with and without huge pages", "",
         f"{r['hardware']}; onnxruntime {r['onnxruntime']}; model {r['model']} ({r['model_mb']:.0f} MB); "
         f"{r['sessions']} sessions of it in one process (warmed, 1 thread), {r['looks']} looks of {r['rounds']} "
         "interleaved rounds over the same sessions; each cell: median ms, and the median per-round ratio to "
         f"session 0 [95 % interval]. Load (1 min) at start / end {r['load'][0]:.2f} / {r['load'][1]:.2f}.", ""]
    for mode in r["modes"]:
        m = r["modes"][mode]
        L += [f"## {mode}: GLIBC_TUNABLES={m['glibc_tunables'] or '-'}; anonymous memory on huge pages "
              f"{m['anon_huge_pages_kb']} kB", "",
              "| look | " + " | ".join(f"session {i}" for i in range(r["sessions"])) + " |",
              "|---|" + "---|" * r["sessions"]]
        for k, look in enumerate(m["looks"]):
            L.append(f"| {k + 1} | " + " | ".join(
                f"{c['median_ms']:.1f} ms, {c['vs_session0']:.3f} [{c['lo']:.3f}-{c['hi']:.3f}]" for c in look) + " |")
        L.append("")
    L += ["The ratio is the statistic (paired per round: the load of a shared machine moves every session of a "
          "round alike); the medians in ms also carry that load. A session whose interval excludes 1 in every look "
          "runs at a speed of its own: rounds cannot average that away, only more sessions (timing.time_looks) or "
          "huge pages can.", ""]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", default="qwen2_decode")
    p.add_argument("--exporter", default="dynamo")
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--looks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--models", default=os.path.join(tempfile.gettempdir(), "superkernel_real_width_models"))
    p.add_argument("--out", default=os.path.join(BENCH, "results"))
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.sessions, a.looks, a.rounds)))
        return 0
    import onnxruntime as ort
    import torch

    from onnx_real_width import model_path
    from superkernel.tools.advisor.environment import hardware

    path = model_path(a.models, a.case, a.exporter)
    size = os.path.getsize(path) + sum(os.path.getsize(os.path.join(os.path.dirname(path), n))
                                       for n in os.listdir(os.path.dirname(path))
                                       if n.startswith(os.path.basename(path)) and n != os.path.basename(path))
    load0 = os.getloadavg()[0]
    modes = {}
    for mode, tun in (("4 KiB pages (environment as is)", None), ("huge pages", TUNABLE)):
        env = dict(os.environ)
        if tun:
            env["GLIBC_TUNABLES"] = ":".join(x for x in (env.get("GLIBC_TUNABLES", ""), tun) if x)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path, "--sessions", str(a.sessions),
                            "--looks", str(a.looks), "--rounds", str(a.rounds)], env=env, capture_output=True,
                           text=True, check=True)
        modes[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        print(mode, [[round(c["median_ms"], 1) for c in look] for look in modes[mode]["looks"]], flush=True)
    result = {"hardware": hardware(torch.device("cpu")).split(", torch threads")[0] + ")",
              "onnxruntime": ort.__version__, "model": f"{a.case}/{a.exporter}", "model_mb": size / 1e6,
              "sessions": a.sessions, "looks": a.looks, "rounds": a.rounds, "modes": modes,
              "load": [load0, os.getloadavg()[0]]}
    write_results(a.out, "onnx_real_width_decode_sessions", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
