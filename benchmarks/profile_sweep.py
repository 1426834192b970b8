"""``analyze --profile`` over the project's sweep: does the profile work, and add up, on every architecture?

    .venv/bin/python benchmarks/profile_sweep.py [--types llama,mpt,...] [--timeout 300] [--cli mistral,opt]

Architectures: the zoo (:mod:`superkernel.tools.models.zoo`), the hand-checked tiny
architectures (:mod:`superkernel.tools.models.archs`) and every registry type that
``benchmarks/hf_registry_sweep.py --eligibility-only`` found able to decode in eager
(``benchmarks/results/hf_registry_eligibility.json``; the tiny configs of
:mod:`superkernel.tools.models.registry`). Per architecture, in a child process (a crash or a
hang costs one row): build, prefill, structure analysis, then the same eager profile
``analyze --profile`` runs (:func:`~superkernel.tools.advisor.profile.profile_step`: rounds with
and without the timing wrappers alternating) and the covered share of every built-in strategy that
applies. Per row: ok / error, the profiled step (sum of the per-kind times), the bare step
measured interleaved with it, their ratio (``coverage``; the issue asks for 0.9-1.1), the kind
shares, operators and launches per step. ``--cli`` also runs the real ``superkernel analyze
--profile --json`` on a saved checkpoint of the named types.

Writes benchmarks/results/profile_sweep.{json,md} (after every row).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ELIGIBILITY = RESULTS / "hf_registry_eligibility.json"
PROFILE_STEPS = 6          # as `superkernel analyze --profile`
PROMPT_LEN = 20            # as the registry sweep (its sliding windows of 16 roll)
COVERAGE_BAND = (0.9, 1.1)


def sweep_types() -> list[tuple[str, str]]:
    """(source, name): zoo models, hand-checked archs, then eligible registry types not already listed."""
    from superkernel.tools.models import ZOO
    from superkernel.tools.models.archs import ARCHS

    out = [("zoo", n) for n in ZOO] + [("arch", n) for n in ARCHS]
    hand_types = {a.model_type for a in ARCHS.values()}
    if ELIGIBILITY.is_file():
        rows = json.loads(ELIGIBILITY.read_text())["rows"]
        out += [("registry", r["model_type"]) for r in rows if r.get("eligible") and r["model_type"] not in hand_types]
    return out


def build(source: str, name: str):
    from superkernel.tools.models import load_model
    from superkernel.tools.models.archs import build as build_arch
    from superkernel.tools.models.registry import build_tiny

    if source == "zoo":
        return load_model(name).model
    if source == "arch":
        return build_arch(name)
    return build_tiny(name)


def profile_one(source: str, name: str) -> dict:
    """One row: the eager decode step's profile, as ``analyze --profile`` computes it."""
    import torch

    from superkernel.tools.advisor.predict import covered_share
    from superkernel.tools.advisor.profile import profile_step
    from superkernel.tools.advisor.strategies import auto_plans
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.decode import prepare
    from superkernel.util import exception_summary

    row: dict = {"name": name, "source": source, "ok": False}
    stage = "build"
    start = time.perf_counter()
    try:
        model = build(source, name)
        row["class"] = type(model).__name__
        stage = "prefill"
        session = prepare(model, prompt_len=PROMPT_LEN, steps=2 * PROFILE_STEPS + 1, warmup=1, seed=0)
        stage = "structure"
        structure = analyze_structure(model)
        stage = "profile"
        profile = profile_step(session, session.step_fn(), structure=structure, steps=PROFILE_STEPS)
        totals = profile.kind_totals()
        row.update(ok=True, step_ms=profile.step_ms, measured_ms=profile.measured_ms, coverage=profile.coverage,
                   kinds_sum_ms=sum(totals.values()), ops=profile.ops, launches=profile.launches,
                   shares={k: v / profile.step_ms for k, v in totals.items() if v} if profile.step_ms else {},
                   marked_modules=len(profile.module_ms), layers=structure.num_layers,
                   wrapper_us=profile.wrapper_us, marked_calls=profile.marked_calls,
                   covered={p.strategy: covered_share(profile, model, p.scopes) for p in auto_plans(structure)})
        row["in_band"] = COVERAGE_BAND[0] <= profile.coverage <= COVERAGE_BAND[1]
    except Exception as exc:
        row.update(stage=stage, error=exception_summary(exc, 300, first_line=False))
    row["seconds"] = round(time.perf_counter() - start, 2)
    torch._dynamo.reset()
    return row


