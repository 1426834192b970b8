"""The end-to-end check times large models in a child process on transparent huge pages
(superkernel.onnx.hugepages): the decision of when, and that the child really runs the same
PairSampler with the tunable and this worktree's superkernel. No timing is asserted."""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import superkernel
from superkernel.onnx import e2e, hugepages as H

needs_thp = pytest.mark.skipif(not (H.glibc_supports_tunable() and H.transparent_huge_pages_usable()),
                               reason="glibc < 2.35 or transparent huge pages off")


def _tiny(path) -> str:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    w = onnx.numpy_helper.from_array(np.eye(16, dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                          "t", [x], [y], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_only_large_models_go_to_a_child_and_never_twice(tmp_path, monkeypatch):
    m = _tiny(tmp_path / "m.onnx")
    (tmp_path / "m.onnx.data").write_bytes(b"0" * 1000)  # external data counts
    assert H.model_bytes(m) == os.path.getsize(m) + 1000
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert not H.should_use_child(m, m)  # small
    monkeypatch.setattr(H, "LARGE_MODEL_BYTES", 1)
    assert H.should_use_child(m, m) == (H.glibc_supports_tunable() and H.transparent_huge_pages_usable())
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")  # this process already is on huge pages
    assert not H.should_use_child(m, m)
    assert not H.should_use_child(b"bytes", m)  # in-memory models stay here
    assert H.child_env()["GLIBC_TUNABLES"] == H.TUNABLE  # not twice
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert H.child_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + H.TUNABLE


@needs_thp
def test_child_pair_sampler_times_in_a_huge_page_process(tmp_path, monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    m = _tiny(tmp_path / "m.onnx")
    s = H.ChildPairSampler(m, m, {"x": np.ones((4, 16), np.float32)}, warmup=1, seed=3)
    try:
        assert s.order in ([0, 1, 1, 0], [1, 0, 0, 1])
        assert H.TUNABLE in s.child["glibc_tunables"]
        assert s.child["superkernel"] == os.path.abspath(superkernel.__file__)  # this worktree's package
        pairs = s.sample(3) + s.sample(2)
        assert len(pairs) == 5 and all(isinstance(t, float) and math.isfinite(t) for p in pairs for t in p)
        assert s.seconds > 0
    finally:
        s.close()
    assert s._proc.returncode == 0


@needs_thp
def test_end_to_end_check_uses_the_child_for_a_large_model(exported, monkeypatch):
    """The whole check through the real sampler, with the size bar lowered to the tiny model."""
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(H, "LARGE_MODEL_BYTES", 1)
    path = exported("llama")

    class Staged:
        model_path = path

        def discard(self):
            pass

    class Fusion:
        applied = []

    _f, _st, rec = e2e.guard(path, Fusion(), Staged(), lambda excluded: None, dims={})
    assert rec["timed_in"].startswith("a child process with GLIBC_TUNABLES=") and H.TUNABLE in rec["timed_in"]
    assert rec["verdict"] in ("slower", "not slower", "unresolved") and rec["rounds"] >= e2e.ROUNDS
