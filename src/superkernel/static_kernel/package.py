"""Static kernel packages: ``static_kernel_<datetime>.skpkg``.

A package is one zip file (stored, not compressed members are not required; deflated)::

    manifest.json                  what it holds and where it may be used (below)
    artifacts/<key>.bin            one TorchInductor CompiledArtifact per partition and shape
                                   (``CompiledArtifact.save(format="binary")``)
    frames/<key>.bin               one precompiled Dynamo frame per compiled function and input
                                   signature (``superkernel.static_kernel.frames``: torch's
                                   ``AOTCompiledFunction.serialize``, holding Dynamo's graph)
    kernels/<xx>/<name>.so         the compiled C++ kernels those artifacts load, under their
                                   TorchInductor code-cache names (content hashes of source and
                                   compile command), plus Inductor's CPU-ISA probe libraries

The manifest records torch/triton/python versions, platform, device kind and capability,
the compiler-config fingerprint, the captured graphs (structure hash, names, input shapes),
every artifact (partition key, graph, input signature) and the sha256 and size of every
other file. A package is used only when all of that matches this process; otherwise it is
ignored with a warning that says why.

Trust: loading verifies every hash first. Loading then runs nothing from the package but
the compiled code torch itself loads: kernel libraries are copied into TorchInductor's
cache directory, where Inductor's own loader dlopens them; artifacts are read by
``torch._inductor.CompiledArtifact.load`` (TorchInductor's cache entries) and frames by
``torch._dynamo.aot_compile.AOTCompiledFunction.deserialize`` (Dynamo's transformed bytecode
of the compiled function, its guards, and Dynamo's graph through ``torch.fx``'s GraphPickler).
Those are torch's own formats, pickle-based; superkernel never unpickles anything itself.
There are no scripts or installers in a package. Treat a package like any compiled library:
load only packages you built or trust.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superkernel.static_kernel.environment import environment_mismatch
from superkernel.util import atomic_target, atomic_write

FORMAT = "superkernel.static_kernel.package"
FORMAT_VERSION = 1
SUFFIX = ".skpkg"
OUTPUTS_DIR = "static_kernel_outputs"
MANIFEST = "manifest.json"
KERNEL_SUFFIXES = (".so", ".cubin", ".fatbin", ".hsaco", ".spv")
_KERNEL_NAME = re.compile(r"^[A-Za-z0-9_]{1,8}/[A-Za-z0-9_.-]{1,200}$")
_ARTIFACT_NAME = re.compile(r"^(artifacts|frames)/[0-9a-f]{16,64}\.bin$")

class PackageError(RuntimeError):
    """A package cannot be read or does not match (the message says why)."""


# --- writing ---------------------------------------------------------------------------

def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def package_name(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now()
    return f"static_kernel_{now.strftime('%Y%m%d_%H%M%S_%f')}{SUFFIX}"


def write_package(path: Path, manifest: dict[str, Any], files: dict[str, bytes]) -> Path:
    """Write the zip atomically (temporary sibling + rename); adds sizes and hashes to the manifest."""
    manifest = dict(manifest)
    manifest["format"] = FORMAT
    manifest["format_version"] = FORMAT_VERSION
    manifest["files"] = {name: {"sha256": sha256(data), "size": len(data)} for name, data in sorted(files.items())}
    with atomic_target(path, durable=True) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            zf.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
            for name, data in sorted(files.items()):
                zf.writestr(name, data)
    return path


# --- reading ---------------------------------------------------------------------------

@dataclass
class Package:
    """A package whose manifest was read; ``files`` filled by :meth:`verify`."""

    path: Path
    manifest: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    verified: bool = False

    @property
    def artifacts(self) -> dict[str, Any]:
        return self.manifest.get("artifacts", {})

    @property
    def graphs(self) -> dict[str, Any]:
        return self.manifest.get("graphs", {})

    @property
    def frames(self) -> dict[str, Any]:
        """Precompiled frames (``superkernel.static_kernel.frames``) by frame key."""
        return self.manifest.get("frames", {})

    @property
    def kernels(self) -> list[str]:
        return [n for n in self.manifest.get("files", {}) if n.startswith("kernels/")]

    def mismatch(self, env: dict[str, Any], config_fingerprint: str) -> str | None:
        """Why this package cannot be used here (None when its environment and config match)."""
        reason = environment_mismatch(self.manifest.get("environment", {}), env)
        if reason:
            return reason
        if self.manifest.get("config_fingerprint") != config_fingerprint:
            return (f"compiler config differs (package fingerprint {self.manifest.get('config_fingerprint')!r}, "
                    f"here {config_fingerprint!r})")
        return None

    def verify(self) -> None:
        """Read every file and check its size and sha256; raises PackageError naming the first bad file."""
        listed = self.manifest.get("files")
        if not isinstance(listed, dict):
            raise PackageError("manifest lists no files")
        files: dict[str, bytes] = {}
        try:
            with zipfile.ZipFile(self.path) as zf:
                names = set(zf.namelist())
                for name, meta in listed.items():
                    if not (_ARTIFACT_NAME.match(name) or
                            (name.startswith("kernels/") and _KERNEL_NAME.match(name[len("kernels/"):]))):
                        raise PackageError(f"unexpected file name {name!r} in manifest")
                    if name not in names:
                        raise PackageError(f"file {name} listed in the manifest is missing")
                    data = zf.read(name)
                    if len(data) != meta.get("size") or sha256(data) != meta.get("sha256"):
                        raise PackageError(f"file {name} fails its sha256 check (corrupted or modified)")
                    files[name] = data
                extra = names - set(listed) - {MANIFEST}
                if extra:
                    raise PackageError(f"files not in the manifest: {', '.join(sorted(extra)[:3])}")
        except zipfile.BadZipFile as exc:
            raise PackageError(f"damaged zip: {exc}") from exc
        except (OSError, zipfile.LargeZipFile, RuntimeError) as exc:
            if isinstance(exc, PackageError):
                raise
            raise PackageError(f"cannot read: {type(exc).__name__}: {exc}") from exc
        for kind, entries in (("artifact", self.artifacts), ("frame", self.frames)):
            for key, entry in entries.items():
                if entry.get("file") not in files:
                    raise PackageError(f"{kind} {key[:12]} has no file")
        self.files = files
        self.verified = True

    def artifact_bytes(self, key: str) -> bytes:
        return self.files[self.artifacts[key]["file"]]

    def frame_bytes(self, key: str) -> bytes:
        return self.files[self.frames[key]["file"]]


def read_manifest(path: Path) -> Package:
    """Open a package and parse its manifest (cheap: no other member is read)."""
    try:
        with zipfile.ZipFile(path) as zf:
            manifest = json.loads(zf.read(MANIFEST).decode("utf-8"))
    except KeyError as exc:
        raise PackageError("no manifest.json") from exc
    except zipfile.BadZipFile as exc:
        raise PackageError(f"damaged zip: {exc}") from exc
    except (OSError, ValueError, RuntimeError) as exc:
        raise PackageError(f"cannot read manifest: {type(exc).__name__}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackageError("not a superkernel static kernel package")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise PackageError(f"package format {manifest.get('format_version')} (this superkernel reads {FORMAT_VERSION})")
    return Package(Path(path), manifest)


def find_packages(build_dir: Path) -> list[Path]:
    """All packages under ``<build_dir>/static_kernel_outputs/*/``, newest first."""
    root = Path(build_dir) / OUTPUTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"*/static_kernel_*{SUFFIX}") if p.is_file()]

    def order(p: Path) -> tuple[str, float]:
        try:
            mtime = p.stat().st_mtime
        except OSError:
            mtime = 0.0
        return (p.name, mtime)

    return sorted(found, key=order, reverse=True)


