"""Shared fixtures for graph-autofusion tests: reference models exported from PyTorch once
per session (tiny dims), and helpers that fuse a model and run the result in ONNX Runtime."""

from __future__ import annotations

import os
from dataclasses import dataclass

import onnx_ir as ir
import pytest

from superkernel.onnx import catalog, engine, zoo
from superkernel.onnx import verify as V
from tests._env import environ

DIMS = zoo.Dims(batch=2, seq=8, hidden=64, heads=4, kv_heads=2, intermediate=128)


@pytest.fixture(scope="package", autouse=True)
def calibration_cache(tmp_path_factory):
    """Micro-benchmark results of the tests go to a temporary cache, not the user's.

    Package-scoped (as are the other autouse fixtures here): a session-scoped one stayed set after the
    ONNX tests, and every later test in the same xdist worker then compiled reduce-overhead graphs with
    an empty superkernel cache (native modules and precompiled headers rebuilt: an order dependence).
    """
    path = str(tmp_path_factory.mktemp("sk_cache"))
    with environ(SUPERKERNEL_CACHE_DIR=path):
        yield path


@pytest.fixture(scope="package", autouse=True)
def short_measurements():
    """Real micro-benchmarks and end-to-end checks run in the tests to prove the path works;
    which fusion a measurement keeps is tested through the ``measure=`` / ``timer=`` seams, so
    fewer rounds suffice here (the product defaults stay)."""
    from superkernel.onnx import calibrate, e2e

    saved = calibrate.MICRO_WARMUP, calibrate.MICRO_ROUNDS, e2e.WARMUP, e2e.ROUNDS
    calibrate.MICRO_WARMUP, calibrate.MICRO_ROUNDS, e2e.WARMUP, e2e.ROUNDS = 1, 8, 1, 8
    try:
        yield
    finally:
        calibrate.MICRO_WARMUP, calibrate.MICRO_ROUNDS, e2e.WARMUP, e2e.ROUNDS = saved


@pytest.fixture(scope="package", autouse=True)
def onnx_registry_built_once():
    """torch.onnx.export(dynamo=True) rebuilds its operator registry from torchlib on every
    call (about 1 s, most of a small export); the tests export dozens of small modules, so
    the registry is built once per opset and reused. It is only read during an export (the
    tests pass no custom translation table), so what is exported does not change."""
    try:
        from torch.onnx._internal.exporter import _registration as reg

        original = reg.ONNXRegistry.__dict__["from_torchlib"]
        build = original.__func__
    except (ImportError, KeyError, AttributeError):  # another torch: export as usual
        yield
        return
    built: dict = {}

    def from_torchlib(cls, *args, **kw):
        key = (cls, args, tuple(sorted(kw.items())))
        if key not in built:
            built[key] = build(cls, *args, **kw)
        return built[key]

    reg.ONNXRegistry.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        reg.ONNXRegistry.from_torchlib = original


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gaf_models")


@pytest.fixture(scope="session")
def exported(model_dir):
    """exported(key) -> path: the zoo models, exported on first use and cached."""
    cache: dict[str, str] = {}
    specs = {
        "ln_mlp": dict(name="ln_mlp"),
        "bert": dict(name="bert"),
        "llama": dict(name="llama"),
        "llama_dyn": dict(name="llama", dynamic=True),
        "ln_mlp_dyn": dict(name="ln_mlp", dynamic=True),
        "llama_ext": dict(name="llama", external_data=True),
        "ln_mlp_opset20": dict(name="ln_mlp", opset=20),
    }

    def get(key: str) -> str:
        if key not in cache:
            kw = dict(specs[key])
            name = kw.pop("name")
            sub = model_dir / key
            sub.mkdir(exist_ok=True)
            cache[key] = zoo.export(name, sub / f"{key}.onnx", DIMS, **kw)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def export_module(model_dir):
    """export_module(key, module, args) -> path, cached by key (for near-miss models)."""
    cache: dict[str, str] = {}

    def get(key, module, args, **kw):
        if key not in cache:
            cache[key] = zoo.export_module(module.eval(), args, model_dir / f"nm_{key}.onnx", **kw)
        return cache[key]

    return get


@dataclass
class Fused:
    path: str
    model: ir.Model
    result: engine.FusionResult
    out_path: str

    def ops(self) -> dict[str, int]:
        return engine.op_counts(self.model.graph)

    def nodes(self, op_type: str) -> list[ir.Node]:
        return [n for n in self.model.graph if n.op_type == op_type]

    def applied(self, rule: str) -> list[engine.Candidate]:
        return [c for c in self.result.applied if c.rule == rule]

    def near(self, rule: str) -> list[engine.NearMiss]:
        return [m for m in self.result.near_misses if m.rule == rule]

    def verify(self, **kw) -> V.VerifyResult:
        return V.verify(self.path, self.out_path, **kw)


@pytest.fixture
def fuse(tmp_path):
    """fuse(path, rules='all', level=3, dims=None) -> Fused, with the fused model saved."""

    def run(path, rules="all", level=3, dims=None, debug=False):
        model = ir.load(path)
        specs = catalog.select_rules(rules, level)
        result = engine.fuse(model, specs, dims=dims or {}, debug=debug)
        out = os.path.join(tmp_path, f"fused_{os.path.basename(path)}")
        ir.save(model, out)
        return Fused(path, model, result, out)

    return run
