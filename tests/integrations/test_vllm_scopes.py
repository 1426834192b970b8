"""superkernel.integrations.vllm without vLLM: scopes by module path on a traced graph, the plans by name, the
fallback of a graph that fails to compile. These run in ``make test`` too (nothing here imports vLLM); the
engine tests are in test_vllm_engine.py."""

from __future__ import annotations

import warnings

import pytest
import torch

import superkernel as sk
from superkernel.integrations.vllm import backends
from superkernel.integrations.vllm.backend import VllmBackend
from superkernel.integrations.vllm.fallback import VllmPlanFallbackWarning
from superkernel.integrations.vllm.scopes import label_for, module_path


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.mlp = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.mlp(torch.relu(self.self_attn(x))) + x


class Model(torch.nn.Module):  # the shape of vLLM's LlamaModel: layers.N.{self_attn, mlp}, a final norm
    def __init__(self):
        super().__init__()
        self.layers, self.norm = torch.nn.ModuleList([Layer(), Layer()]), torch.nn.LayerNorm(8)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


@pytest.mark.parametrize("raw, path", [
    ("L['self'].layers[3].mlp", "layers.3.mlp"),
    ("L['self']._modules['layers']._modules['3']._modules['self_attn']", "layers.3.self_attn"),
    ("getattr(L['self'].layers, '3').mlp", "layers.3.mlp"),
    ("L['self'].norm", "norm"),
])
def test_module_paths_as_dynamo_writes_them(raw, path):
    assert module_path(raw) == path


def test_labels_per_strategy():
    inside = ["layers.3", "layers.3.self_attn"]
    assert label_for("decoder_layer", inside) == "decoder_layer_3"
    assert label_for("all_layers", inside) == "all_layers"
    assert label_for("attention", inside) == "attention_3"
    assert label_for("mlp", inside) is None
    assert label_for("full_model", ["norm"]) == "full_model"
    assert label_for("decoder_layer", ["norm"]) is None


@pytest.mark.parametrize("strategy, scopes", [
    ("decoder_layer", {"decoder_layer_0", "decoder_layer_1"}),
    ("all_layers", {"all_layers"}),
    ("full_model", {"full_model"}),
    ("mlp", {"mlp_0", "mlp_1"}),
])
def test_plans_scope_the_traced_graph_and_stay_exact(strategy, scopes):
    torch.manual_seed(0)
    model, x = Model().eval(), torch.randn(2, 8)
    backend = VllmBackend(strategy)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(x)
        assert torch.equal(got, model(x))
    assert set(backend.annotated[0]) == scopes and backend.fallbacks == 0
    explained = sk.explain(backend)
    assert {s.scope for g in explained.graphs for s in g.segments} == scopes


def test_plans_by_qualified_name():
    assert backends.decoder_layer.plan == "decoder_layer (reduce-overhead)"
    assert backends.all_layers_max_autotune.config.mode == "max-autotune"
    assert backends.decoder_layer is backends.decoder_layer  # one backend per process and name
    with pytest.raises(AttributeError, match="no plan 'layers'"):
        backends.layers  # noqa: B018
    with pytest.raises(ValueError, match="unknown vLLM scope strategy"):
        VllmBackend("everything")


def test_a_graph_that_fails_to_compile_runs_as_traced_with_one_warning():
    """strict-scope-check=abort on a scope holding an operator registered unfusable: superkernel raises, the
    integration warns once (scope and reason) and the graph runs as Dynamo traced it."""
    from superkernel.pipeline.segments import register_unfusable, unregister_unfusable

    torch.manual_seed(0)
    model, x = Model().eval(), torch.randn(2, 8)
    backend = VllmBackend("decoder_layer", options="strict-scope-check=abort")
    register_unfusable("aten::relu", "deliberately unfusable (test)")
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            got = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(x)
    finally:
        unregister_unfusable("aten::relu")
    ours = [str(w.message) for w in caught if issubclass(w.category, VllmPlanFallbackWarning)]
    assert len(ours) == 1 and "decoder_layer_0" in ours[0] and "aten::relu" in ours[0], ours
    assert backend.fallbacks == 1 and torch.equal(got, model(x))


def test_max_autotune_on_a_dynamic_size_falls_back_instead_of_killing_the_engine():
    """In vLLM (mode 2) the token count is a dynamic size; Inductor's segments specialized it and Dynamo then
    failed building guards after the backend returned (a dead engine). The plan now refuses such a graph inside
    the guarded compile: one warning, the graph runs as traced."""
    torch.manual_seed(0)
    model, x = Model().eval(), torch.randn(5, 8)
    backend = VllmBackend("decoder_layer", mode="max-autotune")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    torch._dynamo.mark_dynamic(x, 0)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        got = compiled(x)
    ours = [str(w.message) for w in caught if issubclass(w.category, VllmPlanFallbackWarning)]
    assert len(ours) == 1 and "needs static shapes" in ours[0], ours
    assert backend.fallbacks == 1 and torch.equal(got, model(x))
