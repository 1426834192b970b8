"""Small utilities shared by the library, the tools and the ONNX product.

- Atomic file output: a file is written to a temporary sibling (same directory, so the
  final ``os.replace`` is atomic) and moved into place only when complete; a crash leaves
  the old file or the new one, never half a file. An output that would replace one of
  the run's input files is refused.
- ``exception_summary``: the one-line form of an exception used by warnings, explain
  tables and manifests.
- ``positive_int``: the argparse type every command line uses for counts.
- The three guards of docs/security.md: :func:`check_write_path` (every path the tool
  writes), :func:`read_limited` (every file it reads: a regular file, size checked before
  reading) and :func:`safe_text` (every string from a file that reaches a terminal or a
  report). :func:`json_depth` bounds nesting before a recursive parser sees the text;
  :func:`check_link_path` / :func:`make_dirs` apply the link rule to every output folder;
  :func:`remove_tree` deletes without following symlinks.
- :func:`child_env`: the environment of a ``python -m superkernel...`` child process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import tempfile
import unicodedata
from pathlib import Path
from typing import Callable, Iterable, Iterator


class OutputError(ValueError):
    """An output path that would overwrite an input, or cannot be written."""


class InputFileError(ValueError):
    """A file to read that is not a regular file, or is larger than allowed (the message says which)."""


def check_not_input(path: Path | str, inputs: Iterable[Path | str | None] = ()) -> None:
    target = Path(path).resolve()
    for item in inputs:
        if item is not None and (Path(item).resolve() == target or _same_file(item, target)):
            raise OutputError(f"refusing to write {safe_text(path)}: it is an input of this run ({safe_text(item)}); "
                              "choose another output path")


def _same_file(a: Path | str, b: Path | str) -> bool:
    try:
        return os.path.samefile(a, b)  # a hard link to an input is the input
    except OSError:
        return False


def check_write_path(path: Path | str, inputs: Iterable[Path | str | None] = (), flag: str = "output") -> None:
    """The one check of every path the tool writes (docs/security.md).

    Refused: one of the run's ``inputs`` (same file, through any link), a symlink (its target
    would not be what the user named, and a link in a shared directory can point anywhere),
    a folder on the way that is another user's link (:func:`check_link_path`), and anything
    that exists and is not a regular file (a FIFO, a device, a directory).
    """
    p = Path(path)
    check_link_path(p.parent, flag, what="folder of a file")
    st = _lstat_or_none(p, f"{flag} {safe_text(path)}")
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{flag} {safe_text(path)} is a symbolic link; give the real path (links are never written "
                          "through)")
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise OutputError(f"{flag} {safe_text(path)} is {kind}; give a file path")
    check_not_input(p, inputs)


_MAX_LINKS = 40


def _lstat_or_none(path: Path, label: str) -> os.stat_result | None:
    """``os.lstat(path)``, None when nothing is there; any other failure is one OutputError line."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OutputError(f"{label}: cannot be checked ({exc.strerror or exc})") from None


def _trusted_link_owner(uid: int) -> bool:
    me = os.geteuid() if hasattr(os, "geteuid") else None
    return me is None or uid in (me, 0)


def check_link_path(path: Path | str, flag: str = "output", *, what: str = "") -> Path:
    """Refuse writing at (or beneath) ``path`` through links nobody vouches for; return its real path.

    The rule of docs/security.md: ``path`` itself must not be a symbolic link (what it points at is
    not what the user named), and every link on the way — the components of ``path`` and of each
    link's target, walked one by one — must belong to this user or root: a link another user
    planted in a shared directory (``/tmp/x -> ~victim/.ssh``) is refused, as Linux's
    ``protected_symlinks`` would for sticky directories. Write beneath the returned real path.
    """
    p = Path(os.path.abspath(path))
    label = f"{flag} {safe_text(path)}" if not what else f"{flag}: the {what} {safe_text(path)}"
    st = _lstat_or_none(p, label)
    if st is not None and stat.S_ISLNK(st.st_mode) and not what:
        raise OutputError(f"{label} is a symbolic link; give the real path (links are never written through)")
    pending = list(p.parts[1:])
    real = Path(p.anchor)
    hops = 0
    while pending:
        part = pending.pop(0)
        nxt = real / part if part not in (".", "..") else (real if part == "." else real.parent)
        try:
            st = os.lstat(nxt)
        except OSError:
            return Path(os.path.join(nxt, *pending))  # the rest does not exist yet: it is created, not followed
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_LINKS or not _trusted_link_owner(st.st_uid):
                why = "too many links" if hops > _MAX_LINKS else f"{safe_text(nxt)} is a link of another user (uid {st.st_uid})"
                raise OutputError(f"{label}: {why}; links in a path the tool writes must be this user's or root's")
            target = os.readlink(nxt)
            if os.path.isabs(target):
                real = Path(Path(target).anchor)
                pending = list(Path(target).parts[1:]) + pending
            else:
                pending = list(Path(target).parts) + pending
            continue
        real = nxt
    return real


