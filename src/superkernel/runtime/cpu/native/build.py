"""Building and caching the generated modules: compiler, flags, private per-user cache, precompiled torch headers."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from superkernel.runtime.cpu.native.literals import NativeBuildError
from superkernel.util import atomic_target, atomic_write


@dataclass(frozen=True)
class NativeSource:
    """Generated C++ for the native segments of one graph (made by :mod:`.codegen`), and its cache key."""

    source: str
    key: str
    entries: tuple[str, ...]  # entry point names, one per segment, in the order given
    flags: tuple[str, ...] = ()  # compiler flags of this module alone (part of its key: see native_key)
    registers_ops: bool = False  # a library of torch operators: a package loads it before any partition

    @property
    def module_name(self) -> str:
        return f"sk_native_{self.key}"


#: Bumped whenever the code generator changes what it emits for the same graph.
GENERATOR_VERSION = "7"

_STD = "-std=c++20"
_OPT = "-O1"



# --- build and cache -----------------------------------------------------------------------

def _torch_include() -> str:
    return os.path.join(os.path.dirname(torch.__file__), "include")


def _torch_lib() -> str:
    return os.path.join(os.path.dirname(torch.__file__), "lib")


def compiler() -> str:
    """The C++ compiler: ``$CXX`` or ``g++``/``c++`` found on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return cxx
    for name in ("g++", "c++"):
        path = shutil.which(name)
        if path:
            return path
    raise NativeBuildError("no C++ compiler found (set CXX or install g++)")


def compiler_available() -> bool:
    try:
        _compiler_id(compiler())
    except NativeBuildError:
        return False
    return True


@functools.lru_cache(maxsize=4)
def _compiler_id(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else cxx
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"cannot run the C++ compiler {cxx!r}: {exc}") from None


def _compile_flags() -> list[str]:
    return [_OPT, "-fPIC", _STD, "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-I{_torch_include()}", f"-I{sysconfig.get_paths()['include']}"]


def _link_flags() -> list[str]:
    lib = _torch_lib()
    return [f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}"]


def build_fingerprint() -> str:
    """What besides the source decides the binary: the ABI a module needs (:func:`abi_fingerprint`; its
    C++ ABI flag is in the compile flags), the compiler and the flags."""
    abi = abi_fingerprint()
    parts = [abi["generator"], abi["torch"], abi["torch_git"], abi["ext_suffix"], abi["python"],
             _compiler_id(compiler()), " ".join(_compile_flags()), " ".join(_link_flags())]
    return "\n".join(parts)


def native_key(source: str, flags: tuple[str, ...] = ()) -> str:
    """Content hash of a native module: its source, its own flags and :func:`build_fingerprint`."""
    h = hashlib.sha256()
    h.update(source.encode())
    if flags:
        h.update(b"\0" + " ".join(flags).encode())
    h.update(b"\0")
    try:
        h.update(build_fingerprint().encode())
    except NativeBuildError:
        h.update(b"no-compiler")
    return h.hexdigest()[:32]


def abi_fingerprint() -> dict[str, str]:
    """What a built module needs of the process that loads it (no compiler needed to tell): the generator,
    torch (version, git revision, C++ ABI flag), the Python extension ABI. A static package records it
    beside each module it carries; a module is loaded only where all of it is equal."""
    return {"generator": GENERATOR_VERSION, "torch": torch.__version__,
            "torch_git": str(getattr(torch.version, "git_version", "")),
            "cxx11_abi": str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
            "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX") or "", "python": sys.version.split()[0]}


def source_key(source: str) -> str:
    """The name a static package gives a module: a hash of its source alone (the same in a process without a
    compiler, where :func:`native_key` differs), checked against :func:`abi_fingerprint` when loaded."""
    return hashlib.sha256(source.encode()).hexdigest()[:32]


def cache_dir() -> Path:
    """The private per-user cache of native modules (``native_cpu/`` of :func:`superkernel.cache_dir.private_cache_dir`:
    created 0700; refused if another user owns it or others can write it)."""
    from superkernel.cache_dir import CacheDirError, private_cache_dir

    try:
        return private_cache_dir("native_cpu")
    except CacheDirError as exc:
        raise NativeBuildError(str(exc)) from None


_PCH_HEADER = """// superkernel native CPU modules: the torch headers they need (precompiled once).
#include <Python.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <limits>
"""

_lock = threading.Lock()


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"{what}: cannot run {cmd[0]}: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip()[-1500:]
        raise NativeBuildError(f"{what} failed (exit {proc.returncode}): {tail}")