def worker(items: list[str], out: Path) -> None:
    """Child process: a "started" line, then the row, per architecture (``source:name``)."""
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)  # as the CLI does for tiny models on CPU; the machine is shared
    with out.open("a") as fh:
        for item in items:
            source, _, name = item.partition(":")
            fh.write(json.dumps({"key": item, "started": True}) + "\n")
            fh.flush()
            fh.write(json.dumps({"key": item, **profile_one(source, name)}, default=str) + "\n")
            fh.flush()


def run_children(items: list[str], log: Path, timeout: int, on_row) -> None:
    """Workers over ``items``; one that dies or exceeds ``timeout`` on a row costs that row, the rest go on."""
    rest = list(items)
    while rest:
        code = (f"import sys, pathlib; sys.path.insert(0, {str(HERE)!r}); import profile_sweep as s; "
                "s.worker(sys.argv[2].split(','), pathlib.Path(sys.argv[1]))")
        proc = subprocess.Popen([sys.executable, "-c", code, str(log), ",".join(rest)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
        seen: set[str] = set()
        since = time.time()
        while True:
            time.sleep(1)
            rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
            for r in rows:
                if not r.get("started") and r["key"] in rest and r["key"] not in seen:
                    seen.add(r["key"])
                    since = time.time()
                    on_row(r)
            done, late = proc.poll() is not None, time.time() - since > timeout
            if done or late:
                break
        if late:
            proc.kill()
        proc.wait()
        started = [r["key"] for r in rows if r.get("started") and r["key"] in rest and r["key"] not in seen]
        rest = [k for k in rest if k not in seen]
        if started:
            stuck = started[-1]
            why = f"no result within {timeout} s" if late else \
                f"the worker died ({((proc.stderr.read() or '?').strip().splitlines() or ['?'])[-1][:200]})"
            source, _, name = stuck.partition(":")
            on_row({"key": stuck, "name": name, "source": source, "ok": False, "stage": "worker", "error": why})
            rest.remove(stuck)
        elif rest and done:
            break  # ended without starting anything: nothing more will come


def run_cli(name: str, work: Path, timeout: int) -> dict:
    """The real ``superkernel analyze --profile --json`` on a saved tiny checkpoint of ``name``."""
    ckpt, out = work / f"{name}_ckpt", work / f"{name}.json"
    code = ("import sys; from superkernel.tools.models.registry import save_tiny_checkpoint; "
            "save_tiny_checkpoint(sys.argv[1], sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, name, str(ckpt)], check=True, capture_output=True, timeout=600)
    proc = subprocess.run([sys.executable, "-m", "superkernel.tools.cli", "analyze", "--model", str(ckpt), "--profile",
                           "--json", str(out)], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, COLUMNS="200"))
    result: dict = {"exit": proc.returncode, "traceback": "Traceback (most recent call last)" in proc.stderr}
    if out.is_file():
        prof = json.loads(out.read_text()).get("profile") or {}
        result["coverage"] = prof.get("coverage")
        result["kinds_share_sum"] = sum(v["share"] for v in (prof.get("kinds") or {}).values())
    return result


def markdown(rows: list[dict], meta: dict) -> str:
    ok = [r for r in rows if r.get("ok")]
    band = [r for r in ok if r.get("in_band")]
    lo, hi = COVERAGE_BAND
    lines = ["# `analyze --profile` over the sweep: ok / error, and does the profile add up", "",
             f"{meta['when']} on {meta['hardware']} ({meta['shared']}); load average {meta['load_start']} at the start, "
             f"{meta['load_end']} at the end; torch {meta['torch']}, transformers {meta['transformers']}.", "",
             f"Zoo, hand-checked architectures and every registry type eligible in eager "
             f"(`hf_registry_eligibility.json`), tiny configs, prompt {PROMPT_LEN}, one CPU thread: rounds of "
             f"{2 * PROFILE_STEPS} steps with the timing wrappers around the marked modules' forward alternate with rounds without "
             "(48-96 rounds: 1.5 s timed, then on until calibration and profile are each known to 2.5 % of the step; timed with the thread's CPU time; a round's level = its fastest quarter of steps). "
             "Pairs of rounds (one wrapped, one bare, adjacent in time) alternate between calibration and profile: the wrappers' cost "
             "per marked call is measured in the model (median over the calibration pairs of (wrapped - bare) / calls; "
             "'wrapper us' below) and taken out of the callers' times; the profile is the middle half of the other pairs by "
             f"ratio. Then {PROFILE_STEPS} steps under torch.profiler. Profiled = the per-kind times summed (they add up to the "
             "wrapped step less the calibrated cost by construction: 'other' is the step minus the marked modules); "
             "measured = the bare rounds of the same pairs; coverage = "
             f"profiled / measured (criterion {lo}-{hi}).", "",
             f"**{len(rows)} architectures: {len(ok)} profiled, {len(rows) - len(ok)} errors; "
             f"{len(band)} of {len(ok)} within {lo}-{hi}"
             + (f" (coverage median {sorted(r['coverage'] for r in ok)[len(ok) // 2]:.3f}, "
                f"range {min(r['coverage'] for r in ok):.3f}-{max(r['coverage'] for r in ok):.3f})" if ok else "")
             + ".**", "",
             "| architecture | source | ok | profiled ms | measured ms | coverage | attention | moe | mlp | norm | "
             "embedding | lm_head | other | ops | launches | wrapper us/call (calls) | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.get("ok"):
            lines.append(f"| {r['name']} | {r['source']} | **error** ({r.get('stage')}) | - | - | - | - | - | - | - | "
                         f"- | - | - | - | - | - | {(r.get('error') or '').replace('|', '/')[:240]} |")
            continue
        s = r["shares"]
        cells = " | ".join(f"{s[k]:.0%}" if k in s else "-" for k in
                           ("attention", "moe", "mlp", "norm", "embedding", "lm_head", "other"))
        mark = "" if r["in_band"] else " **out of band**"
        cli = r.get("cli")
        note = "" if not cli else "CLI: " + ", ".join(f"{k}={v if not isinstance(v, float) else round(v, 3)}"
                                                       for k, v in cli.items())
        lines.append(f"| {r['name']} | {r['source']} | ok | {r['kinds_sum_ms']:.3f} | {r['measured_ms']:.3f} | "
                     f"{r['coverage']:.3f}{mark} | {cells} | {r['ops']:.0f} | {r['launches']:.0f} | "
                     f"{r.get('wrapper_us', float('nan')):.1f} ({r.get('marked_calls', 0):.0f}) | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default=None, help="comma-separated names (zoo, archs or registry types)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds one architecture may take")
    parser.add_argument("--cli", default="", help="also run `superkernel analyze --profile` on these registry types")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--note", default="", help="what else ran on the machine (written beside the load)")
    args = parser.parse_args(argv)
    src = HERE.parent / "src"
    sys.path.insert(0, str(src))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    import torch
    import transformers

    from superkernel.util import atomic_write

    items = sweep_types()
    if args.types:
        wanted = args.types.split(",")
        known = {n: s for s, n in items}
        items = [(known.get(n, "registry"), n) for n in wanted]
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical cores",
            "shared": args.note or "other processes may share the machine: the load averages say how busy it was",
            "load_start": " ".join(f"{x:.1f}" for x in os.getloadavg()), "torch": torch.__version__,
            "transformers": transformers.__version__}
    rows: list[dict] = []

    def write() -> None:
        meta["load_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
        args.output.mkdir(parents=True, exist_ok=True)
        atomic_write(args.output / "profile_sweep.json", json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        atomic_write(args.output / "profile_sweep.md", markdown(rows, meta))

    def on_row(row: dict) -> None:
        rows.append(row)
        print(f"{row['name']}: " + (f"coverage {row['coverage']:.3f}" if row.get("ok") else f"error {row.get('error')}"),
              flush=True)
        write()

    with tempfile.TemporaryDirectory(prefix="sk_profile_sweep_") as tmp:
        run_children([f"{s}:{n}" for s, n in items], Path(tmp) / "rows.jsonl", args.timeout, on_row)
        for name in filter(None, args.cli.split(",")):
            row = next((r for r in rows if r["name"] == name), None)
            if row is not None:
                row["cli"] = run_cli(name, Path(tmp), args.timeout)
                write()
    write()
    ok = [r for r in rows if r.get("ok")]
    print(f"{len(ok)}/{len(rows)} profiled; {sum(1 for r in ok if r['in_band'])} within {COVERAGE_BAND}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