def make_dirs(path: Path | str, flag: str = "output", *, parent_of_file: bool = False) -> Path:
    """``mkdir -p`` for a folder the tool writes into, checked by :func:`check_link_path`: refused
    (:class:`OutputError`) when a link on the way is another user's, or when the folder is itself a
    link — unless it is the folder of a file the user named (``parent_of_file``: then only the file
    itself may not be a link). Returns the folder's real path."""
    real = check_link_path(path, flag, what="folder of a file" if parent_of_file else "")
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{flag} {safe_text(path)} exists and is not a directory") from None
    st = os.stat(path) if parent_of_file else os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):  # a link swapped in meanwhile
        raise OutputError(f"{flag} {safe_text(path)} is not a directory (a link or a file appeared there)")
    return real


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
    check_write_path(path, inputs)
    make_dirs(path.parent, parent_of_file=True)
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



def write_results(out_dir: Path | str, stem: str, result: dict, markdown: str, *, indent: int = 1) -> None:
    """A benchmark's results: ``stem.json`` and ``stem.md`` in ``out_dir`` (made if missing), each written
    atomically."""
    import json

    os.makedirs(out_dir, exist_ok=True)
    atomic_write(os.path.join(out_dir, f"{stem}.json"), json.dumps(result, indent=indent) + "\n")
    atomic_write(os.path.join(out_dir, f"{stem}.md"), markdown)


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
    check_link_path(path, flag)
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
        check_write_path(path, inputs, flag)
    except OutputError as exc:
        raise OutputError(str(exc) if str(exc).startswith(flag) else f"{flag}: {exc}") from None
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise OutputError(f"{flag} {str(path)!r} cannot be written: {str(base)!r} is a file")
    if not os.access(base, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OutputError(f"{flag} {str(path)!r} is not writable")


# --- reading files from others ---------------------------------------------------------------

def check_regular_file(path: Path | str, limit: int, what: str) -> os.stat_result:
    """Refuse ``path`` unless it is a regular file (links followed) of at most ``limit`` bytes."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputFileError(f"{what} {safe_text(path)} does not exist") from None
    except OSError as exc:
        raise InputFileError(f"{what} {safe_text(path)} cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(f"{what} {safe_text(path)} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{what} {safe_text(path)} is not a regular file (a FIFO, socket or device is never read)")
    if st.st_size > limit:
        raise InputFileError(f"{what} {safe_text(path)} is {st.st_size} bytes; at most {limit} are read")
    return st


def read_limited(path: Path | str, limit: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (:class:`InputFileError` otherwise).

    Checked before reading and again on the open file (opened non-blocking, so a FIFO
    swapped in between cannot hang the read); never more than ``limit`` bytes are read.
    """
    check_regular_file(path, limit, what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputFileError(f"{what} {safe_text(path)} cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(f"{what} {safe_text(path)} is not a regular file")
        data = fh.read(min(st.st_size, limit) + 1)  # the size it has, not the limit, is allocated
        while len(data) <= limit and len(data) > st.st_size:  # it grew since: in chunks, up to the limit
            chunk = fh.read(min(1 << 20, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    if len(data) > limit:
        raise InputFileError(f"{what} {safe_text(path)} is larger than {limit} bytes")
    return data


def json_depth(text: str | bytes, limit: int) -> int:
    """The nesting depth of JSON ``text`` (strings skipped); ValueError beyond ``limit``, before any parser recurses."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                raise ValueError(f"nested deeper than {limit} levels")
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def safe_text(value: object, limit: int = 200) -> str:
    """``value`` as one printable line: control and format characters (newlines, ANSI escapes,
    bidirectional overrides) escaped as ``\\xNN``/``\\uNNNN``, cut to ``limit`` characters."""
    out = []
    for ch in str(value):
        if ch == "\\" or (unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Co", "Cs")):
            code = ord(ch)
            out.append("\\\\" if ch == "\\" else (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"))
        else:
            out.append(ch)
        if len(out) > limit:
            break
    text = "".join(out)
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


# --- what libraries write, what we delete ---------------------------------------------------------

def remove_tree(path: Path | str) -> bool:
    """Delete the directory ``path`` and what is in it without following any symlink (a link inside is
    removed as a link; ``path`` itself a link: refused, False). True when something was removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return False
    shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: never descends through a link
    return True


def short_repr(value: object, limit: int = 80) -> str:
    """A bounded, sanitized ``repr`` for error messages: nested and shared values (a YAML alias bomb) are
    cut while the text is built, never rendered in full first."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxtuple, r.maxset = 3, 6, 6, 6, 6
    r.maxstring, r.maxother, r.maxlong = limit, limit, 40
    return safe_text(r.repr(value), limit)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows: for reports and cache keys."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_id() -> str:
    """The CPU's name and logical core count: the part of a calibration key that says where it was measured."""
    return f"{cpu_name()} x{os.cpu_count()}"


def child_env() -> dict[str, str]:
    """This process's environment with the directory holding this ``superkernel`` package first on
    ``PYTHONPATH``: a child started as ``python -m superkernel....`` runs the same code as its parent,
    also from a source checkout that is not installed."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else root
    return env
