"""Progress display for compiles and decode runs (rich), silent when quiet."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class Reporter:
    def __init__(self, quiet: bool = False, console: Console | None = None) -> None:
        import sys

        self.quiet = quiet
        # Bound to the terminal stream of now: while a run's log captures sys.stderr (compiler
        # output, see run_log), the progress display keeps writing to the terminal.
        self.console = console or Console(file=sys.stderr)
        #: (task description, wall seconds) of every finished task, in order: where a run's time went
        self.phases: list[tuple[str, float]] = []

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text, highlight=False)

    @contextlib.contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[Callable[..., None]]:
        """Yield ``update(done=None, description=None)`` for one bar; a spinner when total is None.
        Its wall time is added to :attr:`phases` (quiet or not) under ``description``."""
        with self.phase(description):
            if self.quiet:
                yield lambda *a, **k: None
                return
            with self._bar(description, total) as update:
                yield update

    @contextlib.contextmanager
    def phase(self, description: str) -> Iterator[None]:
        """Time a stretch of work into :attr:`phases` without a progress line (e.g. a build that is
        sometimes instant: a bar would only flash)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases.append((description, time.perf_counter() - start))

    @contextlib.contextmanager
    def _bar(self, description: str, total: int | None) -> Iterator[Callable[..., None]]:
        progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=self.console, transient=False, redirect_stderr=False)
        with progress:
            task_id = progress.add_task(description, total=total)

            def update(done: int | None = None, description: str | None = None) -> None:
                kwargs = {}
                if done is not None:
                    kwargs["completed"] = done
                if description is not None:
                    kwargs["description"] = description
                progress.update(task_id, **kwargs)

            try:
                yield update
            except BaseException:
                progress.live.transient = True  # a failed step leaves no half bar above the error line
                raise
            if total is None:
                progress.update(task_id, total=1, completed=1)

    def decode_callback(self, update: Callable[..., None], compiling: str, running: str) -> Callable[[int, int], None]:
        """``on_step`` for run_decode: the first step (compile) shows ``compiling``, later ones ``running``."""
        def on_step(done: int, total: int) -> None:
            update(done=done, description=running if done >= 1 else compiling)
        return on_step
