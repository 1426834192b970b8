"""The launcher's watchdog: a crashed, killed or hung rank ends the job with one line, fast."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from superkernel.tools.distributed.launcher import LaunchError, check_nproc, launch, rank_env

from ._helpers import SRC

HERE = Path(__file__).parent
COMMAND = [sys.executable, str(HERE / "_rank_fail.py")]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_a_healthy_job_exits_zero():
    assert launch(["ok"], 2, env=_env(), command=COMMAND) == 0


@pytest.mark.parametrize("what, says", [("kill", "rank 1 of 2 was killed by SIGKILL"),
                                        ("exit", "rank 1 of 2 exited with status 3"),
                                        ("hang", "rank 1 of 2 is hung")])
def test_a_failed_rank_ends_the_job_within_60_s(what, says):
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch([what], 2, env=_env(), command=COMMAND, stale_s=6.0)  # (3 heartbeats)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert says in message and "the job was stopped" in message
    assert "\n" not in message
    assert elapsed < 60
    if what == "exit":
        assert "bad things" in message   # the rank's own error line comes along


def test_rank_env_and_nproc_checks(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    env = rank_env()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (1, 2, 1, 2)
    check_nproc(2)
    with pytest.raises(LaunchError, match="--nproc 4 but this process runs in a job of WORLD_SIZE=2"):
        check_nproc(4)
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(LaunchError, match="inconsistent job layout"):
        rank_env()


def test_ranks_end_when_the_launcher_is_killed(tmp_path):
    """SIGKILL the launcher itself: its ranks notice within a few seconds and exit (no orphans)."""
    import signal
    import subprocess

    code = ("import sys; sys.path.insert(0, %r); from superkernel.tools.distributed.launcher import launch; "
            "launch(['sleep'], 2, command=[sys.executable, %r])" % (SRC, str(HERE / "_rank_fail.py")))
    # (its job dir, which a killed launcher cannot remove, goes to tmp_path, not the user's temp dir)
    parent = subprocess.Popen([sys.executable, "-c", code], env={**_env(), "TMPDIR": str(tmp_path)})
    children: list[int] = []
    deadline = time.monotonic() + 120
    while len(children) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            children = [int(p) for p in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()]
        except OSError:
            pass
    assert len(children) == 2
    time.sleep(2)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in children):
        time.sleep(0.5)
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists()
             and "zombie" not in Path(f"/proc/{pid}/status").read_text()]
    for pid in alive:  # do not leave them behind if the test fails
        os.kill(pid, signal.SIGKILL)
    assert not alive


def test_nproc_on_cuda_needs_as_many_gpus():
    from superkernel.tools.distributed.launcher import LaunchError, check_gpus

    check_gpus(2, "cuda", device_count=lambda: 2)
    check_gpus(2, "cpu", device_count=lambda: 0)  # gloo ranks on the CPU: no GPU needed
    check_gpus(2, "auto", device_count=lambda: 0)  # auto without a GPU means the CPU
    with pytest.raises(LaunchError, match=r"--nproc 2 on --device cuda needs 2 GPUs .* has 1\. Use --nproc 1"):
        check_gpus(2, "cuda", device_count=lambda: 1)
    with pytest.raises(LaunchError, match="has none visible"):
        check_gpus(4, "cuda:0", device_count=lambda: 0)
    with pytest.raises(LaunchError, match="needs 8 GPUs"):
        check_gpus(8, "auto", device_count=lambda: 1)


def test_of_two_failed_ranks_the_one_that_stopped_writing_first_is_named(tmp_path):
    """Both ranks seen failed at one look (a loaded machine): rank 1 exited, then rank 0's collective failed on
    the closed connection; the cause named is rank 1, whose log was written last before rank 0's."""
    from superkernel.tools.distributed.launcher import first_to_stop

    logs = []
    for rank, when in ((0, 2_000_000_000), (1, 1_000_000_000)):
        path = tmp_path / f"rank{rank}.log"
        path.write_text("error\n")
        os.utime(path, ns=(when, when))
        logs.append(path.open("rb"))
    try:
        assert first_to_stop([(0, 1), (1, 3)], logs) == (1, 3)
    finally:
        for log in logs:
            log.close()
