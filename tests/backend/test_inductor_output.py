"""Library use is quiet: what TorchInductor prints while superkernel compiles (max-autotune's AUTOTUNE tables and
timing lines) goes to the ``superkernel.inductor`` logger at debug level, not to the user's terminal."""

from __future__ import annotations

import io
import logging
import sys
import threading

import torch

import superkernel as sk
from superkernel.runtime.inductor.output import LOGGER, output_logged


def test_a_max_autotune_compile_prints_no_autotune_table(capfd, caplog):
    """A frozen CPU max-autotune segment has Inductor time its GEMM choices, which it reports on stderr."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).eval()
    cfg = sk.CompilerConfig.from_dict({"mode": "max-autotune",
                                       "inductor": {"freezing": True, "gemm_timing": "cache", "cpp_wrapper": False}})
    x = torch.randn(1, 16)
    # no cache may skip the autotuning (then nothing would be printed in the first place)
    with caplog.at_level(logging.DEBUG, logger=LOGGER), torch.no_grad(), \
            torch._inductor.config.patch(fx_graph_cache=False, autotune_local_cache=False):
        torch.testing.assert_close(sk.compile(model, cfg)(x), model(x))
    out, err = capfd.readouterr()
    assert "AUTOTUNE" not in out + err and "Autotune Choices" not in out + err, err
    logged = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == LOGGER)
    assert any(line.startswith("AUTOTUNE") for line in logged), logged
    assert any("AUTOTUNE benchmarking takes" in line for line in logged), logged


def test_only_the_compiling_thread_is_logged(caplog):
    terminal = io.StringIO()
    saved = sys.stderr
    sys.stderr = terminal
    try:
        with caplog.at_level(logging.DEBUG, logger=LOGGER), output_logged():
            sys.stderr.write("AUTOTUNE mm(1x8, 8x8)\n  choice 0.1 ms")
            other = threading.Thread(target=lambda: sys.stderr.write("another thread's line\n"))
            other.start()
            other.join()
        assert sys.stderr is terminal  # put back
    finally:
        sys.stderr = saved
    assert terminal.getvalue() == "another thread's line\n"
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == ["AUTOTUNE mm(1x8, 8x8)", "  choice 0.1 ms"]


def test_the_optimize_log_keeps_the_lines(tmp_path):
    from superkernel.tools.advisor.run_log import RunLog

    log = RunLog(tmp_path / "superkernel.log")
    with log.capture(), output_logged():
        sys.stderr.write("AUTOTUNE packed_linear(1x64, 64x128)\n")
    text = log.close().read_text()
    assert "AUTOTUNE packed_linear(1x64, 64x128)" in text
    assert logging.getLogger(LOGGER).propagate and not logging.getLogger(LOGGER).handlers  # restored