def _pch_dir(root: Path) -> Path:
    """Directory with ``sk_native_pch.h`` and, when it could be built, its precompiled form."""
    cxx = compiler()
    key = hashlib.sha256((_PCH_HEADER + build_fingerprint()).encode()).hexdigest()[:24]
    directory = root / f"pch-{key}"
    header = directory / "sk_native_pch.h"
    gch = directory / "sk_native_pch.h.gch"
    failed = directory / "failed"
    from superkernel.cache_dir import check_private, owned_file

    directory.mkdir(exist_ok=True, mode=0o700)
    try:
        check_private(directory)
    except OSError as exc:
        raise NativeBuildError(str(exc)) from None

    def ready() -> tuple[bool, bool]:
        """(the header is ours, the precompiled header is ours or known to fail with none beside the header)"""
        header_ok = owned_file(header) is not None and header.read_bytes() == _PCH_HEADER.encode()
        if trusted_library_bytes(gch) is not None:
            return header_ok, True
        return header_ok, owned_file(failed) is not None and not os.path.lexists(gch)

    if all(ready()):
        return directory
    with _exclusive(directory / ".build.lock"):
        if os.path.lexists(gch) and trusted_library_bytes(gch) is None:
            # the compiler would pick up a precompiled header beside the text: only ours. Removed only here,
            # under the lock: a process building it renames it into place a moment before it signs it
            os.unlink(gch)
        header_ok, done = ready()  # (again: another process may have built it while this one waited)
        if header_ok and done:
            return directory
        if not header_ok:  # missing, or not the text we write (never compiled into a module)
            atomic_write(header, _PCH_HEADER)
        if "g++" not in os.path.basename(cxx) and "gcc" not in _compiler_id(cxx).lower():
            return directory  # only GCC's precompiled headers are used; other compilers read the header
        try:
            with atomic_target(gch) as tmp:
                _run([cxx, *_compile_flags(), "-x", "c++-header", str(header), "-o", str(tmp)],
                     "precompiling the torch headers")
            sign_library(gch)
        except NativeBuildError:
            atomic_write(failed, "the precompiled header failed to build; modules include the header instead\n")
    return directory


#: how long a build waits for another process building the same file before building it itself
BUILD_WAIT_S = 600.0


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold ``lock_path`` (an OS file lock) while building one file: another process building the same file
    (the ranks of a multi-process job compile the same modules at the same moment) waits and then finds it
    built, instead of compiling it a second time. A holder that dies releases the lock; past the wait this
    process builds anyway (each build writes to a temporary file and renames it into place)."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=BUILD_WAIT_S)
    except Timeout:
        yield
        return
    try:
        yield
    finally:
        lock.release()


def library_path(src: NativeSource, directory: Path | None = None) -> Path:
    return (directory or cache_dir()) / f"{src.module_name}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


_RECORD_DOMAIN = b"superkernel-native-module/1"
_RECORD_MAX = 4096


def _record_path(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sig")


def _record_data(lib: Path, data: bytes) -> bytes:
    return lib.name.encode() + b"\0" + hashlib.sha256(data).digest()


def trusted_library_bytes(lib: Path) -> bytes | None:
    """The content of the cached module ``lib`` when this user built it: the file and its record are
    regular files of this user and the record, signed with this user's key, names exactly this content.
    None otherwise (missing, planted by someone else, changed after it was built)."""
    from superkernel.cache_dir import owned_file
    from superkernel.userkey import signed_by_me
    from superkernel.util import InputFileError, read_limited

    record = _record_path(lib)
    if owned_file(lib) is None or owned_file(record) is None:
        return None
    try:
        signature = read_limited(record, _RECORD_MAX, "native module record").decode("ascii", "replace").strip()
        data = lib.read_bytes()
    except (InputFileError, OSError):
        return None
    return data if signed_by_me(_RECORD_DOMAIN, _record_data(lib, data), signature) else None


def sign_library(lib: Path) -> None:
    """Record ``lib`` as built by this user (a ``.sig`` beside it, signed with this user's key): what
    :func:`trusted_library_bytes` checks before anything loads the file."""
    from superkernel.userkey import TrustError, mac

    try:
        signature = mac(_RECORD_DOMAIN, _record_data(lib, lib.read_bytes()))
    except (TrustError, OSError) as exc:
        raise NativeBuildError(f"cannot record native module {lib.name}: {exc}") from None
    atomic_write(_record_path(lib), f"{signature}\n")


def build_library(src: NativeSource, directory: Path | None = None) -> Path:
    """The shared library of ``src`` in ``directory`` (default: the cache), compiled unless this user's
    signed record vouches for the one there (a file someone else put there is replaced, never loaded)."""
    out = library_path(src, directory)
    if trusted_library_bytes(out) is not None:
        return out
    root = cache_dir()
    pch = _pch_dir(root)
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _exclusive(out.parent / f".{src.module_name}.lock"):
        if trusted_library_bytes(out) is not None:  # built by another process while this one waited
            return out
        _compile_module(src, out, pch)
    return out


def _compile_module(src: NativeSource, out: Path, pch: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=f".{src.module_name}.", dir=out.parent))
    try:
        cpp = work / f"{src.module_name}.cpp"
        cpp.write_text(src.source)
        tmp_so = work / out.name
        _run([compiler(), *_compile_flags(), f"-I{pch}", f"-DSK_MODULE={src.module_name}", "-shared", *src.flags,
              str(cpp), "-o", str(tmp_so), *_link_flags()], f"building native module {src.module_name}")
        os.replace(tmp_so, out)
        sign_library(out)
        try:
            os.replace(cpp, out.parent / f"{src.module_name}.cpp")  # kept beside it for reading
        except OSError:
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)


_loaded: dict[str, Any] = {}


def load_library(path: Path | str, module_name: str) -> Any:
    """Import a built native module (once per process)."""
    import importlib.machinery
    import importlib.util

    if module_name in _loaded:
        return _loaded[module_name]
    loader = importlib.machinery.ExtensionFileLoader(module_name, str(path))
    spec = importlib.util.spec_from_file_location(module_name, str(path), loader=loader)
    if spec is None:
        raise NativeBuildError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    _loaded[module_name] = module
    return module


def load(src: NativeSource) -> Any:
    """The loaded module of ``src``: from this process, from the cache, or built now."""
    with _lock:
        if src.module_name in _loaded:
            return _loaded[src.module_name]
        return load_library(build_library(src), src.module_name)
