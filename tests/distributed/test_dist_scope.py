"""Collectives inside a scope on CPU: a 2-rank gloo job, reduce-overhead bit-exact on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from ._helpers import run_ranks

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    # each rank dumps its graphs to rank<R>/ under this directory
    results = run_ranks(HERE / "_rank_scope.py", [str(tmp_path_factory.mktemp("dumps"))])
    return results


def test_every_rank_is_bit_exact_to_its_reference(ranks):
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["bit_exact"], r
        assert r["eager_equal"], r          # the captured graph run op by op = the sharded eager model
        assert r["second_call_max_abs"] < 1e-5


def _group_name_is_typed_str() -> bool:
    """torch 2.11's ``_c10d_functional.all_reduce`` types ``group_name`` as ``str``, which a native module passes;
    torch 2.13 types it ``Any``, which the native code generator does not take yet."""
    import torch

    schema = torch.ops._c10d_functional.all_reduce.default._schema
    return str(next(a for a in schema.arguments if a.name == "group_name").type) == "str"


def test_the_all_reduce_is_inside_the_one_segment(ranks):
    for r in ranks:
        assert r["cuts"] == 0
        if _group_name_is_typed_str():  # one native module calls the all-reduce (torch 2.11)
            assert len(r["segments"]) == 1 and r["segments"][0][1:] == ["cpu-native", None]
        else:
            # one segment, run as one flat ATen program; the native C++ module does not take the
            # collective's group-name argument (typed Any) yet, and says so instead of cutting the scope
            assert len(r["segments"]) == 1 and r["segments"][0][1] == "cpu-flat"
            assert "NativeCollectiveUnsupported" in r["segments"][0][2]
        ops = {c["op"] for c in r["collectives"]}
        assert any("all_reduce" in op for op in ops), r["collectives"]
        assert {c["partition"] for c in r["collectives"]} == {r["segments"][0][0]}


def test_the_fallback_names_the_collective_and_abort_raises_on_it(ranks):
    """What happens is said as it is (one flat program, not eager), and strict-scope-check=abort raises naming
    the collective."""
    if _group_name_is_typed_str():
        assert all(r["abort_error"] is None for r in ranks)  # nothing falls back, nothing to abort on
        pytest.skip("this torch's native module calls the all-reduce itself: no fallback to name")
    for r in ranks:
        cause = r["segments"][0][2]
        assert cause is not None and "holds the collective(s) _c10d_functional::all_reduce" in cause
        error = (r["abort_error"] or "").splitlines()[0]  # (Dynamo appends its own hint lines)
        assert error.startswith("SuperKernelScopeError")
        assert "strict-scope-check=abort: segment 'mlp' of scope 'mlp' cannot run as a native module" in error
        assert "the collective(s) _c10d_functional::all_reduce" in error


def test_sharding_matches_the_unsharded_model(ranks):
    for r in ranks:
        assert r["gathered_head_shape"] == [2, 16] and r["gathered_head_max_abs"] < 1e-6  # colwise_rep's gather
        assert r["sharded"] == {"up": "colwise", "down": "rowwise"}
        assert r["up_rows"] == 32                # 64 output features over 2 ranks
        assert r["vs_unsharded_max_abs"] < 1e-5  # another summation order, not another result


def test_max_autotune_never_times_a_partition_holding_a_collective(ranks):
    """Choosing plain vs frozen runs a partition as often as each rank's own clock decides; with the
    all-reduce inside, ranks would pair different calls (gloo matches by order) and sum the wrong
    tensors. Such a partition is compiled plain without timing, and the result is right."""
    for r in ranks:
        assert r["max_autotune_not_timed"] >= 1 and r["max_autotune_frozen"] == 0, r
        assert r["max_autotune_max_abs"] < 1e-5, r
