"""The PyTorch side of ``real_decode_peers.py``: the models, their teacher-forced sessions, each runner's step, check.

Run nothing from here: ``benchmarks/real_decode_peers.py`` is the command (its docstring).
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import torch

from real_decode_peers_report import FLOATS, MODEL, SCHEMES, Runner

KINDS = {"eager": "eager", "compile": "torch.compile", "superkernel": "superkernel"}


class Models:
    """The loaded model in each dtype / quantization a wanted runner needs, each with its session and eager logits."""

    def __init__(self, args: argparse.Namespace) -> None:
        from superkernel.tools.advisor.text_eval import text_for
        from superkernel.tools.models import load_model

        self.args = args
        wanted = {name.split("-", 1)[1] for name in args.wanted if not name.startswith("llamacpp-")}
        self.names = [m for m in FLOATS + SCHEMES if m in wanted or m == "float32"]  # float32: the reference
        start = time.perf_counter()
        self.loaded = load_model(MODEL, dtype="float32")
        self.prepared_s = {"float32": time.perf_counter() - start}
        text = text_for(None, self.loaded)
        self.text_name, self.ids = text.name, text.ids
        self.models: dict[str, torch.nn.Module] = {"float32": self.loaded.model}
        self.info: dict[str, str] = {}
        self.sessions: dict[str, Any] = {}
        self.reference: dict[str, torch.Tensor] = {}    # eager logits of each model, the first run
        self.tolerance: dict[str, float] = {}
        self.floor: dict[str, Any] = {}
        self.layers = self.loaded.model.config.num_hidden_layers

    def session_of(self, model: torch.nn.Module) -> Any:
        from superkernel.tools.decode import prepare

        a = self.args
        return prepare(model, prompt_len=a.prompt_len, steps=a.steps, warmup=a.warmup, text_ids=self.ids)

    def full_float_reference(self) -> tuple[Any, torch.Tensor]:
        """Float32 eager over the whole model (before any truncation): llama.cpp's reference; (session, logits)."""
        from superkernel.tools.decode import run_decode

        session = self.session_of(self.loaded.model)
        return session, run_decode(session, session.step_fn()).logits

    def truncate_and_prepare(self) -> None:
        from superkernel.tools.models import load_model
        from superkernel.tools.quantize import quantize_model

        truncate(self.loaded.model, self.args.layers)
        self.layers = self.loaded.model.config.num_hidden_layers
        self.info["float32"] = f"{self.loaded.gguf['file_type']} GGUF dequantized by transformers"
        if "bfloat16" in self.names:
            start = time.perf_counter()
            bf16 = load_model(MODEL, dtype="bfloat16").model
            truncate(bf16, self.args.layers)
            self.models["bfloat16"], self.prepared_s["bfloat16"] = bf16, time.perf_counter() - start
            self.info["bfloat16"] = "the same file loaded in bfloat16"
        for scheme in (m for m in self.names if m in SCHEMES):
            start = time.perf_counter()
            model = copy.deepcopy(self.loaded.model)
            q = quantize_model(model, scheme)
            self.models[scheme], self.prepared_s[scheme] = model, time.perf_counter() - start
            self.info[scheme] = (f"float32 model requantized by {q.library}: {q.layers} linear layers"
                                 + (f", group {q.group_size}" if q.group_size else "")
                                 + (f", {len(q.skipped)} left float" if q.skipped else ""))
        for name in self.names:
            self.prepare_one(name)

    def prepare_one(self, name: str) -> None:
        from superkernel.tools.advisor.precision import default_tolerance, measures_floor
        from superkernel.tools.advisor.rounding_floor import rounding_floor
        from superkernel.tools.decode import run_decode

        model = self.models[name]
        session = self.sessions[name] = self.session_of(model)
        self.reference[name] = run_decode(session, session.step_fn()).logits
        if measures_floor(model):  # W8A8-like: the gate widened by eager's own rounding floor, as the workflow does
            self.floor[name] = rounding_floor(session, self.reference[name])
        self.tolerance[name] = default_tolerance(model, self.floor.get(name))

    def describe(self) -> dict[str, str]:
        return {name: self.info.get(name, "") + f"; prepared in {self.prepared_s.get(name, 0.0):.1f} s"
                + (f"; W8A8 rounding floor {self.floor[name].relative:.2g} (relative)" if name in self.floor else "")
                for name in self.names}


