"""The planner: runs on a max-autotune segment's ATen graph before Inductor lowers it.

For each rule: find candidates, predict their benefit (:mod:`superkernel.runtime.inductor.autofusion.benefit`),
reject what does not fit the per-core cache or is predicted to lose, measure the rest at their
real shapes (:mod:`superkernel.runtime.inductor.autofusion.calibrate`, cached), rewrite the graph for those
measured faster, and record one :class:`~superkernel.ir.decision.Decision` per candidate
and per GEMM no rule matched. Inductor then compiles the rewritten graph (constant folding,
weight prepacking, its own fusions).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch.fx as fx

from superkernel.runtime.inductor.autofusion import calibrate, compiled_timing, machine
from superkernel.runtime.inductor.autofusion.benefit import Machine, predict_horizontal
from superkernel.ir.decision import APPLIED, NOT_BUILT, NOT_MATCHED, REJECTED, Decision
from superkernel.runtime.inductor.autofusion.rules import gemm_epilogue, horizontal_gemm, is_get_attr, moe_experts, rotary_attention
from superkernel.runtime.inductor.autofusion.store import Store

Measure = Callable[..., dict[str, Any]]


def calibration_env(how: str) -> str:
    """The environment part of a calibration key: the machine's (:func:`machine.environment`) and how a
    candidate is timed (``how``: ``compiled templates=.. cpp_wrapper=..`` by default, ``injected`` otherwise)."""
    return f"{machine.environment()}|{how}"


def compiled_how(gemm_templates: bool, cpp_wrapper: bool) -> str:
    return f"compiled templates={gemm_templates} cpp_wrapper={cpp_wrapper}"


class Planner:
    """One per compiled graph: shares the machine constants and the calibration cache across segments."""

    def __init__(self, store: Store | None = None, measure: Measure | None = None, *, gemm_templates: bool = True,
                 cpp_wrapper: bool = False) -> None:
        self.store = store if store is not None else Store()
        # by default a candidate is timed as Inductor compiles it, with the segment's GEMM options
        self._measure = measure or functools.partial(compiled_timing.time_compiled, gemm_templates=gemm_templates,
                                                     cpp_wrapper=cpp_wrapper)
        self._how = compiled_how(gemm_templates, cpp_wrapper) if measure is None else "injected"
        self._machine: Machine | None = None
        self.measured = 0
        self.reused = 0

    def machine(self) -> Machine:
        """Per-core cache from the machine; bandwidth and call cost measured once per environment (cached)."""
        if self._machine is None:
            cache, source = machine.per_core_cache_bytes()
            env = machine.environment()
            hit = self.store.get(f"machine|{env}")
            if not hit or not {"bandwidth", "call_us"} <= set(hit):
                from torch._subclasses.fake_tensor import unset_fake_temporarily

                with unset_fake_temporarily():  # real tensors: the planner runs under AOTAutograd's fake mode
                    hit = {"bandwidth": machine.measure_bandwidth(), "call_us": machine.measure_call_us(),
                           "time": int(time.time())}
                self.store.put(f"machine|{env}", hit)
            self._machine = Machine(cache, source, float(hit["bandwidth"]), float(hit["call_us"]))
        return self._machine

    def plan(self, gm: fx.GraphModule, is_constant: Callable[[fx.Node], bool] = is_get_attr) -> list[Decision]:
        """Rewrite ``gm`` in place where a candidate wins; the decisions, in graph order."""
        decisions = self._horizontal(gm, is_constant)
        decisions += self._epilogues(gm)
        decisions += self._attention_and_experts(gm)
        self.store.save()
        return decisions

    # -- rule (a): horizontal GEMM fusion -------------------------------------------------------
    def _horizontal(self, gm: fx.GraphModule, is_constant: Callable[[fx.Node], bool]) -> list[Decision]:
        rule = horizontal_gemm.NAME
        candidates, misses = horizontal_gemm.match(gm, is_constant)
        out = [Decision(rule, NOT_MATCHED, where, why) for where, why in misses]
        for cand in candidates:
            out.append(self._decide(gm, cand))
        return out

    def _decide(self, gm: fx.GraphModule, cand: horizontal_gemm.Candidate) -> Decision:
        rule, mach = horizontal_gemm.NAME, self.machine()
        itemsize = cand.gemms[0].weight.meta["val"].element_size()
        pred = predict_horizontal(cand.m, cand.k, cand.ns, itemsize, constant_weights=cand.constant, machine=mach)
        d = Decision(rule, REJECTED, cand.where, "", cand.shapes, round(pred.benefit_us, 3),
                     capacity={"working_set": pred.working_set, "cache": mach.cache_bytes, "source": mach.cache_source})
        if not cand.constant:
            d.reason = "weights are not constants in this compile: concatenating them would cost every call"
            return d
        if not pred.fits:
            d.reason = "capacity: the fused GEMM's working set does not fit the per-core cache (no bytes saved)"
            return d
        if pred.benefit_us <= 0:
            d.reason = "predicted to lose: penalties exceed the bytes and calls saved"
            return d
        bias = cand.gemms[0].bias is not None
        k = calibrate.key(rule, cand.m, cand.k, cand.ns, cand.dtype, bias, calibration_env(self._how))
        hit = self.store.get(k)
        if hit and {"unfused_us", "fused_us", "ratio"} <= set(hit):
            measured = {**hit, "cached": True}
            self.reused += 1
        else:
            try:
                measured = dict(self._measure(cand.m, cand.k, cand.ns, cand.dtype, bias))
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot be measured is not applied
                from superkernel.util import exception_summary

                d.reason = f"not measured, so not applied: {exception_summary(exc)}"
                return d
            self.measured += 1
            self.store.put(k, {**measured, "time": int(time.time())})
            measured["cached"] = False
        d.measured = {n: measured[n] for n in ("unfused_us", "fused_us", "ratio", "ratio_q3", "clock", "compiled",
                                               "cached")
                      if n in measured}
        if not calibrate.faster(measured):
            d.reason = (f"measured not faster beyond noise (ratio fused/unfused {measured['ratio']:.3f}, "
                        f"needs <= {calibrate.RATIO_TO_APPLY} with upper quartile < 1)")
            return d
        horizontal_gemm.apply(gm, cand)
        d.status, d.reason = APPLIED, f"one GEMM of {len(cand.ns)}, concatenated constant weight, outputs split by views"
        return d

    # -- rule (b): reported only (Inductor decides; see the rule's docstring) -------------------
    @staticmethod
    def _epilogues(gm: fx.GraphModule) -> list[Decision]:
        epilogues, prologues = gemm_epilogue.chains(gm)
        out = []
        if epilogues:
            out.append(Decision(gemm_epilogue.NAME, NOT_BUILT, ", ".join(epilogues), gemm_epilogue.EPILOGUE_WHY))
        if prologues:
            out.append(Decision(gemm_epilogue.NAME, NOT_BUILT, ", ".join(prologues), gemm_epilogue.PROLOGUE_WHY))
        if not epilogues and not prologues:
            out.append(Decision(gemm_epilogue.NAME, NOT_MATCHED, "-", "no GEMM -> add or norm -> GEMM chain"))
        return out

    # -- rules (c), (d): reported only (see each rule's docstring) --------------------------------
    @staticmethod
    def _attention_and_experts(gm: fx.GraphModule) -> list[Decision]:
        out = []
        rotary, plain = rotary_attention.chains(gm)
        if rotary:
            out.append(Decision(rotary_attention.NAME, NOT_BUILT, ", ".join(rotary), rotary_attention.WHY))
        else:
            where = ", ".join(plain) or "-"
            why = "SDPA calls without a rotary before them" if plain else "no SDPA call in this segment"
            out.append(Decision(rotary_attention.NAME, NOT_MATCHED, where, why))
        experts = moe_experts.expert_gemms(gm)
        if experts:
            out.append(Decision(moe_experts.NAME, NOT_BUILT, ", ".join(experts), moe_experts.WHY))
        else:
            out.append(Decision(moe_experts.NAME, NOT_MATCHED, "-", "no GEMM on a 3-D (experts) weight"))
        return out
