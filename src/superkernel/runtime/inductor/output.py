"""What TorchInductor prints while superkernel compiles a segment goes to a logger, at debug level.

With max-autotune (and the GEMM templates of CPU max-autotune with frozen weights) Inductor writes its
``AUTOTUNE`` tables, ``Autotune Choices Stats`` and the ``... AUTOTUNE benchmarking takes ...`` lines
straight to ``sys.stderr``, so a library user's ``model.generate()`` would print them into the terminal.
While a superkernel compile runs Inductor (:func:`output_logged`), ``sys.stderr`` is a stand-in that sends
the *compiling thread's* lines to the :data:`LOGGER` logger at debug level; other threads write through to
the stream it replaced. Warnings printed by that thread while Inductor compiles go the same way; warnings
superkernel issues (a segment that falls back, ...) are issued outside it and stay visible.

``superkernel optimize`` keeps these lines in its ``superkernel.log``
(:meth:`superkernel.tools.advisor.run_log.RunLog.capture`); a user who wants them calls
``logging.getLogger("superkernel.inductor").setLevel(logging.DEBUG)`` with a handler.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
from typing import Iterator, TextIO

#: the logger that gets Inductor's console output of superkernel compiles (level DEBUG)
LOGGER = "superkernel.inductor"
log = logging.getLogger(LOGGER)


class _DebugLines(io.TextIOBase):
    """``sys.stderr`` while one thread compiles: its lines to :data:`log`, other threads' text to ``previous``."""

    def __init__(self, previous: TextIO, thread: int) -> None:
        super().__init__()
        self.previous, self.thread = previous, thread
        self.active = True   # off: everything writes through (the stand-in outlived its context)
        self._pending = ""

    def _mine(self) -> bool:
        return self.active and threading.get_ident() == self.thread

    def write(self, text: str) -> int:
        if not self._mine():
            return self.previous.write(text)
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            if line.strip():
                log.debug("%s", line)
        return len(text)

    def flush(self) -> None:
        if not self._mine():
            self.previous.flush()

    def finish(self) -> None:
        if self._pending.strip():
            log.debug("%s", self._pending)
        self._pending = ""
        self.active = False

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False if self._mine() else bool(getattr(self.previous, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.previous.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.previous, "encoding", None) or "utf-8"


@contextlib.contextmanager
def output_logged() -> Iterator[None]:
    """Inside: this thread's writes to ``sys.stderr`` are logged at debug level (see the module doc)."""
    current = sys.stderr
    if isinstance(current, _DebugLines) and current._mine():
        yield  # already inside (a frozen compile runs the partition compile)
        return
    stand_in = _DebugLines(current, threading.get_ident())
    sys.stderr = stand_in
    try:
        yield
    finally:
        stand_in.finish()
        if sys.stderr is stand_in:
            sys.stderr = current
        # else someone replaced sys.stderr meanwhile (another thread's compile): the inactive stand-in writes through