# --- installing kernels ------------------------------------------------------------------

def install_kernels(package: Package, cache_dir: str) -> int:
    """Copy the package's kernel libraries into TorchInductor's cache dir under their own names.

    Returns how many files were written (files already present are left alone: the name
    is a content hash of source and compile command, so Inductor would use either).
    """
    if not package.verified:
        raise PackageError("install_kernels needs a verified package")
    written = 0
    root = Path(cache_dir)
    for name in package.kernels:
        rel = name[len("kernels/"):]
        if not _KERNEL_NAME.match(rel) or ".." in rel.split("/"):
            raise PackageError(f"unsafe kernel path {name!r}")
        dest = root / rel
        if dest.exists():
            continue
        atomic_write(dest, package.files[name])  # a cache copy: the package is the original
        os.chmod(dest, 0o755)
        written += 1
    return written


def collect_kernels(cache_dir: Path) -> dict[str, bytes]:
    """Kernel libraries in an Inductor cache dir, as ``kernels/<xx>/<name>`` -> bytes."""
    out: dict[str, bytes] = {}
    root = Path(cache_dir)
    if not root.is_dir():
        return out
    for sub in sorted(root.iterdir()):
        if not sub.is_dir() or sub.name in ("locks", "fxgraph", "aotautograd", "triton", "precompiled_headers"):
            continue
        for f in sorted(sub.iterdir()):
            rel = f"{sub.name}/{f.name}"
            if f.is_file() and f.name.endswith(KERNEL_SUFFIXES) and _KERNEL_NAME.match(rel):
                out[f"kernels/{rel}"] = f.read_bytes()
    return out


def describe(package: Package) -> dict[str, Any]:
    m = package.manifest
    files = m.get("files", {})
    return {
        "path": str(package.path),
        "created": m.get("created"),
        "artifacts": len(m.get("artifacts", {})),
        "frames": len(m.get("frames", {})),
        "kernels": sum(1 for n in files if n.startswith("kernels/")),
        "bytes": sum(int(v.get("size", 0)) for v in files.values()),
        "graphs": {h: {"names": g.get("names", []), "variants": len(g.get("variants", []))}
                   for h, g in m.get("graphs", {}).items()},
        "environment": m.get("environment", {}),
        "config_fingerprint": m.get("config_fingerprint"),
    }


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


__all__ = [
    "FORMAT", "FORMAT_VERSION", "OUTPUTS_DIR", "SUFFIX", "Package", "PackageError", "collect_kernels", "describe",
    "find_packages", "install_kernels", "package_name", "read_manifest", "write_package",
]
