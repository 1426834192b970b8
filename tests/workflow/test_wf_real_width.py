"""benchmarks/real_width.py's small parts: the roofline's bandwidth and the checkpoint writer's refusals."""

from __future__ import annotations

from tests._benchmarks import load_benchmark


def _bench():
    return load_benchmark("real_width")


def test_best_bandwidth_keeps_the_fastest_read_per_kernel():
    rw = _bench()
    busy = {"read": 9.0, "copy": 7.0, "reads": {"sum": 9.0, "W @ x": 8.0}}
    quiet = {"read": 20.0, "copy": 5.0, "reads": {"sum": 4.0, "W @ x": 20.0}}
    best = rw.best_bandwidth(busy, quiet)
    assert best == {"read": 20.0, "copy": 7.0, "reads": {"sum": 9.0, "W @ x": 20.0}}


def test_save_checkpoint_refuses_an_existing_directory_and_a_bad_dtype(tmp_path, capsys):
    rw = _bench()
    existing = tmp_path / "ckpt"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    assert rw.main(["--save-checkpoint", str(existing)]) == 2
    assert "exists" in capsys.readouterr().err
    assert (existing / "keep.txt").read_text() == "mine"  # never overwritten
    assert rw.main(["--save-checkpoint", str(tmp_path / "new"), "--dtypes", "int8"]) == 2
    assert "allowed float32, bfloat16" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