def truncate(model: torch.nn.Module, layers: int | None) -> None:
    """Keep the model's first ``layers`` decoder layers (the smoke run's 2)."""
    if layers is None or layers >= model.config.num_hidden_layers:
        return
    model.model.layers = torch.nn.ModuleList(list(model.model.layers)[:layers])
    model.config.num_hidden_layers = layers


def compile_runner(models: Models, name: str) -> Runner:
    """The runner ``name`` (``eager-`` / ``compile-`` / ``superkernel-<model>``), compiled, its first run checked."""
    from superkernel.tools.advisor.compiling import compile_inductor, compile_superkernel
    from superkernel.tools.advisor.strategies import plan_for
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.decode import run_decode

    prefix, model_name = name.split("-", 1)
    session = models.sessions[model_name]
    r = Runner(name, KINDS[prefix], model_name, prepared_s=models.prepared_s.get(model_name, 0.0))
    build_s = 0.0
    if prefix == "eager":
        r.step = session.step_fn()
    elif prefix == "compile":
        r.step = compile_inductor(session, keep=True)
    else:  # the all_layers plan on a scoped copy, max-autotune, as the precompiled step optimize / bench run
        import superkernel

        scoped = copy.deepcopy(session.model)
        superkernel.apply_scopes(scoped, plan_for("all_layers", analyze_structure(scoped)).scopes)
        model, session.model = session.model, scoped
        try:
            r.step, _ = compile_superkernel(session, "max-autotune", keep=True, precompiled=True)
        finally:
            session.model = model
        build_s = getattr(r.step, "build_seconds", 0.0)
        r.note = f"step: {getattr(r.step, 'guard_path', 'guarded (not one precompiled frame)')}"
    first = run_decode(session, r.step)
    r.compile_s = 0.0 if prefix == "eager" else build_s + first.compile_seconds
    check(models, r, first.logits)
    r.quality = quality(models, session, first.logits)
    return r


def check(models: Models, r: Runner, logits: torch.Tensor) -> None:
    """One round's check against eager of the same model: eager itself bit-identical to its first run, every other
    runner within max-autotune's gate (``PeerCheck``); greedy picks' agreement recorded either way."""
    from superkernel.tools.peer_check import PeerCheck

    ref = models.reference[r.model]
    c = r.check
    agree = float((logits.argmax(-1) == ref.argmax(-1)).double().mean())
    c["greedy_agreement_min"] = min(c.get("greedy_agreement_min", 1.0), agree)
    if r.kind == "eager":
        c.setdefault("wrong_rounds", [])
        c["rounds"] = c.get("rounds", 0) + 1
        if not torch.equal(logits, ref):
            c["wrong_rounds"].append(c["rounds"])
        c["rule"] = "bit-identical to its own first run (the reference of this model)"
        c["passed"] = not c["wrong_rounds"]
        c["summary"] = (f"reference, identical in {c['rounds'] - len(c['wrong_rounds'])}/{c['rounds']} runs")
        return
    peer = r.peer = r.peer or PeerCheck(tolerance=models.tolerance[r.model])
    peer.check(logits, ref)
    c.update(peer.to_dict())
    c["against"] = f"eager {r.model}"
    c["passed"] = not peer.wrong
    c["summary"] = f"{peer.summary()}, greedy picks = eager's on {c['greedy_agreement_min']:.0%} of steps (worst run)"


def quality(models: Models, session: Any, logits: torch.Tensor) -> dict[str, Any]:
    from superkernel.tools.quality import text_quality

    return text_quality(logits, session.text_targets, models.reference["float32"]).to_dict()


def torch_round(models: Models, r: Runner) -> None:
    """One timed round of a torch runner: every step, checked."""
    from superkernel.tools.decode import run_decode

    run = run_decode(models.sessions[r.model], r.step)
    r.round_ms.append(run.median_ms)
    r.steps_ms += [t * 1e3 for t in run.timed]
    check(models, r, run.logits)
    counters = getattr(r.step, "counters", None)
    if counters is not None and counters.get("fallback_calls"):
        r.check["precompiled_fallback_calls"] = counters["fallback_calls"]
