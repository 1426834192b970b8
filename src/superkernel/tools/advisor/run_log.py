"""The run's log file: compiler chatter goes there, the user's terminal keeps the progress bars.

TorchInductor's max-autotune writes its autotune tables straight to ``sys.stderr`` (inside a superkernel
compile they go to the ``superkernel.inductor`` logger at debug level instead:
:mod:`superkernel.runtime.inductor.output`), and torch, transformers and Python warnings write through
logging handlers and ``warnings.showwarning``. While :meth:`RunLog.capture` is active all of these land in
``<output>/superkernel.log``; the progress display writes to the terminal stream it was
created with (see :class:`~superkernel.tools.advisor.progress.Reporter`), so it is unaffected.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import IO, Iterator

from superkernel.runtime.inductor.output import LOGGER as INDUCTOR_LOGGER
from superkernel.util import _umask, check_not_input, make_dirs, temp_sibling

LOG_NAME = "superkernel.log"


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _stderr_handlers() -> list[logging.StreamHandler]:
    """Logging handlers that write to the process's stderr (not files)."""
    loggers = [logging.getLogger()] + [v for v in logging.Logger.manager.loggerDict.values()
                                       if isinstance(v, logging.Logger)]
    out = []
    for logger in loggers:
        for h in logger.handlers:
            if (isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
                    and (h.stream in (sys.stderr, sys.__stderr__) or _fileno(h.stream) == 2)):
                out.append(h)
    return out


@contextlib.contextmanager
def redirect_process_stderr(stream: IO[str]) -> Iterator[None]:
    """Send ``sys.stderr``, stderr logging handlers and warnings to ``stream`` for the duration."""
    handlers = _stderr_handlers()
    before = [h.stream for h in handlers]
    with contextlib.redirect_stderr(stream):
        for h in handlers:
            h.setStream(stream)
        try:
            yield
        finally:
            for h, s in zip(handlers, before):
                h.setStream(s)


@contextlib.contextmanager
def native_stderr_to(stream: IO[str] | None) -> Iterator[None]:
    """File descriptor 2 (C++ messages, e.g. the profiler's start/stop lines) to ``stream`` or /dev/null."""
    try:
        sys.__stderr__.flush()
        saved = os.dup(2)
    except (OSError, AttributeError, ValueError):
        yield
        return
    target = stream.fileno() if stream is not None and hasattr(stream, "fileno") else None
    devnull = None
    if target is None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        target = devnull
    try:
        if stream is not None:
            stream.flush()
        os.dup2(target, 2)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.dup2(saved, 2)
        os.close(saved)
        if devnull is not None:
            os.close(devnull)


@contextlib.contextmanager
def debug_logger_to(name: str, stream: IO[str]) -> Iterator[None]:
    """The logger ``name`` writes its records, debug level up, to ``stream`` only (not to its parents) meanwhile."""
    logger = logging.getLogger(name)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


class RunLog:
    """``<output>/superkernel.log``, written to a temporary sibling and renamed in place on close."""

    def __init__(self, path: Path | str, inputs=()) -> None:
        self.path = Path(path)
        check_not_input(self.path, inputs)
        self._made_dir = not self.path.parent.exists()
        make_dirs(self.path.parent, "--output", parent_of_file=True)
        self._tmp = temp_sibling(self.path)
        self.stream = open(self._tmp, "w", encoding="utf-8", buffering=1)

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        with redirect_process_stderr(self.stream), debug_logger_to(INDUCTOR_LOGGER, self.stream):
            yield

    def write(self, text: str) -> None:
        self.stream.write(text if text.endswith("\n") else text + "\n")

    def close(self) -> Path:
        """Finish the file (also after a failed run: the log is most useful then)."""
        if not self.stream.closed:
            self.stream.close()
            os.chmod(self._tmp, 0o666 & ~_umask())
            os.replace(self._tmp, self.path)
        return self.path

    def discard(self) -> None:
        """Leave nothing behind: for a run refused before any work (a model that cannot load), the output folder
        is as it was (the log's temporary file removed, the folder too when this run made it and it is empty)."""
        if not self.stream.closed:
            self.stream.close()
        with contextlib.suppress(OSError):
            os.unlink(self._tmp)
        if self._made_dir:
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()
