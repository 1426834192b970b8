"""benchmarks/studies/gemv_ceiling.py: its argument checks and the blocked layout its hand kernel reads (the kernels
themselves are checked against ATen by the benchmark before anything is timed)."""

from __future__ import annotations

import pytest
import torch

from tests._benchmarks import load_benchmark

gemv_ceiling = load_benchmark("studies/gemv_ceiling")


@pytest.mark.parametrize("argv, message", [
    (["--dtypes", "float16"], "allowed: float32, bfloat16"),
    (["--dtypes", ","], "none given"),
    (["--rounds", "0"], ">= 1"),
])
def test_bad_arguments_name_what_is_allowed(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        gemv_ceiling.main(argv + ["--output", str(tmp_path)])
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_blocked_weight_is_sixteen_rows_interleaved_along_k():
    w = torch.arange(32 * 6, dtype=torch.float32).reshape(32, 6)
    p = gemv_ceiling.blocked_weight(w)
    assert p.shape == (2, 6, 16)
    assert p.is_contiguous()
    for nb in range(2):
        for k in range(6):
            assert torch.equal(p[nb, k], w[nb * 16:(nb + 1) * 16, k])

