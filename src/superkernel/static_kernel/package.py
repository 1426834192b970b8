"""Static kernel packages: ``static_kernel_<datetime>.skpkg``, and reading one safely.

A package is one zip file (members deflated)::

    manifest.json                  what it holds and where it may be used (below)
    signature                      HMAC-SHA256 of manifest.json with the builder's key (:mod:`.trust`)
    artifacts/<key>.bin            one TorchInductor CompiledArtifact per partition and shape
                                   (``CompiledArtifact.save(format="binary")``)
    frames/<key>.bin               one precompiled Dynamo frame per compiled function and input
                                   signature (:mod:`.frames`: torch's ``AOTCompiledFunction``)
    kernels/<xx>/<name>.so         the compiled C++ kernels those artifacts load, under their
                                   TorchInductor code-cache names (content hashes of source and
                                   compile command), plus Inductor's CPU-ISA probe libraries
    native/<key>.so                one native CPU module per graph (reduce-overhead,
                                   :mod:`superkernel.runtime.cpu.native`), named by a hash of its source

The manifest records torch/triton/python versions, platform, device kind and capability,
the compiler-config fingerprint, the captured graphs (structure hash, names, input shapes),
every artifact, frame and native module (with the torch/Python ABI it was built for), and the sha256 and size of every other member.

Reading is defensive: the zip's central directory is checked first (only the member names
above, no directories, symlinks, duplicates or encrypted members, sizes within limits and
equal to the manifest's) and nothing is decompressed beyond its declared size. The manifest
is validated field by field. Whatever is wrong is a :class:`PackageError` with one line
saying what. Whether a package is *trusted* (signed by this user) is decided here too;
only a verified, trusted package hands out member bytes.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superkernel.static_kernel import trust
from superkernel.static_kernel.environment import environment_mismatch
from superkernel.static_kernel.manifest import (
    FORMAT, FORMAT_VERSION, MAX_MANIFEST_BYTES, MAX_MEMBER_BYTES, MAX_MEMBERS, MAX_TOTAL_BYTES, PackageError,
    valid_member_name, validate_manifest,
)
from superkernel.util import atomic_target

SUFFIX = ".skpkg"
OUTPUTS_DIR = "static_kernel_outputs"
MANIFEST = "manifest.json"
SIGNATURE = "signature"

def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- writing ---------------------------------------------------------------------------

def package_name(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now()
    return f"static_kernel_{now.strftime('%Y%m%d_%H%M%S_%f')}{SUFFIX}"


def write_package(path: Path, manifest: dict[str, Any], files: dict[str, bytes]) -> Path:
    """Write and sign the zip atomically (temporary sibling + rename); adds sizes and hashes to the manifest."""
    manifest = dict(manifest)
    manifest["format"] = FORMAT
    manifest["format_version"] = FORMAT_VERSION
    manifest["files"] = {name: {"sha256": sha256(data), "size": len(data)} for name, data in sorted(files.items())}
    bad = [n for n in files if not valid_member_name(n)]
    if bad:
        raise PackageError(f"refusing to package member name {bad[0]!r}")
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return _write_zip(path, data, trust.sign(data), files)


def _write_zip(path: Path, manifest: bytes, signature: str, files: dict[str, bytes]) -> Path:
    with atomic_target(path, durable=True) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            zf.writestr(MANIFEST, manifest)
            zf.writestr(SIGNATURE, signature)
            for name, data in sorted(files.items()):
                zf.writestr(name, data)
    return path


def resign(pkg: "Package") -> None:
    """Sign ``pkg`` (read and verified) with this user's key: a person decided to trust it."""
    if not pkg.verified:
        raise PackageError("only a verified package can be trusted")
    _write_zip(pkg.path, pkg.manifest_bytes, trust.sign(pkg.manifest_bytes), pkg.files)


# --- reading ---------------------------------------------------------------------------

