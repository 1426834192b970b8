"""Small utilities shared by the library, the tools and the ONNX product.

- Atomic file output: a file is written to a temporary sibling (same directory, so the
  final ``os.replace`` is atomic) and moved into place only when complete; a crash leaves
  the old file or the new one, never half a file. An output that would replace one of
  the run's input files is refused.
- ``exception_summary``: the one-line form of an exception used by warnings, explain
  tables and manifests.
- ``positive_int``: the argparse type every command line uses for counts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator


class OutputError(ValueError):
    """An output path that would overwrite an input, or cannot be written."""


def check_not_input(path: Path | str, inputs: Iterable[Path | str | None] = ()) -> None:
    target = Path(path).resolve()
    for item in inputs:
        if item is not None and Path(item).resolve() == target:
            raise OutputError(f"refusing to write {path}: it is an input of this run ({item}); choose another output path")


def temp_sibling(path: Path | str) -> Path:
    """A new, empty, uniquely named file next to ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def fsync_dir(directory: Path | str) -> None:
    """Make a rename in ``directory`` durable (best effort; not every filesystem allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


@contextlib.contextmanager
def atomic_target(path: Path | str, inputs: Iterable[Path | str | None] = (), *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s content to; on success it replaces ``path``.

    ``durable`` fsyncs the file and its directory (packages, records); plain reports skip it.
    """
    path = Path(path)
    check_not_input(path, inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give outputs the usual permissions
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: Path | str, data: str | bytes, inputs: Iterable[Path | str | None] = (), *,
                 durable: bool = False) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically; returns the path."""
    with atomic_target(path, inputs, durable=durable) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
    return Path(path)



def exception_summary(exc: BaseException, limit: int = 300, *, first_line: bool = True) -> str:
    """``"TypeName: message"`` on one line, at most ``limit`` characters: the message's
    first line, or (``first_line=False``) the whole message with its whitespace collapsed."""
    text = str(exc).strip()
    text = (text.splitlines()[0] if text else "") if first_line else " ".join(text.split())
    return f"{type(exc).__name__}: {text}"[:limit]



def positive_int(name: str) -> Callable[[str], int]:
    """An argparse ``type=`` that accepts integers >= 1 and names the flag in its error."""
    return _int_at_least(name, 1)


def non_negative_int(name: str) -> Callable[[str], int]:
    """An argparse ``type=`` that accepts integers >= 0 and names the flag in its error."""
    return _int_at_least(name, 0)


def _int_at_least(name: str, low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{name} must be >= {low}, got {value}")
        return value

    return parse


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(path: Path | str, flag: str = "--output") -> None:
    """Fail before any work when ``path`` cannot become a directory we can write files into."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{flag} {str(path)!r} is an existing file; give a directory (it is created if missing)")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise OutputError(f"{flag} {str(path)!r} cannot be created: {str(base)!r} is a file")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {str(path)!r} is not writable (no write permission in {str(base)!r})")


def check_output_file(path: Path | str, flag: str, inputs: Iterable[Path | str | None] = ()) -> None:
    """Fail before any work when ``path`` cannot be written as a file (``flag`` names the option)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{flag} {str(path)!r} is a directory; give a file path")
    try:
        check_not_input(path, inputs)
    except OutputError as exc:
        raise OutputError(f"{flag}: {exc}") from None
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise OutputError(f"{flag} {str(path)!r} cannot be written: {str(base)!r} is a file")
    if not os.access(base, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OutputError(f"{flag} {str(path)!r} is not writable")
