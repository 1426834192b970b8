"""What every hostile-environment case checks (tests/fuzz/test_fuzz_hostile_*.py).

A case runs in its own temporary directory, with a separate *outside* directory holding
files an attacker would like changed (the targets of planted links), and with the current
directory set to a directory of its own. Afterwards nothing outside the case directory
(the outside files) and nothing in the current directory may have changed, and no marker
file may exist. Cases that read endless or explosive input run in a child process under
an address-space limit (RLIMIT_AS) and a timeout, so unbounded memory or a hang is a
failure of that case, not of the machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import stat
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import superkernel

SRC = str(Path(superkernel.__file__).resolve().parents[1])  # the superkernel this test process imports
ROOT = str(Path(__file__).resolve().parents[2])


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry below ``directory`` (links not followed): kind, mode, size and content hash or link target."""
    out: dict[str, tuple] = {}
    if not os.path.lexists(directory):
        return out
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(directory))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest())
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode))
    return out


@dataclass
class Case:
    """A case's directories: ``work`` (its own), ``outside`` (must not change), ``cwd`` (must not change)."""

    work: Path
    outside: Path
    cwd: Path
    marker: Path

    def __post_init__(self) -> None:
        for d in (self.work, self.outside, self.cwd):
            d.mkdir(parents=True, exist_ok=True)
        (self.outside / "victim.txt").write_text("precious\n")
        (self.outside / "victim_dir").mkdir(exist_ok=True)
        (self.outside / "victim_dir" / "keep.txt").write_text("keep\n")
        self._before = {"outside": snapshot(self.outside), "cwd": snapshot(self.cwd)}

    @classmethod
    def entered(cls, tmp_path: Path, monkeypatch, cache_dir: bool = True) -> "Case":
        """A case under ``tmp_path`` whose directory is the current one; with ``cache_dir`` its own
        ``SUPERKERNEL_CACHE_DIR`` (else none set: the default location under its ``XDG_CACHE_HOME``)."""
        c = cls(work=tmp_path / "work", outside=tmp_path / "outside", cwd=tmp_path / "cwd", marker=tmp_path / "PWNED")
        monkeypatch.chdir(c.cwd)
        if cache_dir:
            monkeypatch.setenv("SUPERKERNEL_CACHE_DIR", str(tmp_path / "skcache"))
        else:
            monkeypatch.delenv("SUPERKERNEL_CACHE_DIR", raising=False)
            monkeypatch.setenv("XDG_CACHE_HOME", str(c.work / "xdg"))
        return c

    def freeze_cwd(self) -> None:
        """Take the current directory's snapshot again (after the case planted its links there)."""
        self._before["cwd"] = snapshot(self.cwd)

    def check(self, what: str = "") -> None:
        assert snapshot(self.outside) == self._before["outside"], f"{what}: a file outside the case changed"
        assert snapshot(self.cwd) == self._before["cwd"], f"{what}: the current directory changed"
        assert not self.marker.exists(), f"{what}: planted code ran (marker file exists)"


def run_bounded(code: str, *, mem_mb: int = 3072, timeout: float = 120, env: dict[str, str] | None = None,
                cwd: Path | None = None) -> dict:
    """Run ``code`` in a child Python (this worktree's ``superkernel``) under RLIMIT_AS ``mem_mb`` and
    ``timeout``; the child prints one JSON object last. Returns it with ``rc``, ``hung`` and ``stderr``
    (``hung``: killed at the timeout; a MemoryError or kill by the limit shows as a failed ``rc``)."""
    limit = mem_mb << 20

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, ROOT]), **(env or {})}
    prelude = "import json, resource, sys\n"
    epilogue = "\nresult.setdefault('peak_mb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n" \
               "print(json.dumps(result, default=str))\n"
    try:
        proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code) + epilogue], capture_output=True,
                              text=True, timeout=timeout, preexec_fn=limits, env=child_env,
                              cwd=str(cwd) if cwd else None)
    except subprocess.TimeoutExpired as exc:
        return {"rc": None, "hung": True, "stderr": (exc.stderr or b"")[-2000:] if isinstance(exc.stderr, bytes)
                else (exc.stderr or "")[-2000:]}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    result.update(rc=proc.returncode, hung=False, stderr=proc.stderr[-4000:])
    return result


class FifoWatchdog:
    """Unblock whoever is stuck reading the FIFO ``path`` after ``seconds`` (opens it for writing and
    closes it: the reader sees end of file), so an in-process case that would hang fails instead."""

    def __init__(self, path: Path, seconds: float = 20) -> None:
        import threading

        self.path, self.fired = path, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(seconds,), daemon=True)

    def _run(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue  # no reader (yet)
            self.fired = True
            os.close(fd)

    def __enter__(self) -> "FifoWatchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
