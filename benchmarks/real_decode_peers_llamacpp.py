"""The llama.cpp side of ``real_decode_peers.py``: the shipped Q4_1 file and the types its quantize API makes from it,
fed the same token ids as the torch runners, checked against float32 eager, timed per token as ``llamacpp_peer.py``.

Run nothing from here: ``benchmarks/real_decode_peers.py`` is the command (its docstring).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from real_decode_peers_report import LLAMACPP, LLAMACPP_MIN_TOP1, Runner


class LlamaPeers:
    """The llama.cpp runners of one run (none timed when llama-cpp-python is not importable: their rows say so)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.runners: list[Runner] = []
        self.info: dict[str, Any] = {"installed": False}
        self.prompt: list[int] = []
        self.forced: list[int] = []
        self.workdir: str | None = None

    def round(self, r: Runner, logits: list | None = None) -> dict[str, Any]:
        """One round of ``r``: the prompt, then every decode step fed the session's ids; its picks checked against
        its own first round (llama.cpp is deterministic at a fixed thread count)."""
        from llamacpp_peer import decode_round

        a = self.args
        res = decode_round(r.llm, self.prompt, a.warmup, a.steps, forced=self.forced, logits=logits)
        if logits is None:
            r.round_ms.append(statistics.median(res["step_s"]) * 1e3)
            r.steps_ms += [t * 1e3 for t in res["step_s"]]
            c = r.check
            c["rounds"] += 1
            if res["picks"] != c["picks"]:
                c["rounds_with_other_picks"].append(c["rounds"])
                c["passed"] = False
                c["summary"] = (f"top-1 = float32 eager's on {c['top1_vs_float32']:.0%} of steps; picks differ from "
                                f"its first round in round(s) {c['rounds_with_other_picks']}")
        return res

    def close(self) -> None:
        for r in self.runners:
            if r.llm is not None:
                r.llm.close()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        return self.info


def llamacpp_runners(args: argparse.Namespace, models: Any) -> LlamaPeers:
    """Every wanted llama.cpp runner, loaded and checked (the untimed round): rows that say "not installed" when
    llama-cpp-python cannot be imported."""
    peers = LlamaPeers(args)
    wanted = [q for q in LLAMACPP if f"llamacpp-{q}" in args.wanted]
    if not wanted:
        peers.info["why"] = "no llama.cpp runner asked for"
        return peers
    try:
        import llama_cpp
    except ImportError as exc:
        peers.info["why"] = f"llama-cpp-python not importable ({exc}); make peers installs it"
        peers.runners = [Runner(f"llamacpp-{q}", "llama.cpp", q, note="not installed") for q in wanted]
        return peers
    peers.info = {"installed": True, "version": llama_cpp.__version__, "shipped_type": models.loaded.gguf["file_type"],
                  "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}
    session, reference = models.full_float_reference()
    peers.prompt = [int(t) for t in session.prompt_ids[0]]
    peers.forced = [int(t) for t in session.tokens[:, 0]]
    source = Path(models.loaded.gguf["path"])
    if args.workdir:  # the user's folder: kept
        folder = args.workdir
        folder.mkdir(parents=True, exist_ok=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix="sk-real-peers-gguf-"))
        peers.workdir = str(folder)
    for q in wanted:
        try:
            peers.runners.append(_runner(peers, q, source, folder, session, reference))
        except Exception as exc:  # a type llama.cpp cannot make or load here: its row says why
            peers.runners.append(Runner(f"llamacpp-{q}", "llama.cpp", q, note=f"failed: {type(exc).__name__}: {exc}"))
            print(f"[llama.cpp] {q}: {peers.runners[-1].note}", flush=True)
    return peers


def _runner(peers: LlamaPeers, q: str, source: Path, folder: Path, session: Any, reference: torch.Tensor) -> Runner:
    """llama.cpp on file type ``q`` (made from the shipped file unless it is that file), loaded and checked."""
    from llamacpp_peer import open_llama
    from quality_real_text import requantize

    from superkernel.tools.quality import text_quality

    args = peers.args
    path, made = source, 0.0
    if q != peers.info["shipped_type"]:
        path = folder / f"{source.stem}.{q}.gguf"
        start = time.perf_counter()
        requantize(source, path, q, os.cpu_count() or 1)
        made = time.perf_counter() - start
    start = time.perf_counter()
    llm = open_llama(path, args.threads, n_ctx=args.prompt_len + args.warmup + args.steps + 8, logits_all=False,
                     flash_attn=False)
    r = Runner(f"llamacpp-{q}", "llama.cpp", q, llm=llm, compile_s=time.perf_counter() - start, prepared_s=made,
               note=("the shipped file" if path == source else f"made from {source.name} by llama_model_quantize")
               + (f"; the whole model ({session.model.config.num_hidden_layers} layers)" if args.layers else ""))
    rows: list = []
    res = peers.round(r, logits=rows)  # the check round (untimed): logits of every step
    logits = torch.from_numpy(np.stack(rows))
    top1 = float((logits.argmax(-1) == reference.argmax(-1)).double().mean())
    r.check = {"against": "float32 eager of the whole model, same ids", "top1_vs_float32": top1,
               "min_top1": LLAMACPP_MIN_TOP1[q], "picks": res["picks"], "rounds": 1, "rounds_with_other_picks": [],
               "passed": top1 >= LLAMACPP_MIN_TOP1[q],
               "summary": f"top-1 = float32 eager's on {top1:.0%} of steps (>= {LLAMACPP_MIN_TOP1[q]:.0%} required); "
                          "same picks every round"}
    r.quality = text_quality(logits, session.text_targets, reference).to_dict()
    print(f"[llama.cpp] {q}: made in {made:.1f} s, loaded in {r.compile_s:.2f} s, {r.check['summary']}", flush=True)
    return r
