"""Every causal-LM architecture transformers registers, through the harness of ``analyze`` / ``optimize``.

    .venv/bin/python benchmarks/hf_registry_sweep.py [--types llama,mpt,...] [--quick] [--timeout 600] [--resume]

The list is generated from transformers' own auto mapping (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``
with a config class), not written by hand; each architecture gets a tiny config
(:mod:`superkernel.tools.models.registry`: hidden 64, 2 layers, vocabulary 256, seeded random
weights). Per architecture (:func:`superkernel.tools.models.sweep.sweep_one`):

1. eligibility, in eager: build, prefill a 20-token prompt into a ``StaticCache``, decode, and
   decode again from the restored cache with identical logits; an architecture that cannot is
   listed with the stage and the first line of the error (a failure of eager, not of superkernel);
2. the structure analysis and the ``decoder_layer`` plan (one scope per decoder layer);
3. the reduce-overhead plan against its exactness reference: bit-exact (``torch.equal``),
   Dynamo's recompiles in the timed steps, graph breaks, capture fallbacks, compile time.

Workers run in child processes (a crash or a hang costs one architecture, never the sweep).
``--cli`` additionally runs the real commands (``superkernel analyze`` and ``superkernel optimize
--strategy decoder_layer --mode reduce-overhead``) on a saved checkpoint of the named types.

Writes benchmarks/results/hf_registry_sweep.json and .md (partial results after every row).
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
_ONLY = "SK_REGISTRY_ELIGIBILITY_ONLY"  # how --eligibility-only reaches the workers


def worker(types: list[str], out: Path, eligibility_only: bool = False) -> None:
    """Child process: one JSON row per architecture, appended as soon as it is known."""
    import warnings

    from superkernel.tools.models.eligibility import probe
    from superkernel.tools.models.sweep import sweep_one

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)  # as the CLI does for tiny models on CPU; the machine is shared
    with out.open("a") as fh:
        for name in types:
            fh.write(json.dumps({"model_type": name, "started": True}) + "\n")
            fh.flush()
            row = probe(name) if eligibility_only else sweep_one(name)
            fh.write(json.dumps(row, default=str) + "\n")
            fh.flush()


def _rows(path: Path) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["model_type"]] = row
    return rows


def _start(types: list[str], log: Path) -> subprocess.Popen:
    code = f"import sys, pathlib; sys.path.insert(0, {str(HERE)!r}); import hf_registry_sweep as s; " \
           "s.worker(sys.argv[2].split(','), pathlib.Path(sys.argv[1]), sys.argv[3] == '1')"
    return subprocess.Popen([sys.executable, "-c", code, str(log), ",".join(types), os.environ.get(_ONLY, "0")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` and its waited-for children (Linux /proc), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


#: A worker silent this many times ``timeout`` in wall time is hung, whatever its CPU time says.
HANG_FACTOR = 6


def _late(w: dict, timeout: int) -> bool:
    """Over its time for one architecture: ``timeout`` seconds of CPU time (so a busy machine, which
    stretches wall time, does not fail an architecture), or ``HANG_FACTOR`` x ``timeout`` of wall time."""
    wall = time.time() - w["since"]
    cpu = _cpu_seconds(w["proc"].pid)
    if cpu is None:
        return wall > timeout
    return cpu - w["cpu_since"] > timeout or wall > HANG_FACTOR * timeout


def run_all(types: list[str], work: Path, timeout: int, on_row, jobs: int = 1) -> None:
    """Run ``jobs`` workers over ``types``; rows reach ``on_row`` as they are written. A row left at
    "started" when its worker died or went over its time (:func:`_late`) is reported as such, and
    the worker is restarted on the rest of its list."""
    queues = [types[i::jobs] for i in range(jobs)]
    workers = []
    for i, queue in enumerate(queues):
        if queue:
            log = work / f"rows_{i}.jsonl"
            workers.append({"queue": queue, "log": log, "proc": _start(queue, log), "seen": set(), "since": time.time(),
                            "cpu_since": 0.0})
    while workers:
        time.sleep(2)
        for w in list(workers):
            rows = _rows(w["log"])
            for name in w["queue"]:
                row = rows.get(name)
                if row is not None and not row.get("started") and name not in w["seen"]:
                    w["seen"].add(name)
                    w["since"], w["cpu_since"] = time.time(), _cpu_seconds(w["proc"].pid) or 0.0
                    on_row(row)
            done = w["proc"].poll() is not None
            late = not done and _late(w, timeout)
            if not (done or late):
                continue
            if late:
                w["proc"].kill()
                w["proc"].wait()
            rest = [n for n in w["queue"] if n not in w["seen"]]
            stuck = next((n for n in rest if rows.get(n, {}).get("started")), None)
            if stuck is not None:
                tail = (w["proc"].stderr.read() or "").strip().splitlines()[-1:] if not late else []
                why = (f"no result within {timeout} s of CPU time (or {HANG_FACTOR * timeout} s of wall time)" if late
                       else f"the worker died ({(tail or ['?'])[0][:200]})")
                on_row({"model_type": stuck, "eligible": None, "exit": "crash", "reason": why})
                w["seen"].add(stuck)
                rest.remove(stuck)
            elif rest:  # ended without starting them
                for name in rest:
                    on_row({"model_type": name, "eligible": None, "exit": "crash", "reason": "worker ended early"})
                rest = []
            workers.remove(w)
            if rest:
                w.update(queue=rest, proc=_start(rest, w["log"]), since=time.time(), cpu_since=0.0)
                workers.append(w)


def run_cli(name: str, work: Path, timeout: int) -> dict:
    """``superkernel analyze`` and ``optimize --strategy decoder_layer --mode reduce-overhead`` on a checkpoint."""
    ckpt, out = work / f"{name}_ckpt", work / f"{name}_out"
    code = ("import sys; from superkernel.tools.models.registry import save_tiny_checkpoint; "
            "save_tiny_checkpoint(sys.argv[1], sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, name, str(ckpt)], check=True, capture_output=True, timeout=600)
    cli = [sys.executable, "-m", "superkernel.tools.cli"]
    env = dict(os.environ, COLUMNS="240", PYTHONWARNINGS="ignore")
    result = {}
    for command, extra in (("analyze", []), ("optimize", ["--strategy", "decoder_layer", "--mode", "reduce-overhead",
                                                          "--steps", "8", "--warmup", "2", "--prompt-len", "20",
                                                          "--output", str(out), "--quiet"])):
        try:
            proc = subprocess.run(cli + [command, "--model", str(ckpt), *extra], capture_output=True, text=True,
                                  timeout=timeout, env=env)
            result[f"{command}_exit"] = proc.returncode
            result[f"{command}_traceback"] = "Traceback (most recent call last)" in proc.stderr
        except subprocess.TimeoutExpired:
            result[f"{command}_exit"] = "timeout"
    found = out / "results.json"
    if found.exists():
        runs = json.loads(found.read_text())["results"]
        ro = [r for r in runs if r["kind"] == "plan" and r["mode"] == "reduce-overhead"]
        result["optimize_bit_exact"] = bool(ro) and all(r["status"] == "passed" and r["vs_reference"]["identical"]
                                                       for r in ro)
        result["optimize_recompiles_timed"] = max([r.get("recompiles_timed") or 0 for r in runs] or [0])
    return result


def markdown(rows: list[dict], meta: dict) -> str:
    eligible = [r for r in rows if r.get("eligible")]
    ran = [r for r in eligible if r.get("exit") == 0]
    lines = ["# Every transformers causal-LM architecture: the analyze / optimize harness", "",
             f"{meta['when']} on {meta['hardware']}, load {meta['load']}; torch {meta['torch']}, transformers "
             f"{meta['transformers']}.", "",
             f"Generated from transformers' `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`: {meta['registered']} model types "
             f"registered, {len(rows)} in this run. Tiny configs (hidden 64, 2 layers, vocabulary 256, seeded random "
             "weights, `superkernel.tools.models.registry`); prompt 20 tokens, decode steps "
             f"{meta['warmup']} warm-up + {meta['steps']} timed on a `StaticCache`; strategy `decoder_layer`, "
             "mode reduce-overhead against its exactness reference. Compile: the plan's first step (s).", "",
             *(["Eligibility only (`--eligibility-only`): eager decodes, no superkernel plan compiled in this run.", ""]
               if meta.get("eligibility_only") else []),
             *([f"Resumed (`--resume`): {meta['resumed']}; the date and load above are this run's.", ""]
               if meta.get("resumed") else []),
             f"**{len(eligible)} decode in eager; of those {len(ran)} exit 0, "
             f"{sum(1 for r in ran if r.get('bit_exact'))} bit-exact, "
             f"{sum(1 for r in ran if r.get('recompiles_timed') == 0 and not r.get('limit_hit'))} with 0 recompiles "
             f"in timed steps.**", "",
             "## Eligible architectures", "",
             "| model type | class | cache layers | exit | bit-exact | recompiles (timed) | graphs | segments | "
             "graph breaks | compile s | note |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in eligible:
        note = r.get("reason", "") if r.get("exit") != 0 else ""
        if r.get("capture_fallbacks"):
            note += f" capture fallback x{len(r['capture_fallbacks'])}: {r['capture_fallbacks'][0][:160]}"
        if r.get("layer_lists"):
            note += f" layers as parallel lists: {', '.join(f'`{p}`' for p in r['layer_lists'])}"
        if r.get("static_mask"):
            note += " full-length attention mask passed (the default one grows with the position)"
        if r.get("dynamic_sources"):
            note += f" dynamic: `{r['dynamic_sources']}`"
        if r.get("dynamic_shapes"):
            note += (" dynamic shapes (cache tensors grow: "
                     f"{', '.join(f'`{t}`' for t in r.get('growing_tensors') or [])})")
        if r.get("recompile_reasons") and r.get("recompiles_timed"):
            note += f" recompiles: {r['recompile_reasons'][0][:160]}"
        if r.get("cli"):
            note += " CLI: " + ", ".join(f"{k}={v}" for k, v in r["cli"].items())
        yes = {True: "yes", False: "**no**", None: "-"}
        lines.append(f"| {r['model_type']} | {r.get('class', '-')} | {', '.join(r.get('cache_layers') or [])} | "
                     f"{r.get('exit', '-')} | {yes[r.get('bit_exact')]} | {r.get('recompiles_timed', '-')} | "
                     f"{r.get('graphs', '-')} | {r.get('segments', '-')} | {r.get('graph_breaks', '-')} | "
                     f"{r.get('compile_seconds', '-')} | {note.strip().replace('|', '/')[:400]} |")
    lines += ["", "## Not eligible: eager itself cannot decode the tiny config with a static cache", "",
              "Stage: where eager failed (config: the tiny config is rejected; build: the model cannot be built; "
              "prefill/decode: the forward with a `StaticCache` fails; repeat: two eager decodes differ).", "",
              "| model type | stage | reason |", "|---|---|---|"]
    for r in rows:
        if r.get("eligible") is False:
            lines.append(f"| {r['model_type']} | {r.get('stage', '-')} | "
                         f"{(r.get('reason') or '').replace('|', '/')[:300]} |")
    unknown = [r for r in rows if r.get("eligible") is None]
    if unknown:
        lines += ["", f"## No result ({len(unknown)}): the worker timed out or died (eligibility unknown)", "",
                  "| model type | reason |", "|---|---|"]
        lines += [f"| {r['model_type']} | {(r.get('reason') or '').replace('|', '/')[:300]} |" for r in unknown]
    if meta.get("requested") is None:
        from superkernel.tools.models.registry import causal_lm_types

        meta = {**meta, "requested": causal_lm_types()}
    have = {r["model_type"] for r in rows}
    missing = [t for t in meta["requested"] if t not in have]
    if missing:
        lines += ["", f"## Not run ({len(missing)}): the run was stopped before reaching them", "",
                  ", ".join(missing)]
    return "\n".join(lines) + "\n"


def write(rows: list[dict], meta: dict, out: Path) -> None:
    from superkernel.util import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    stem = "hf_registry_eligibility" if meta.get("eligibility_only") else "hf_registry_sweep"
    atomic_write(out / f"{stem}.json", json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n")
    atomic_write(out / f"{stem}.md", markdown(rows, meta))


def _kept_rows(out: Path, eligibility_only: bool, names: list[str]) -> list[dict]:
    """Rows of an earlier run (``--resume``) that have a result: eligible or not, not a timeout or crash."""
    stem = "hf_registry_eligibility" if eligibility_only else "hf_registry_sweep"
    path = out / f"{stem}.json"
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--resume: cannot read {path} ({exc}); move it away to start a new sweep") from None
    return [r for r in rows if isinstance(r, dict) and r.get("model_type") in names and r.get("eligible") is not None]


def main(argv: list[str] | None = None) -> int:
    from superkernel.tools.models.registry import causal_lm_types

    registered = causal_lm_types()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default="", help="comma-separated model types (default: every registered one)")
    p.add_argument("--quick", action="store_true", help="only the CI subset (smoke run)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per architecture")
    p.add_argument("--eligibility-only", action="store_true",
                   help="only decode each architecture in eager (fast): the eligible / not eligible lists")
    p.add_argument("--jobs", type=int, default=1, help="worker processes at once (default 1)")
    p.add_argument("--cli", default="", help="comma-separated types to also run through the real CLI commands")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--render", type=Path, metavar="JSON", help="only rewrite the markdown from a JSON of this script")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows of the output's JSON that have a result and run only the rest (a sweep "
                        "longer than one sitting; rows that timed out or crashed are run again)")
    args = p.parse_args(argv)
    if args.render is not None:
        data = json.loads(args.render.read_text())
        write(data["rows"], data["meta"], args.output)
        return 0
    names = [n for n in args.types.split(",") if n] or registered
    unknown = [n for n in names if n not in registered]
    if unknown:
        p.error(f"unknown model type(s) {', '.join(unknown)}; registered causal LMs: {', '.join(registered)}")
    if args.quick:
        from superkernel.tools.models.registry import CI_SUBSET

        names = [n for n in names if n in CI_SUBSET]
    import torch
    import transformers

    from superkernel.tools.advisor.environment import cpu_name

    if args.eligibility_only:
        os.environ[_ONLY] = "1"
    from superkernel.tools.models.sweep import STEPS, WARMUP

    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "hardware": f"{cpu_name()} ({platform.machine()}, {os.cpu_count()} logical cores)",
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg()), "torch": torch.__version__,
            "transformers": transformers.__version__, "registered": len(registered), "steps": STEPS,
            "warmup": WARMUP, "requested": names, "eligibility_only": args.eligibility_only}
    rows: list[dict] = _kept_rows(args.output, args.eligibility_only, names) if args.resume else []
    if rows:
        names = [n for n in names if n not in {r["model_type"] for r in rows}]
        meta["resumed"] = f"{len(rows)} rows kept from earlier runs of this script, {len(names)} run now"
        print(meta["resumed"], flush=True)

    def on_row(row: dict) -> None:
        rows.append(row)
        print(f"{row['model_type']}: eligible {row.get('eligible')}, exit {row.get('exit')}, bit-exact "
              f"{row.get('bit_exact')}, recompiles {row.get('recompiles_timed')} "
              f"{(row.get('reason') or '')[:160]}", flush=True)
        write(rows, meta, args.output)

    with tempfile.TemporaryDirectory(prefix="sk_registry_") as tmp:
        run_all(names, Path(tmp), args.timeout, on_row, jobs=max(1, args.jobs))
        for name in [n for n in args.cli.split(",") if n]:
            row = next((r for r in rows if r["model_type"] == name), None)
            if row is not None and row.get("eligible"):
                row["cli"] = run_cli(name, Path(tmp), args.timeout)
                write(rows, meta, args.output)
    write(rows, meta, args.output)
    ok = all(r.get("exit") == 0 and r.get("bit_exact") and r.get("recompiles_timed") == 0
             for r in rows if r.get("eligible"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
