"""Issue 36: the CUDA cut rules over a fake-CUDA trace of the sweep's CI subset (and llama).

On CUDA a decode step is one CUDA graph unless a cut splits it. The cuts come from
``build_segments(gm, cut_rule=cuda_cut_reason, split_unscoped=True)``: scoped operators a CUDA graph
cannot hold, and with ``split_unscoped`` unscoped ones too (``Segmentation.step_cuts``). Here those rules
run over the ATen graphs of one decode step of every model type of the CI subsets
(``tools.models.registry.CI_SUBSET``, ``tools.models.archs.CI_SUBSET``) and llama, built with ``build_tiny``,
scoped with the ``decoder_layer`` strategy, and traced as on device ``cuda`` without a GPU
(``tests/backend/fake_cuda_trace.py`` says how, and what differs from a trace on a GPU).

What was found (torch 2.13, transformers 5.24):

============== ======= ============= ========================================================================
model type      graphs  prefill       cuts (scope cuts / step cuts)
============== ======= ============= ========================================================================
biogpt          1       fake CUDA     none
llama           1       fake CUDA     none
mamba           1       fake CUDA     none
mistral         1       fake CUDA     none (4 in the raw fake trace, none on a GPU: see below)
mpt             4 of 8  CPU, moved    none in the 4 graphs up to its graph break (the rest is not traced)
opt             1       fake CUDA     none
recurrent_gemma 1       fake CUDA     none
rembert         1       CPU, moved    none
============== ======= ============= ========================================================================

- No decode step builds a mask, a position or anything else on the CPU: every tensor of every graph is on
  CUDA, so no step is split. No false positive of ``cpu_in_cuda_reason`` shows in these graphs (the rule
  never meets a CPU tensor in them).
- mistral's sliding-window cache (``StaticSlidingWindowLayer.update``, cache_utils.py:579) builds
  ``torch.tensor([-1], device=self.device)`` every step. Traced without a GPU, that is a CPU
  ``lift_fresh_copy`` and a ``_to_copy`` to CUDA, which the rule cuts (twice per layer); traced on a GPU it
  is a CUDA constant, which it does not (read from torch/csrc/utils/tensor_new.cpp, not run on a GPU:
  ``fake_cuda_trace.lift_constants_on_device``). The test keeps both: the raw cuts show the rule does cut
  CPU work in these graphs.
- max-autotune captures with Inductor's decompositions: the same cuts (mistral's device copy is a
  ``prims.device_put`` there; tested for mistral, seen by hand for the 7 models traced whole).
- mpt graph-breaks at modeling_mpt.py:121 (a slice index computed from ``cache.get_seq_length()``; the
  capture fallback, as in the CPU sweep). After the break transformers' code runs eagerly and reads that
  value on the host, which a fake tensor does not have: the graphs after it (4 more in a trace of the same
  step on the CPU) are not traced (``test_the_whole_step_is_traced`` skips it with the reason). The scopes'
  annotations are also lost in the graphs around the break (only the cache writes keep ``decoder_layer_0``),
  the same in the CPU trace.
- Beside a trace of the same step on the CPU, every graph is the same operator for operator and scope for
  scope, but attention: ``scaled_dot_product_attention`` is its math decomposition here, a fused kernel on
  a GPU (see fake_cuda_trace.py), neither of them a cut.
- Under transformers 5.17 (the GPU machines') three rows differ, by that version's code: ``EXPECTED`` is
  amended for it below (found with ``make test-gpu-versions``).
- mpt and rembert cannot prefill eagerly on fake tensors (mpt reads the cache length on the host;
  rembert's default mask takes transformers' tracing branch, ``is_tracing`` is true for a FakeTensor, and
  fails); their cache is the real CPU prefill's, every tensor moved to CUDA, as transformers'
  ``lazy_initialization`` does on a GPU.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from superkernel.tools.models import archs, registry
from tests.backend.fake_cuda_trace import (
    FakeCudaUnavailable, build_guard_library, host_reads_of_constants, lift_constants_on_device,
    trace_fake_cuda_decode,
)

MODEL_TYPES = sorted({*registry.CI_SUBSET, *(archs.ARCHS[name].model_type for name in archs.CI_SUBSET), "llama"})

CPU_LIFT = "CPU work inside a CUDA graph: aten::lift_fresh_copy computes on the CPU"
CPU_COPY = "CPU work inside a CUDA graph: aten::_to_copy reads the CPU tensor {} (host-to-device transfer)"
SLIDING_INDEX = "cache_utils.py"  # StaticSlidingWindowLayer.update: index = torch.tensor([-1], device=self.device)


@dataclass(frozen=True)
class Expected:
    #: (graph, scope, op, reason, source file) of every cut, scope cuts and step cuts, on the graphs as a GPU
    #: traces them (after ``lift_constants_on_device``)
    cuts: tuple[tuple[Any, ...], ...] = ()
    #: the same on the raw fake-CUDA graphs
    raw_cuts: tuple[tuple[Any, ...], ...] = ()
    #: ``torch.tensor(data, device="cuda")`` chains put back into the GPU's form
    constants_moved: int = 0
    graphs: int = 1
    prefill: str = "fake-cuda"
    #: a pattern of why the trace stopped early (None: the whole step was traced)
    incomplete: str | None = None


EXPECTED: dict[str, Expected] = {
    "biogpt": Expected(),
    "llama": Expected(),
    "mamba": Expected(),
    "mistral": Expected(constants_moved=2, raw_cuts=(
        (0, "decoder_layer_0", "aten::lift_fresh_copy", CPU_LIFT, SLIDING_INDEX),
        (0, "decoder_layer_0", "aten::_to_copy", CPU_COPY.format("lift_fresh_copy"), SLIDING_INDEX),
        (0, "decoder_layer_1", "aten::lift_fresh_copy", CPU_LIFT, SLIDING_INDEX),
        (0, "decoder_layer_1", "aten::_to_copy", CPU_COPY.format("lift_fresh_copy_1"), SLIDING_INDEX),
    )),
    "mpt": Expected(graphs=4, prefill="cpu, moved",
                    incomplete=r"reads a value on the host \(aten\._local_scalar_dense\.default\) at "
                               r"modeling_mpt\.py:\d+ \(position_bias = position_bias\["),
    "opt": Expected(),
    "recurrent_gemma": Expected(),
    "rembert": Expected(prefill="cpu, moved"),
}

#: Under transformers 5.17 (the GPU machines'; ``make test-gpu-versions``, 2026-12-06, torch 2.11): its
#: masking_utils.py:604 builds the mask's fill value with ``torch.tensor(0.0, device=mask.device)`` every step
#: (mpt, rembert): a CPU ``lift_fresh_copy`` and a copy in the raw fake trace, a CUDA constant on a GPU (moved;
#: no cut either way after that); recurrent_gemma binds two methods onto its cache with ``__get__`` every step
#: (modeling_recurrent_gemma.py:675), a call Dynamo skips: two graph breaks, five graphs, none with a cut.
MASK_FILL = "masking_utils.py"


def _mask_fill_cuts(graph: int) -> tuple[tuple[Any, ...], ...]:
    return ((graph, "", "aten::lift_fresh_copy", CPU_LIFT, MASK_FILL),
            (graph, "", "aten::_to_copy", CPU_COPY.format("lift_fresh_copy"), MASK_FILL))


if transformers.__version__.startswith("5.17."):
    EXPECTED = {**EXPECTED,
                "mpt": dataclasses.replace(EXPECTED["mpt"], raw_cuts=_mask_fill_cuts(1), constants_moved=1),
                "rembert": dataclasses.replace(EXPECTED["rembert"], raw_cuts=_mask_fill_cuts(0), constants_moved=1),
                "recurrent_gemma": Expected(graphs=5)}


@dataclass
class Result:
    trace: Any
    raw_cuts: list[tuple[Any, ...]]
    cuts: list[tuple[Any, ...]]
    constants_moved: list[str]
    constant_reads: list[str]
    cpu_values: list[str]          # nodes still described on the CPU after lift_constants_on_device


def _cuts(graphs: list[Any]) -> list[tuple[Any, ...]]:
    """Every cut the CUDA rows make, graph by graph, segmented as the backend does it (a graph that starts
    in the scope the previous one ended in, after a graph break, continues it)."""
    from superkernel.pipeline.segments import build_segments, last_scope
    from superkernel.runtime.realizations.cuda_rows import cuda_cut_reason

    rows: list[tuple[Any, ...]] = []
    previous: tuple[str, str | None] = ("", None)
    for index, graph in enumerate(graphs):
        segmentation = build_segments(graph.gm, continues_scope=previous[0] if previous[1] else None,
                                      break_reason=previous[1], cut_rule=cuda_cut_reason, split_unscoped=True)
        previous = (last_scope(graph.gm), graph.break_reason)
        for cut in [*segmentation.cuts, *segmentation.step_cuts]:
            source = Path(cut.source.rsplit(":", 1)[0]).name if cut.source else None
            rows.append((index, cut.scope, cut.op, cut.reason, source))
    return rows


def _cpu_values(graphs: list[Any]) -> list[str]:
    from superkernel.ir.graph import tensor_values

    return [f"{i}: {node.name}" for i, graph in enumerate(graphs) for node in graph.gm.graph.nodes
            if any(t.device.type == "cpu" for t in tensor_values(node.meta.get("val")))]


@pytest.fixture(scope="module")
def guard_library(tmp_path_factory):
    try:
        return build_guard_library(tmp_path_factory.mktemp("fake_cuda_guard"))
    except FakeCudaUnavailable as exc:
        pytest.skip(f"no fake CUDA device guard, so no fake-CUDA trace: {exc}")


@pytest.fixture(scope="module")
def traced(guard_library):
    """model type -> :class:`Result`, each model traced once for the module."""
    import superkernel
    from superkernel.tools.advisor.strategies import plan_for
    from superkernel.tools.advisor.structure import analyze_structure
    from superkernel.tools.decode import prepare
    from superkernel.tools.models.sweep import PROMPT_LEN

    results: dict[str, Result] = {}

    def get(model_type: str, mode: str = "reduce-overhead") -> Result:
        if (model_type, mode) not in results:
            model = registry.build_tiny(model_type)
            # one warm-up and one step: what the trace needs of the session (mask, growing ints) is measured
            session = prepare(model, prompt_len=PROMPT_LEN, steps=1, warmup=1, seed=0)
            superkernel.apply_scopes(model, plan_for("decoder_layer", analyze_structure(model)).scopes)
            trace = trace_fake_cuda_decode(model_type, model, session, guard_library=guard_library, mode=mode)
            raw = _cuts(trace.graphs)
            moved = [f"{i}: {line}" for i, g in enumerate(trace.graphs) for line in lift_constants_on_device(g.gm)]
            results[(model_type, mode)] = Result(
                trace, raw, _cuts(trace.graphs), moved,
                [f"{i}: {line}" for i, g in enumerate(trace.graphs) for line in host_reads_of_constants(g.gm)],
                _cpu_values(trace.graphs))
        return results[(model_type, mode)]

    return get


def test_the_subset_is_the_sweeps():
    assert set(EXPECTED) == set(MODEL_TYPES)
    assert {"mamba", "mpt", "biogpt", "rembert", "recurrent_gemma", "mistral", "opt", "llama"} == set(MODEL_TYPES)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_cuda_cut_rules_on_a_fake_cuda_decode_step(model_type, traced):
    result, expected = traced(model_type), EXPECTED[model_type]
    trace = result.trace
    assert trace.prefill == expected.prefill, trace.prefill_error
    assert len(trace.graphs) == expected.graphs and all(g.ran for g in trace.graphs)
    assert result.cuts == list(expected.cuts)
    assert result.raw_cuts == list(expected.raw_cuts)
    # the graphs as a GPU traces them have no CPU tensor at all, and no host read this trace could add
    assert result.cpu_values == [] and result.constant_reads == []
    assert len(result.constants_moved) == expected.constants_moved, result.constants_moved
    if expected.incomplete is None:
        assert trace.incomplete is None
    else:
        assert trace.incomplete is not None and re.search(expected.incomplete, trace.incomplete), trace.incomplete


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_whole_step_is_traced(model_type, traced):
    trace = traced(model_type).trace
    if trace.incomplete is not None:
        pytest.skip(f"{model_type}: fake-CUDA trace stopped: {trace.incomplete}")
    assert trace.graphs and trace.graphs[-1].break_reason is None  # the last graph ended the step, not a break


def test_max_autotune_decompositions_change_nothing_for_the_cuts(traced):
    """max-autotune captures with Inductor's decompositions (``InductorCudaGraph.decompositions``): mistral's
    device copy of its index constant is a ``prims.device_put`` there; the cuts are the same."""
    result = traced("mistral", "max-autotune")
    raw = [(g, scope, op, source) for g, scope, op, _, source in result.raw_cuts]
    assert raw == [(0, f"decoder_layer_{layer}", op, SLIDING_INDEX)
                   for layer in (0, 1) for op in ("aten::lift_fresh_copy", "prims::device_put")]
    assert result.cuts == [] and result.cpu_values == [] and result.constant_reads == []
    assert len(result.trace.graphs) == 1 and result.trace.incomplete is None


def test_the_fake_cuda_guard_is_only_there_while_tracing(guard_library):
    """The shim is gone afterwards: a CPU-only build refuses CUDA device guards again (where it did before)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tests.backend.fake_cuda_trace import fake_cuda_device_guard

    if torch.backends.cuda.is_built():
        pytest.skip("a CUDA build has its own CUDA device guard (a no-op one without a GPU); the shim leaves it alone")

    def index_a_fake_cuda_tensor():
        with FakeTensorMode():
            return torch.empty(3, device="cuda:0")[:, None]

    with pytest.raises(RuntimeError, match="not linked with support for cuda"):
        index_a_fake_cuda_tensor()
    with fake_cuda_device_guard(guard_library):
        assert index_a_fake_cuda_tensor().device == torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match="not linked with support for cuda"):
        index_a_fake_cuda_tensor()
