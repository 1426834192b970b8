"""The benefit model: pure functions over shapes, dtypes and byte counts."""

import pytest

from superkernel.onnx import benefit as B


def test_tensor_bytes_per_dtype():
    assert B.tensor_nbytes((2, 3, 4), "float32") == 96
    assert B.tensor_nbytes((2, 3, 4), "float16") == 48
    assert B.tensor_nbytes((2, 3, 4), "bfloat16") == 48
    assert B.tensor_nbytes((), "int64") == 8
    assert B.tensor_nbytes((3,), "int4") == 2  # rounded up
    with pytest.raises(KeyError):
        B.dtype_nbytes("float7")


def test_traffic_counts_one_write_and_each_read():
    t = B.TensorTraffic((10, 10), "float32", reads=2)
    assert t.nbytes == 400
    assert t.traffic_bytes == 1200


def test_net_benefit_is_memory_plus_scheduling_minus_penalties():
    m = B.CostModel(memory_bandwidth_gbps=10.0, dispatch_overhead_us=2.0)
    removed = [B.TensorTraffic((1000,), "float32", 1), B.TensorTraffic((1000,), "float32", 2)]
    b = B.estimate_benefit(removed, ops_removed=5, ops_added=1, model=m)
    assert b.bytes_saved == 4000 * 2 + 4000 * 3
    assert b.memory_saved_us == pytest.approx(20000 / 10e3)
    assert b.scheduling_saved_us == pytest.approx(4 * 2.0)
    assert b.launches_saved == 4
    assert b.penalty_us == 0
    assert b.net_us == pytest.approx(2.0 + 8.0)
    assert b.positive


def test_added_helpers_and_ops_can_make_a_fusion_not_worth_it():
    m = B.CostModel()
    removed = [B.TensorTraffic((16,), "float32", 1)]
    added = [B.TensorTraffic((64,), "float32", 1)]
    b = B.estimate_benefit(removed, ops_removed=3, ops_added=5, added=added, model=m)
    assert b.bytes_saved < 0
    assert b.launches_saved == -2
    assert not b.positive
    assert "net" in b.describe() and "-2 ops" in b.describe()


def test_dynamic_shape_penalty_is_a_fraction_of_the_fused_op_time():
    m = B.CostModel(memory_bandwidth_gbps=1.0, dynamic_shape_penalty=0.1)
    io = [B.TensorTraffic((250,), "float32", 1)]  # 1000 bytes -> 1 us
    b = B.estimate_benefit([], 2, 1, fused_io=io, dynamic_shapes=True, model=m)
    assert b.penalties_us == {"dynamic_shape": pytest.approx(0.1)}
    static = B.estimate_benefit([], 2, 1, fused_io=io, dynamic_shapes=False, model=m)
    assert static.penalties_us == {}


def test_cache_overflow_penalty_only_above_the_fill_limit():
    m = B.CostModel(memory_bandwidth_gbps=1.0, cache_bytes=1000, cache_fill_limit=0.8, cache_overflow_penalty=0.4)
    io = [B.TensorTraffic((500,), "float32", 1)]  # 2000 bytes -> 2 us
    below = B.estimate_benefit([], 2, 1, fused_io=io, row_bytes=800, model=m)
    above = B.estimate_benefit([], 2, 1, fused_io=io, row_bytes=801, model=m)
    assert "cache_overflow" not in below.penalties_us
    assert above.penalties_us["cache_overflow"] == pytest.approx(0.8)


def test_extra_penalties_are_added_and_reported():
    b = B.estimate_benefit([B.TensorTraffic((4,), "float32", 1)], 2, 1, extra_penalties_us={"slow_kernel": 5.0})
    assert b.penalties_us["slow_kernel"] == 5.0
    assert not b.positive
    assert b.to_dict()["net_us"] == pytest.approx(b.net_us)