@dataclass
class Package:
    """A package whose central directory and manifest were checked; ``files`` filled by :meth:`verify`.

    ``untrusted``: why it is not trusted here (None: signed by this user).
    """

    path: Path
    manifest: dict[str, Any]
    manifest_bytes: bytes = b""
    untrusted: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    verified: bool = False

    @property
    def trusted(self) -> bool:
        return self.untrusted is None

    @property
    def artifacts(self) -> dict[str, Any]:
        return self.manifest["artifacts"]

    @property
    def graphs(self) -> dict[str, Any]:
        return self.manifest["graphs"]

    @property
    def frames(self) -> dict[str, Any]:
        """Precompiled frames (:mod:`.frames`) by frame key."""
        return self.manifest["frames"]

    @property
    def native(self) -> dict[str, Any]:
        """Native CPU modules (:mod:`.native`) by source key (none in packages written before they were carried)."""
        return self.manifest.get("native", {})

    @property
    def kernels(self) -> list[str]:
        return [n for n in self.manifest["files"] if n.startswith("kernels/")]

    def mismatch(self, env: dict[str, Any], config_fingerprint: str) -> str | None:
        """Why this package cannot be used here (None when its environment and config match)."""
        reason = environment_mismatch(self.manifest["environment"], env)
        if reason:
            return reason
        if self.manifest["config_fingerprint"] != config_fingerprint:
            return (f"compiler config differs (package fingerprint {self.manifest['config_fingerprint']!r}, "
                    f"here {config_fingerprint!r})")
        return None

    def verify(self, *, keep: bool = True) -> None:
        """Read every member (never past its declared size) and check its size and sha256; PackageError names
        the first bad one. ``keep=False`` (``--list``) hashes in chunks and keeps nothing in memory."""
        files: dict[str, bytes] = {}
        try:
            with zipfile.ZipFile(self.path) as zf:
                infos = _members(zf)
                for name, meta in self.manifest["files"].items():
                    info = infos[name]
                    if info.file_size != meta["size"]:
                        raise PackageError(f"member {name} is {info.file_size} bytes in the zip, "
                                           f"{meta['size']} in the manifest")
                    digest, size, chunks = hashlib.sha256(), 0, []
                    with zf.open(info) as f:
                        while size <= meta["size"]:
                            chunk = f.read(min(1 << 20, meta["size"] + 1 - size))
                            if not chunk:
                                break
                            digest.update(chunk)
                            size += len(chunk)
                            if keep:
                                chunks.append(chunk)
                    if size != meta["size"] or digest.hexdigest() != meta["sha256"]:
                        raise PackageError(f"file {name} fails its sha256 check (corrupted or modified)")
                    if keep:
                        files[name] = b"".join(chunks)
        except PackageError:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, RuntimeError, ValueError, EOFError,
                NotImplementedError, KeyError, zlib_error()) as exc:
            raise PackageError(f"damaged zip: {_one_line(exc)}") from exc
        self.files = files
        self.verified = keep

    def require_loadable(self) -> None:
        """Raise unless this package may supply code: verified and trusted."""
        if not self.verified:
            raise PackageError(f"package {self.path.name} was not verified")
        if not self.trusted:
            raise PackageError(f"package {self.path.name} is not trusted: {self.untrusted}")

    def member(self, name: str) -> bytes:
        self.require_loadable()
        return self.files[name]

    def artifact_bytes(self, key: str) -> bytes:
        return self.member(self.artifacts[key]["file"])

    def frame_bytes(self, key: str) -> bytes:
        return self.member(self.frames[key]["file"])

    def native_bytes(self, key: str) -> bytes:
        return self.member(self.native[key]["file"])


def zlib_error() -> type[BaseException]:
    import zlib

    return zlib.error


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def _members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """The central directory, checked: known member kinds only, sizes within limits, nothing odd."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise PackageError(f"too many members ({len(infos)} > {MAX_MEMBERS})")
    out: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        name = info.filename
        if name in out:
            raise PackageError(f"member {name[:80]!r} appears twice")
        if name not in (MANIFEST, SIGNATURE) and not valid_member_name(name):
            raise PackageError(f"unexpected member name {name[:80]!r}")
        mode = info.external_attr >> 16
        if info.is_dir() or stat.S_ISLNK(mode) or (mode and not stat.S_ISREG(mode) and stat.S_IFMT(mode)):
            raise PackageError(f"member {name[:80]!r} is not a regular file")
        if info.flag_bits & 0x1:
            raise PackageError(f"member {name[:80]!r} is encrypted")
        limit = MAX_MANIFEST_BYTES if name == MANIFEST else 256 if name == SIGNATURE else MAX_MEMBER_BYTES
        if info.file_size > limit:
            raise PackageError(f"member {name[:80]!r} is {info.file_size} bytes (limit {limit})")
        total += info.file_size
        if total > MAX_TOTAL_BYTES:
            raise PackageError(f"members add up to more than {MAX_TOTAL_BYTES} bytes")
        out[name] = info
    return out


def _read(zf: zipfile.ZipFile, info: zipfile.ZipInfo, size: int) -> bytes:
    """A member's bytes, never decompressing more than ``size`` + 1 bytes."""
    if info.file_size != size:
        raise PackageError(f"member {info.filename} is {info.file_size} bytes in the zip, {size} in the manifest")
    with zf.open(info) as f:
        return f.read(size + 1)


