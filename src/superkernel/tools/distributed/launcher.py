"""Start N ranks of a superkernel command on this node, or join a job torchrun started.

``superkernel optimize --nproc 2 ...`` runs the same command line again in N child
processes (``python -m superkernel ...``) with the environment torchrun would give them
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``); a child sees ``RANK`` and runs as one rank. Under ``torchrun`` the
command sees the same variables and joins directly.

The parent is a watchdog: a rank that exits with an error, is killed, or stops sending
its heartbeat (a frozen process) ends the job: every other rank is terminated and the
parent prints one line and exits non-zero. Ranks waiting on a dead peer inside a
collective are caught by this too (their peer's exit ends the job at once).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A rank whose heartbeat file is older than this is considered hung.
HEARTBEAT_STALE_S = 30.0
HEARTBEAT_EVERY_S = 2.0
#: A rank has this long to import torch and send its first heartbeat (slow on a loaded machine).
STARTUP_S = 120.0
_HEARTBEAT_ENV = "SUPERKERNEL_HEARTBEAT_DIR"
_LAUNCHER_ENV = "SUPERKERNEL_LAUNCHER_PID"
#: How long terminated ranks get before they are killed.
_GRACE_S = 5.0


class LaunchError(RuntimeError):
    """The distributed job failed: one line saying which rank and why."""


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in the job (from torchrun's variables)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def node_index(self) -> int:
        return self.rank // self.local_world_size

    @property
    def is_node_leader(self) -> bool:
        return self.local_rank == 0


def in_job() -> bool:
    """True when this process is one rank of a job (launched by us or by torchrun)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank_env() -> RankEnv:
    def read(name: str, default: int | None = None) -> int:
        value = os.environ.get(name)
        if value is None:
            if default is None:
                raise LaunchError(f"{name} is not set: run under superkernel --nproc N or torchrun")
            return default
        try:
            return int(value)
        except ValueError:
            raise LaunchError(f"{name}={value!r} is not an integer") from None

    world = read("WORLD_SIZE")
    rank = read("RANK")
    local_world = read("LOCAL_WORLD_SIZE", world)
    local_rank = read("LOCAL_RANK", rank % local_world)
    if not (0 <= rank < world) or not (0 <= local_rank < local_world) or world % local_world:
        raise LaunchError(f"inconsistent job layout: RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local_rank} "
                          f"LOCAL_WORLD_SIZE={local_world}")
    return RankEnv(rank, world, local_rank, local_world)


def check_gpus(nproc: int | None, device: str | None, device_count: Any = None) -> None:
    """``--nproc N`` on CUDA runs one rank per GPU: refuse when this machine has fewer than N GPUs
    (``--device auto`` means CUDA where a GPU is visible). ``device_count``: for tests."""
    if nproc is None or device is None:
        return
    spec = str(device)
    if spec == "auto" or spec.startswith("cuda"):
        import torch

        if device_count is None:
            device_count = torch.cuda.device_count if torch.cuda.is_available() else (lambda: 0)
        count = device_count()
        if spec == "auto" and count == 0:
            return  # auto -> cpu: gloo ranks on the CPU
        if nproc > count:
            raise LaunchError(f"--nproc {nproc} on --device {spec} needs {nproc} GPUs (one rank per GPU); this machine "
                              f"has {count}. Use --nproc {count} or fewer, or --device cpu (gloo ranks on the CPU)"
                              if count else
                              f"--nproc {nproc} on --device {spec} needs {nproc} GPUs; this machine has none "
                              "visible. Use --device cpu (gloo ranks on the CPU)")


