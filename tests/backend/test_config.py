"""CompilerConfig: nested sections, validation on assignment with the allowed values."""

from __future__ import annotations

import pytest

import superkernel as sk


def test_defaults_and_assignment():
    cfg = sk.CompilerConfig()
    assert cfg.mode == "max-autotune"
    assert cfg.debug.run_eagerly is False and cfg.debug.graph_dump.type is None
    cfg.mode = "reduce-overhead"
    cfg.debug.graph_dump.type = "py"
    cfg.debug.graph_dump.path = "/tmp/x"
    cfg.experimental_config.static_kernel.batch_sizes = (1, 2)
    assert cfg.to_dict()["debug"]["graph_dump"] == {"type": "py", "path": "/tmp/x"}
    assert cfg.experimental_config.static_kernel.batch_sizes == [1, 2]


@pytest.mark.parametrize("path, value, error, message", [
    ("mode", "fast", ValueError, r"invalid value 'fast' for config.mode; allowed values: 'reduce-overhead', 'max-autotune'"),
    ("debug.graph_dump.type", "json", ValueError, r"allowed values: None, 'txt', 'py'"),
    ("debug.run_eagerly", "yes", TypeError, r"config.debug.run_eagerly must be bool"),
    ("experimental_config.static_kernel.batch_sizes", [0, 2], ValueError, r"list of positive integers"),
])
def test_invalid_values(path, value, error, message):
    cfg = sk.CompilerConfig()
    *parents, leaf = path.split(".")
    target = cfg
    for p in parents:
        target = getattr(target, p)
    with pytest.raises(error, match=message):
        setattr(target, leaf, value)


def test_unknown_field_lists_allowed():
    cfg = sk.CompilerConfig()
    with pytest.raises(AttributeError, match=r"unknown field config.debug.dump; allowed: run_eagerly, graph_dump"):
        cfg.debug.dump = True
    with pytest.raises(AttributeError, match="is a section"):
        cfg.debug = None


def test_from_dict_round_trip_and_fingerprint():
    cfg = sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "debug": {"run_eagerly": True}})
    again = sk.CompilerConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert again.fingerprint() == cfg.fingerprint()
    again.debug.graph_dump.path = "elsewhere"
    assert again.fingerprint() == cfg.fingerprint()  # paths do not change generated code
    again.mode = "max-autotune"
    assert again.fingerprint() != cfg.fingerprint()
    with pytest.raises(AttributeError, match="unknown field config.bogus"):
        sk.CompilerConfig.from_dict({"bogus": 1})


def test_dynamic_sources_field():
    cfg = sk.CompilerConfig()
    assert cfg.dynamo.dynamic_sources == [r".*\.cumulative_length_int$"]
    cfg.dynamo.dynamic_sources.append(r".*\.mine$")
    assert sk.CompilerConfig().dynamo.dynamic_sources == [r".*\.cumulative_length_int$"]  # defaults are not shared
    with pytest.raises(ValueError, match="not a regular expression"):
        cfg.dynamo.dynamic_sources = ["("]
    with pytest.raises(ValueError, match="no commas"):
        cfg.dynamo.dynamic_sources = ["a,b"]


class _Counter:
    def __init__(self) -> None:
        self.step_int = 0


@pytest.mark.parametrize("sources, compiles", [([r".*\.step_int$"], 1), ([], 3)])
def test_dynamic_sources_apply_while_dynamo_traces(sources, compiles):
    """A Python int that grows every call compiles once when it is a configured dynamic source;
    torch's own config is left as it was outside the compile."""
    import torch

    from superkernel.pipeline.backend import find_backend

    state = _Counter()

    def step(x):
        with sk.super_kernel("s"):
            y = x * state.step_int + 1
        state.step_int += 1
        return y

    # (the flat program: each specialized graph would otherwise be a native C++ build of its own)
    cfg = sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "cpu": {"native": False},
                                       "dynamo": {"dynamic_sources": sources}})
    before = torch.compiler.config.dynamic_sources
    fn = sk.compile(step, cfg)
    x = torch.ones(4)
    for i in range(3):
        assert torch.equal(fn(x), x * i + 1)
        assert torch.compiler.config.dynamic_sources == before
        assert not torch._dynamo.config.capture_scalar_outputs
    assert len(sk.explain(find_backend(fn)).graphs) == compiles