def read_manifest(path: Path) -> Package:
    """Open a package: check its central directory, read, validate and authenticate its manifest.

    Cheap: no other member is decompressed. Raises :class:`PackageError` (one line) on anything malformed;
    an unsigned or foreign package is returned with ``untrusted`` set.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            infos = _members(zf)
            if MANIFEST not in infos:
                raise PackageError("no manifest.json")
            raw = _read(zf, infos[MANIFEST], infos[MANIFEST].file_size)
            signature = _read(zf, infos[SIGNATURE], infos[SIGNATURE].file_size) if SIGNATURE in infos else b""
            members = set(infos) - {MANIFEST, SIGNATURE}
    except PackageError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, RuntimeError, ValueError, EOFError,
            NotImplementedError, KeyError, zlib_error()) as exc:
        raise PackageError(f"damaged zip: {_one_line(exc)}") from exc
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise PackageError(f"cannot read manifest: {_one_line(exc)}") from exc
    validate_manifest(manifest)
    listed = set(manifest["files"])
    missing = sorted(listed - members)
    if missing:
        raise PackageError(f"file {missing[0]} listed in the manifest is missing")
    extra = sorted(members - listed)
    if extra:
        raise PackageError(f"files not in the manifest: {', '.join(extra[:3])}")
    for name in listed:
        if infos[name].file_size != manifest["files"][name]["size"]:
            raise PackageError(f"member {name} is {infos[name].file_size} bytes in the zip, "
                               f"{manifest['files'][name]['size']} in the manifest")
    try:
        sig_text = signature.decode("ascii").strip()
    except UnicodeDecodeError:
        sig_text = ""
    return Package(Path(path), manifest, raw, trust.verify(raw, sig_text))


def find_packages(build_dir: Path) -> list[Path]:
    """All packages under ``<build_dir>/static_kernel_outputs/*/``, newest first (regular files only)."""
    root = Path(build_dir) / OUTPUTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"*/static_kernel_*{SUFFIX}") if p.is_file() and not p.is_symlink()]

    def order(p: Path) -> tuple[str, float]:
        try:
            mtime = p.stat().st_mtime
        except OSError:
            mtime = 0.0
        return (p.name, mtime)

    return sorted(found, key=order, reverse=True)


def refuse(path: Path) -> Path | None:
    """Keep a refused package for inspection: rename it aside (``NAME.refused-<time>``); the new name."""
    stamp = _dt.datetime.now().strftime("%Y%m%d%H%M%S%f")
    target = path.with_name(f"{path.name}.refused-{stamp}")
    try:
        path.rename(target)
    except OSError:
        return None
    return target


def describe(package: Package) -> dict[str, Any]:
    m = package.manifest
    files = m["files"]
    return {
        "path": str(package.path),
        "created": m.get("created"),
        "artifacts": len(m["artifacts"]),
        "frames": len(m["frames"]),
        "kernels": sum(1 for n in files if n.startswith("kernels/")),
        "native": len(m.get("native", {})),
        "bytes": sum(int(v["size"]) for v in files.values()),
        "graphs": {h: {"names": g.get("names", []), "variants": len(g.get("variants", []))}
                   for h, g in m["graphs"].items()},
        "environment": m["environment"],
        "config_fingerprint": m["config_fingerprint"],
        "trusted": package.trusted,
        "untrusted": package.untrusted,
    }


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


__all__ = [
    "FORMAT", "FORMAT_VERSION", "OUTPUTS_DIR", "SUFFIX", "Package", "PackageError", "describe",
    "find_packages", "package_name", "read_manifest", "refuse", "resign", "validate_manifest",
    "write_package",
]