def check_nproc(nproc: int | None) -> None:
    """``--nproc`` against a surrounding torchrun job: they must agree."""
    if nproc is not None and in_job():
        world = rank_env().world_size
        if world != nproc:
            raise LaunchError(f"--nproc {nproc} but this process runs in a job of WORLD_SIZE={world} "
                              "(torchrun); drop --nproc or make them equal")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_heartbeat() -> None:
    """In a rank started by :func:`launch`: touch this rank's heartbeat file every few seconds,
    and end this rank when the launcher is gone (killed: no orphan ranks keep computing)."""
    directory = os.environ.get(_HEARTBEAT_ENV)
    if not directory:
        return
    path = Path(directory) / f"rank{os.environ.get('RANK', '0')}"
    parent = int(os.environ.get(_LAUNCHER_ENV) or os.getppid())

    def beat() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            try:
                path.touch()
            except OSError:
                os._exit(1)  # the launcher removed its directory: the job is over
            time.sleep(HEARTBEAT_EVERY_S)

    threading.Thread(target=beat, name="superkernel-heartbeat", daemon=True).start()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def launch(argv: list[str], nproc: int, *, stale_s: float = HEARTBEAT_STALE_S, env: dict | None = None,
           command: list[str] | None = None) -> int:
    """Run ``python -m superkernel *argv`` (or ``command + argv``) as ``nproc`` ranks.

    Returns the ranks' common exit status, or raises :class:`LaunchError`.

    Rank 0 keeps the terminal's stdout (the result table); every rank's stderr goes to a
    log that is read only when the job fails, so a failure is one line: rank 0's own
    error line when rank 0 ended with an error of its own, else the watchdog's.
    Returns rank 0's exit status when every rank exited normally with the same status.
    """
    if nproc < 1:
        raise LaunchError(f"--nproc must be >= 1, got {nproc}")
    base = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="superkernel-job-") as tmp:
        beats = Path(tmp)
        port = free_port()
        procs: list[subprocess.Popen] = []
        logs = []
        try:
            for rank in range(nproc):
                child = {**base, "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
                         "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": str(port), _HEARTBEAT_ENV: str(beats),
                         _LAUNCHER_ENV: str(os.getpid())}
                log = open(beats / f"rank{rank}.log", "w+b")
                logs.append(log)
                program = list(command) if command else [sys.executable, "-m", "superkernel"]
                procs.append(subprocess.Popen([*program, *argv], env=child,
                                              stdout=None if rank == 0 else subprocess.DEVNULL,
                                              stderr=log, start_new_session=True))
            return _watch(procs, beats, stale_s, logs)
        finally:
            _stop(procs)
            for log in logs:
                log.close()


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, CPU ticks used by the process and its reaped children) from /proc; None elsewhere."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[0], sum(int(v) for v in fields[11:15])


class _Progress:
    """Whether a rank is making progress: heartbeat fresh, or CPU time still moving (a rank
    starved by a loaded machine can miss heartbeats but still computes); stopped (SIGSTOP) is not."""

    def __init__(self) -> None:
        self.cpu: dict[int, tuple[int, float]] = {}
        self.stopped_since: dict[int, float] = {}

    def hung_for(self, rank: int, pid: int, beat_age: float, now: float) -> float:
        """Seconds this rank has shown no sign of progress (0 while it shows one)."""
        state = _proc_state(pid)
        if state is not None and state[0] in "Tt":
            return now - self.stopped_since.setdefault(rank, now)
        self.stopped_since.pop(rank, None)
        if state is not None:
            ticks, since = self.cpu.get(rank, (None, now))
            if ticks != state[1]:
                self.cpu[rank] = (state[1], now)
                since = now
            return min(beat_age, now - since)
        return beat_age


def _watch(procs: list[subprocess.Popen], beats: Path, stale_s: float, logs) -> int:
    started = time.monotonic()
    progress = _Progress()
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) and len(set(codes)) == 1 and codes[0] >= 0:
            if codes[0] != 0:  # every rank ended the same way (a usage error, no result): rank 0 says why
                sys.stderr.write(_last_error(logs[0]) + "\n")
            return codes[0]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            killed = [(r, c) for r, c in failed if c < 0]
            rank, code = killed[0] if killed else first_to_stop(failed, logs)
            raise LaunchError(f"rank {rank} of {len(procs)} {_describe(code)}; the job was stopped"
                              + _cause(logs[rank]))
        now = time.time()
        for rank, code in enumerate(codes):
            if code is not None:
                continue
            beat = beats / f"rank{rank}"
            last = beat.stat().st_mtime if beat.exists() else None
            if last is None and time.monotonic() - started > STARTUP_S:
                raise LaunchError(f"rank {rank} of {len(procs)} never started (no heartbeat in {STARTUP_S:.0f} s); "
                                  "the job was stopped")
            if last is None:
                continue
            hung = progress.hung_for(rank, procs[rank].pid, now - last, time.monotonic())
            if hung > stale_s:
                raise LaunchError(f"rank {rank} of {len(procs)} is hung (no heartbeat and no CPU time for "
                                  f"{hung:.0f} s); the job was stopped")
        time.sleep(0.2)


def first_to_stop(failed: list[tuple[int, int]], logs) -> tuple[int, int]:
    """Of ranks seen failed at one look, the one whose log was written last the earliest: the others usually
    failed because of it (a collective's peer closed its connection), after it had said why it stopped."""

    def last_write(item: tuple[int, int]) -> int:
        try:
            return os.fstat(logs[item[0]].fileno()).st_mtime_ns
        except (OSError, ValueError, AttributeError):
            return 0
    return min(failed, key=lambda item: (last_write(item), item[0]))


def _last_error(log) -> str:
    """The rank's last ``error`` line (else its last line), whitespace collapsed."""
    try:
        log.flush()
        log.seek(0)
        lines = [ln for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
    except (OSError, ValueError):
        return ""
    error = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "")
    return " ".join(error.split())[:400]


def _cause(log) -> str:
    error = _last_error(log).removeprefix("superkernel: error: ")
    return f" (its last error: {error})" if error else ""


def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate every rank still running (its whole process group), then kill after a grace period."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        _signal_group(p, signal.SIGCONT)  # a stopped (SIGSTOP) rank cannot act on SIGTERM
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
