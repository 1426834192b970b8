"""TorchInductor's CPU-ISA probe libraries, built once per user for every package build.

Each package is built in a private TorchInductor cache (the build's staging dir), and TorchInductor
compiles its CPU-ISA probes there afresh (small C++ programs, one per instruction set: about 6 s
of g++ on 2 cores per build), so that the package carries them and a process loading it compiles
nothing. A probe's file name is a hash of its source, flags, compiler and torch version, so one copy
serves every later build: the first build keeps its probes here, each file signed with this user's
key like a native module, and later builds start with a copy of those whose record checks out
(TorchInductor then only loads them). A probe is a source holding TorchInductor's probe function
(``__avx_chk_kernel``) and the library of the same name; when TorchInductor's probe changes, nothing
is kept and builds compile their probes as before.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from superkernel.cache_dir import CacheDirError, private_cache_dir
from superkernel.runtime.cpu.native.build import NativeBuildError, sign_library, trusted_library_bytes
from superkernel.util import atomic_target

#: what using the store may raise (a cache dir that is not private, a key that cannot sign, I/O)
STORE_ERRORS = (OSError, CacheDirError, NativeBuildError)
#: TorchInductor's probe function, the mark of a probe source
PROBE_MARK = b"__avx_chk_kernel"
#: TorchInductor's cache-relative names of compiled sources: ``<2 chars>/c<hash>.cpp`` (and ``.so``)
_SOURCE = re.compile(r"^c[a-z0-9]{20,64}\.cpp$")
#: a probe source is a few hundred bytes; larger sources are not read
_MAX_SOURCE = 16_384


def _store() -> Path:
    return private_cache_dir("isa_probes")


def probes(cache_dir: Path) -> list[str]:
    """Cache-relative names (``xx/c<hash>.cpp`` and ``.so``) of the probes compiled in an Inductor cache dir."""
    found = []
    root = Path(cache_dir)
    for sub in sorted(root.iterdir()) if root.is_dir() else []:
        if not sub.is_dir() or sub.is_symlink() or len(sub.name) != 2:
            continue
        for src in sorted(sub.iterdir()):
            lib = src.with_suffix(".so")
            if (_SOURCE.match(src.name) and src.is_file() and not src.is_symlink() and lib.is_file()
                    and not lib.is_symlink() and src.stat().st_size <= _MAX_SOURCE and PROBE_MARK in src.read_bytes()):
                found += [f"{sub.name}/{src.name}", f"{sub.name}/{lib.name}"]
    return found


def seed(staging: Path) -> int:
    """Copy the probes this user kept into ``staging`` (a file already there stays); how many files."""
    store, copied = _store(), 0
    for name in probes(store):
        target = staging / name
        data = trusted_library_bytes(store / name)
        if data is None or target.exists():
            continue  # (a file without a valid record of this user is never copied)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        copied += 1
    return copied


def keep(staging: Path) -> int:
    """Keep the probes compiled in ``staging`` that are not kept yet; how many files."""
    store, kept = _store(), 0
    for name in probes(staging):
        target = store / name
        if trusted_library_bytes(target) is not None:
            continue
        target.parent.mkdir(mode=0o700, exist_ok=True)
        with atomic_target(target) as tmp:  # (another build may keep the same file at the same time)
            shutil.copyfile(staging / name, tmp)
        sign_library(target)
        kept += 1
    return kept
