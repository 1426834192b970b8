"""Feature detection for the TorchInductor APIs static kernels are built on.

Everything version-dependent is looked up here, once, so the rest of the package reads
plainly. Supported: torch 2.11 and later (``standalone_compile`` with
``CompiledArtifact.save/load``; ``torch._inductor.runtime.cache_dir_utils``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import Any, Callable, Iterator

import torch


class StaticKernelUnsupported(RuntimeError):
    """This torch build lacks an API static kernels need (the feature turns itself off)."""


def standalone_compile_fn() -> Callable[..., Any]:
    fn = getattr(torch._inductor, "standalone_compile", None) if hasattr(torch, "_inductor") else None
    if fn is None:
        try:
            from torch._inductor import standalone_compile as fn  # type: ignore[no-redef]
        except ImportError as exc:  # pragma: no cover - torch < 2.8
            raise StaticKernelUnsupported(
                f"torch {torch.__version__} has no torch._inductor.standalone_compile; static kernels need torch >= 2.11"
            ) from exc
    return fn


def compiled_artifact_cls() -> Any:
    try:
        from torch._inductor import CompiledArtifact
    except ImportError:
        try:
            from torch._inductor.standalone_compile import CompiledArtifact  # type: ignore[no-redef]
        except ImportError as exc:  # pragma: no cover
            raise StaticKernelUnsupported(
                f"torch {torch.__version__} has no torch._inductor.CompiledArtifact; static kernels need torch >= 2.11"
            ) from exc
    return CompiledArtifact


def load_artifact(path: str) -> Any:
    """``CompiledArtifact.load`` of a binary artifact, with the options every static load uses.

    The builder's fresh-process load check and the loading process both call this, so the
    check proves exactly the load a later process does. Precompiled headers stay off, as in
    the build (their flag is part of a kernel's cache name).
    """
    with inductor_config_patch({"cpp_cache_precompile_headers": False}):
        return compiled_artifact_cls().load(path=path, format="binary")


def standalone_compile(gm: torch.fx.GraphModule, example_inputs: list[Any], config_patches: dict[str, Any]) -> Any:
    """``torch._inductor.standalone_compile`` specialised on the example inputs' shapes."""
    fn = standalone_compile_fn()
    from torch._inductor import config as inductor_config

    patches = {k: v for k, v in config_patches.items() if _has_config(inductor_config, k)}  # options this torch knows
    kwargs: dict[str, Any] = {"dynamic_shapes": "from_example_inputs", "options": {"config_patches": patches}}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover
        params = {}
    if "aot" in params:
        kwargs["aot"] = False  # the cache-artifact format: it can carry the FX graph + AOTAutograd entries
    from superkernel.runtime.inductor.output import output_logged

    with output_logged():  # autotune tables: debug log, not the user's terminal
        return fn(gm, example_inputs, **kwargs)


@contextlib.contextmanager
def inductor_cache_dir_at(directory: str) -> Iterator[None]:
    """Point TorchInductor's on-disk caches at ``directory`` (in-memory caches cleared on entry and exit)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    except ImportError:  # pragma: no cover
        temporary_cache_dir = None
    if temporary_cache_dir is not None:
        with temporary_cache_dir(directory):
            yield
        return
    from torch._inductor.utils import clear_caches  # pragma: no cover

    original = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # pragma: no cover
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    try:
        clear_caches()
        yield
    finally:
        clear_caches()
        if original is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = original


def inductor_config_patch(patches: dict[str, Any]) -> Any:
    """``torch._inductor.config.patch`` restricted to the keys this torch knows."""
    from torch._inductor import config as inductor_config

    known = {k: v for k, v in patches.items() if _has_config(inductor_config, k)}
    return inductor_config.patch(known)


def _has_config(cfg: Any, dotted: str) -> bool:
    obj = cfg
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def unset_fake_mode() -> Any:
    """Context manager that leaves any active FakeTensorMode (to make real tensors)."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        return unset_fake_temporarily()
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()


def triton_version() -> str | None:
    try:
        import triton  # type: ignore[import-not-found]

        return str(triton.__version__)
    except Exception:  # noqa: BLE001 - absent or broken triton: not part of the environment
        return None
