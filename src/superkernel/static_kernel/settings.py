"""Where static kernels go and what they are built with: build dir, Inductor options, fingerprint.

Everything here is decided from the compiler config before anything is compiled or loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from superkernel.config import CompilerConfig
from superkernel.runtime.realizations import realization_for

ENV_VERIFY = "SUPERKERNEL_STATIC_VERIFY"  # "0": skip the fresh-process load check when a package is written
ENV_LOCK_TIMEOUT = "SUPERKERNEL_STATIC_LOCK_TIMEOUT"  # seconds to wait for another builder (default 3600)
ENV_PREWARM = "SUPERKERNEL_STATIC_PREWARM"  # "0": no early package check / ISA probe thread
#: "1": a package built for another rank layout (world size) is ignored and a new one built
#: (``static-compile --rebuild``); otherwise it is a :class:`RankLayoutError`
ENV_REBUILD = "SUPERKERNEL_STATIC_REBUILD"

log = logging.getLogger("superkernel.static_kernel")


class StaticKernelWarning(UserWarning):
    """A package was ignored (and why), or a static kernel could not be built or loaded."""


class RankLayoutError(ValueError):
    """The build directory holds a package for this job except its rank layout (world size), and no other."""


def rebuild_other_layout() -> bool:
    return os.environ.get(ENV_REBUILD, "0") not in ("", "0")


class BuildDirError(ValueError):
    """The static kernel build directory does not exist or is not writable."""


def default_build_dir() -> Path:
    """Next to the running script (TorchAir's default), else the working directory."""
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if script and script not in ("-c", "-m") and os.path.isfile(script):
        return Path(script).resolve().parent
    return Path.cwd()


def resolve_build_dir(build_dir: str | os.PathLike[str] | None) -> Path:
    from superkernel.util import OutputError, check_link_path

    path = Path(build_dir).expanduser() if build_dir else default_build_dir()
    try:  # never a link itself, no other user's link on the way (docs/security.md)
        check_link_path(path, "static kernel build_dir")
    except OutputError as exc:
        raise BuildDirError(str(exc)) from None
    if not path.is_dir():
        raise BuildDirError(
            f"static kernel build_dir {str(path)!r} does not exist; create it first "
            "(config.experimental_config.static_kernel.build_dir / --build-dir)")
    if not os.access(path, os.W_OK | os.X_OK):
        raise BuildDirError(f"static kernel build_dir {str(path)!r} is not writable by this user")
    return path.resolve()


def inductor_patches(compiler_config: CompilerConfig, device_kind: str) -> dict[str, Any]:
    """The TorchInductor options a static build uses: those of runtime/inductor.compile_partition, plus one.

    ``cpp_cache_precompile_headers`` is off: the precompiled-header flag enters the kernel's
    cache name, and a precompiled header would itself have to be compiled at load time.
    """
    from superkernel.runtime.inductor.compile import inductor_patches as partition_patches

    inductor = compiler_config.inductor
    patches = partition_patches(device_kind, cpp_wrapper=bool(inductor.cpp_wrapper), autotune=bool(inductor.autotune),
                                pdl=bool(compiler_config.cuda.pdl))
    patches["cpp_cache_precompile_headers"] = False
    return patches


def config_fingerprint(compiler_config: CompilerConfig, device_kind: str) -> str:
    """The compiler config's fingerprint plus a hash of the Inductor options a static build uses."""
    patches = json.dumps(inductor_patches(compiler_config, device_kind), sort_keys=True)
    return f"{compiler_config.fingerprint()}-{hashlib.sha256(patches.encode()).hexdigest()[:8]}"


def compiles(compiler_config: CompilerConfig, device_kind: str) -> bool:
    """Whether partitions are compiled at all (else only shapes are recorded): the realization's answer."""
    return realization_for(compiler_config, device_kind).compiles(compiler_config)


def packs_native(compiler_config: CompilerConfig, device_kind: str) -> bool:
    """Whether graphs become native CPU modules a package carries: the realization's answer."""
    return realization_for(compiler_config, device_kind).packs_native(compiler_config, device_kind)
