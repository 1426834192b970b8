"""Fuzz: static kernel packages that are damaged, tampered with or hostile.

One small real package is built once per module (in this process, with a private trust key
and Inductor cache); every case mutates a copy of it — byte flips and truncation of the
zip, flipped, renamed, added, dropped and duplicated members, odd member names, symlink,
directory and encrypted entries, rewritten manifests (hashes recomputed, re-signed with
this user's key, with another key, or not at all), huge and malformed declared sizes,
garbage signatures, and planted payloads (a pickle whose ``__reduce__`` creates a marker
file, a shared library whose constructor does) — and reads it the way the loader does:
central directory and manifest, trust, hashes, kernel installation into a private cache,
plus ``static-compile --list`` and the backend's package choice on a sample.

Every case must end in a :class:`PackageError` with one line, or in a correct load (a
trusted, verified package whose content is exactly what was signed): never another
exception, never a file outside the case's cache directory, never the marker file.
Seeded and bounded.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import os
import pickle
import random
import shutil
import stat
import subprocess
import warnings
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from superkernel import CompilerConfig
from superkernel.static_kernel import trust
from superkernel.static_kernel.loader import install_kernels
from superkernel.static_kernel.manifest import PackageError
from superkernel.static_kernel.package import MANIFEST, SIGNATURE, find_packages, read_manifest, sha256
from tests._env import environ

SEED = 20261123
COUNTS: Counter[str] = Counter()
REASONS: Counter[str] = Counter()  # first words of the refusals, to see which checks the cases reach

ODD_NAMES = [
    "../evil.so", "/abs/evil.so", "kernels/ab/.", "kernels/ab/..", "kernels/../../evil.so", "kernels/ab/../../x.so",
    "kernels/./ab/cabcdefgh.so", "kernels/ab/cabcdefgh.py", "kernels/ab/cabcdefgh.so/", "kernels/ab/", "kernels/",
    "kernels/AB/cabcdefgh.so", "kernels/abc/cabcdefgh.so", "kernels/ab/c.so", "kernels\\ab\\cabcdefgh.so",
    "kernels/ab/cabcdefgh.so\x00.txt", "kernels/ab/c\u00e9abcdefgh.so", "kernels/locks/cabcdefgh.so",
    "kernels/fx/graph/cabcdefgh.so", "artifacts/../manifest.json", "artifacts/ZZZZZZZZZZZZZZZZ.bin",
    "artifacts/0123456789abcdef.pkl", "frames/0123456789abcdef.bin.py", "frames/", "frames/0123", "manifest.json/",
    "MANIFEST.JSON", "signature.bak", "kernels/ab/" + "c" * 300 + ".so", "__init__.py", "setup.py", ".", "..", "",
    "kernels/ab/cabcdefgh.main.so", "kernels/zz/c0123456789.cubin", "frames/0123456789abcdef0123.bin",
    "native/../evil.so", "native/" + "0" * 31 + ".so", "native/" + "F" * 32 + ".so", "native/ab/" + "0" * 32 + ".so",
    "native/" + "0" * 32 + ".so\n", "native/" + "0" * 32 + ".py", "native/" + "0" * 32 + ".so",
]


# --- one real package ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory):
    """A private trust key, Inductor cache and build settings for this module; restored afterwards."""
    root = tmp_path_factory.mktemp("fuzz_packages")
    with environ(XDG_CACHE_HOME=str(root / "xdg"), TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),
                 SUPERKERNEL_STATIC_VERIFY="0", SUPERKERNEL_STATIC_PREWARM="0"):
        yield root


def _never():
    raise AssertionError("the normal compile path must not run")


@pytest.fixture(scope="module")
def base(fuzz_env):
    """The members of one real package (built here), the marker path and the payloads."""
    from superkernel.static_kernel.compiler import open_compiler
    from superkernel.static_kernel.workspace import reset_workspaces

    build_dir = fuzz_env / "build0"
    build_dir.mkdir()
    cfg = CompilerConfig()
    cfg.experimental_config.static_kernel.enable = True
    cfg.experimental_config.static_kernel.build_dir = str(build_dir)
    cfg.inductor.cpp_wrapper = False  # one C++ kernel to compile, not a kernel and a wrapper
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = make_fx(lambda a, b: (torch.relu(a @ b) * 2.0,))(x, w)
    reset_workspaces()
    from torch._inductor import config as inductor_config

    try:  # no vectorization: Inductor then skips its CPU-ISA probe builds (the package's content does not matter)
        with inductor_config.patch({"cpp.vec_isa_ok": False}):
            compiler = open_compiler(cfg)
            compiler.record_graph(gm, "graph_0")
            compiler.compile(gm, [x, w], _never, name="fuzz")
            compiler.finalize()
    finally:
        reset_workspaces()
    (path,) = find_packages(build_dir)
    with zipfile.ZipFile(path) as zf:
        members = [(i.filename, zf.read(i)) for i in zf.infolist()]
    marker = fuzz_env / "MARKER_CODE_RAN"
    return {"path": path, "raw": path.read_bytes(), "members": members, "marker": marker,
            "manifest": json.loads(dict(members)[MANIFEST]), "pickle": pickle.dumps(_Payload(str(marker))),
            "so": _payload_library(fuzz_env, marker)}


class _Payload:
    """Unpickling this creates the marker file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _payload_library(root: Path, marker: Path) -> bytes:
    """A shared library whose constructor creates the marker (random bytes when no C compiler is at hand)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    src = root / "payload.c"
    src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                   f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    out = root / "payload.so"
    if cc:
        try:
            subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True,
                           timeout=60)
            return out.read_bytes()
        except (OSError, subprocess.SubprocessError):
            pass
    return b"\x7fELF" + bytes(random.Random(1).randrange(256) for _ in range(4096))


# --- building mutated packages --------------------------------------------------------------

Member = tuple  # (name, data, external_attr or None, flag_bits)


def _zip(members: list[Member], *, stored: bool = True) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are the point of some cases
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED,
                             compresslevel=None if stored else 1) as zf:
            for name, data, attr, flags in members:
                info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
                if attr is not None:
                    info.external_attr = attr
                else:
                    info.external_attr = (stat.S_IFREG | 0o600) << 16
                info.flag_bits |= flags
                zf.writestr(info, data)
    return buf.getvalue()


def _members(base) -> list[Member]:
    return [(n, d, None, 0) for n, d in base["members"]]


def _manifest_bytes(m: dict[str, Any]) -> bytes:
    return json.dumps(m, indent=1, sort_keys=True).encode()


def _with_manifest(members: list[Member], manifest: Any, *, sign: str, rehash: bool,
                   rng: random.Random) -> list[Member]:
    """Members with ``manifest`` (files' hashes recomputed when ``rehash``), signed as ``sign`` says."""
    others = {n: d for n, d, _, _ in members if n not in (MANIFEST, SIGNATURE)}
    if rehash and isinstance(manifest, dict):
        manifest["files"] = {n: {"sha256": sha256(d), "size": len(d)} for n, d in others.items()}
    raw = manifest if isinstance(manifest, bytes) else _manifest_bytes(manifest)
    if sign == "user":
        signature = trust.sign(raw).encode()
    elif sign == "other":
        signature = hmac.new(rng.randbytes(32), raw, hashlib.sha256).hexdigest().encode()
    elif sign == "keep":
        signature = next((d for n, d, _, _ in members if n == SIGNATURE), b"")
    else:
        signature = None
    out = [(MANIFEST, raw, None, 0)]
    if signature is not None:
        out.append((SIGNATURE, signature, None, 0))
    return out + [m for m in members if m[0] not in (MANIFEST, SIGNATURE)]


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(11 if depth < 3 else 9)
    if choice == 9:
        return [_random_json(rng, depth + 1)]
    if choice == 10:
        return {"k": _random_json(rng, depth + 1)}
    return [None, True, -1, 10 ** 30, 1.5, "", "x" * rng.randrange(1, 300), [], {}][choice]


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            out += _paths(v, prefix + (i,))
    return out


def _set(obj: Any, path: tuple, value: Any, delete: bool = False) -> None:
    for p in path[:-1]:
        obj = obj[p]
    if delete and isinstance(obj, dict):
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


# --- reading a package the way the loader does ------------------------------------------------

def _attempt(path: Path, cache: Path) -> tuple[str, Any]:
    """``("loaded", package)`` or ``("refused", message)``; any other exception fails the case."""
    try:
        pkg = read_manifest(path)
        pkg.verify()
        pkg.require_loadable()
        install_kernels(pkg, cache)
    except PackageError as exc:
        message = str(exc)
        assert message and "\n" not in message, f"PackageError without one clear line: {message!r}"
        return "refused", message
    return "loaded", pkg


class Harness:
    """Runs cases in one work directory and checks what every case may and may not do."""

    def __init__(self, root: Path, base: dict[str, Any]) -> None:
        self.root = root
        self.base = base
        self.build = root / "build"
        self.pkg = self.build / "static_kernel_outputs" / "1_outputs" / "static_kernel_20260101_000000_000000.skpkg"
        self.cache = root / "cache"
        self.base_files = {n: d for n, d in base["members"] if n not in (MANIFEST, SIGNATURE)}
        self.base_manifest = dict(base["members"])[MANIFEST]

    def run(self, family: str, data: bytes, *, sample: bool = False) -> str:
        if self.cache.exists():
            shutil.rmtree(self.cache)
        self.cache.mkdir()
        self.pkg.parent.mkdir(parents=True, exist_ok=True)
        self.pkg.write_bytes(data)
        outcome, detail = _attempt(self.pkg, self.cache)
        if outcome == "loaded":  # a correct load: a verified package whose signed manifest describes its files
            pkg = detail
            assert pkg.trusted and pkg.verified
            assert {n: sha256(d) for n, d in pkg.files.items()} == {n: m["sha256"] for n, m in
                                                                    pkg.manifest["files"].items()}
            if pkg.manifest_bytes == self.base_manifest:
                assert pkg.files == self.base_files, f"{family}: the signed manifest loaded other content"
        else:
            REASONS[" ".join(detail.split()[:3])[:40]] += 1
        if sample:
            self._list_and_choose()
        self._check_no_escape(family)
        assert not self.base["marker"].exists(), f"{family}: planted code ran"
        COUNTS[f"{family}:{outcome}"] += 1
        return outcome

    def _list_and_choose(self) -> None:
        from superkernel.static_kernel.environment import environment
        from superkernel.static_kernel.store import PackageStore
        from superkernel.tools.static_compile import list_packages

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert list_packages(self.build, as_json=True) == 0
        rows = json.loads(out.getvalue())
        assert len(rows) == 1 and isinstance(rows[0]["trusted"], bool)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            store = PackageStore(self.build, "cpu", environment("cpu"), "fingerprint", Counter())
            store.usable()

    def _check_no_escape(self, family: str) -> None:
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            for name in filenames + dirnames:
                p = here / name
                rel = p.relative_to(self.root)
                if p == self.pkg or rel.parts[0] == "cache" or p in self.pkg.parents:
                    if rel.parts[0] == "cache" and len(rel.parts) > 1:
                        assert not p.is_symlink(), f"{family}: symlink {rel} written"
                        assert len(rel.parts) <= 3, f"{family}: {rel} outside the cache layout"
                    continue
                raise AssertionError(f"{family}: wrote {rel} outside the cache directory")


@pytest.fixture
def harness(base, tmp_path):
    return Harness(tmp_path, base)


# --- the cases ----------------------------------------------------------------------------------

def test_the_real_package_loads(harness):
    assert harness.run("clean", harness.base["raw"], sample=True) == "loaded"
    assert harness.run("recompressed", _zip(_members(harness.base), stored=False)) == "loaded"
    reordered = list(reversed(_members(harness.base)))
    assert harness.run("reordered", _zip(reordered)) == "loaded"


def test_byte_level_damage(harness):
    rng = random.Random(SEED)
    raw = harness.base["raw"]
    for i in range(260):
        data = bytearray(raw)
        for _ in range(rng.choice([1, 1, 2, 4, 16])):
            pos = rng.randrange(len(data)) if rng.random() < 0.5 else len(data) - 1 - rng.randrange(min(len(data), 400))
            data[pos] ^= 1 << rng.randrange(8)
        harness.run("byte_flip", bytes(data), sample=i % 40 == 0)
    for i in range(60):
        harness.run("truncated", raw[: rng.randrange(len(raw))], sample=i % 20 == 0)
    harness.run("empty", b"")
    harness.run("not_a_zip", b"PK\x03\x04" + rng.randbytes(200))


def test_member_level_tampering(harness):
    rng = random.Random(SEED + 1)
    base = harness.base
    names = [n for n, _ in base["members"] if n not in (MANIFEST, SIGNATURE)]
    for i in range(320):
        members = _members(base)
        kind = rng.choice(["flip", "rename", "add", "drop", "duplicate", "attrs"])
        manifest = json.loads(dict(base["members"])[MANIFEST])
        sign = rng.choice(["keep", "user", "other", "none"])
        rehash = rng.random() < 0.7
        pick = rng.choice(names)
        j = next(k for k, m in enumerate(members) if m[0] == pick)
        if kind == "flip":
            n, d, a, f = members[j]
            d = bytearray(d)
            d[rng.randrange(len(d))] ^= 0xFF
            members[j] = (n, bytes(d), a, f)
        elif kind == "rename":
            old = members[j][0]
            new = rng.choice(ODD_NAMES)
            members[j] = (new,) + members[j][1:]
            if rng.random() < 0.5 and isinstance(manifest["files"], dict):
                manifest["files"][new] = manifest["files"].pop(old)
        elif kind == "add":
            name = rng.choice(ODD_NAMES + ["kernels/ab/cabcdefghij.so", "frames/0123456789abcdef.bin"])
            data = rng.choice([base["pickle"], base["so"], rng.randbytes(rng.randrange(1, 2000))])
            members.append((name, data, None, 0))
        elif kind == "drop":
            members = [m for m in members if m[0] != pick]
        elif kind == "duplicate":  # any member twice, the manifest and signature included; nothing rebuilt
            members.append(rng.choice(members))
            sign, rehash = "keep", False
        else:
            j = rng.randrange(len(members))
            attr = rng.choice([(stat.S_IFLNK | 0o777) << 16, (stat.S_IFDIR | 0o755) << 16 | 0x10,
                               (stat.S_IFIFO | 0o600) << 16, 0, (stat.S_IFREG | 0o4755) << 16])
            members[j] = members[j][:2] + (attr, rng.choice([0, 0, 1]))
        if sign != "keep" or rehash:
            members = _with_manifest(members, manifest, sign=sign, rehash=rehash, rng=rng)
        outcome = harness.run(f"member_{kind}", _zip(members), sample=i % 40 == 0)
        assert kind != "duplicate" or outcome == "refused"


def test_manifest_level_tampering(harness):
    rng = random.Random(SEED + 2)
    base = harness.base
    for i in range(300):
        manifest = json.loads(dict(base["members"])[MANIFEST])
        paths = _paths(manifest)
        kind = rng.choice(["set", "set", "delete", "size", "garbage"])
        rehash = kind not in ("size",) and rng.random() < 0.6
        if kind == "set":
            _set(manifest, rng.choice(paths), _random_json(rng))
        elif kind == "delete":
            _set(manifest, rng.choice(paths), None, delete=True)
        elif kind == "size":
            name = rng.choice(list(manifest["files"]))
            manifest["files"][name]["size"] = rng.choice([10 ** 12, 2 ** 31, -1, 0, 1.0, True, "12", None,
                                                          manifest["files"][name]["size"] + rng.choice([-1, 1])])
        else:
            manifest = rng.choice([rng.randbytes(rng.randrange(0, 400)), b"[" * 100_000 + b"]" * 100_000,
                                   b"\xff\xfe{}", b'{"format": 1e999999}', b"null", b"[]", b'"x"',
                                   json.dumps({"format": "superkernel.static_kernel.package"}).encode()])
        sign = rng.choice(["user", "user", "other", "none", "keep"])
        members = _with_manifest(_members(base), manifest, sign=sign, rehash=rehash, rng=rng)
        harness.run(f"manifest_{kind}", _zip(members), sample=i % 30 == 0)


def test_declared_sizes_and_signatures(harness):
    rng = random.Random(SEED + 3)
    base = harness.base
    raw = harness.base["raw"]
    for i in range(60):  # the central directory claims a huge uncompressed size for one member
        data = bytearray(raw)
        cd = data.rfind(b"PK\x01\x02", 0, len(data) - 22)
        offsets = [m for m in range(len(data)) if data[m:m + 4] == b"PK\x01\x02"]
        at = rng.choice(offsets or [cd])
        data[at + 24:at + 28] = rng.choice([0xFFFFFFFF, 2 ** 31, 10 ** 9 + rng.randrange(1000)]).to_bytes(4, "little")
        harness.run("cd_size", bytes(data))
    for i in range(60):
        signature = rng.choice([b"", b"0" * 64, rng.randbytes(32).hex().encode(), rng.randbytes(64),
                                "\u00e9".encode() * 10, b"x" * 1000])
        members = [(n, signature if n == SIGNATURE else d, a, f) for n, d, a, f in _members(base)]
        if rng.random() < 0.3:
            members = [m for m in members if m[0] != SIGNATURE]
        harness.run("signature", _zip(members), sample=i % 20 == 0)


def test_planted_payloads_never_run(harness):
    """Pickles and libraries planted as frames, artifacts and kernels: refused unless this user signs them."""
    rng = random.Random(SEED + 4)
    base = harness.base
    names = [n for n, _ in base["members"] if n not in (MANIFEST, SIGNATURE)]
    for i in range(80):
        members = _members(base)
        target = rng.choice(names + ["kernels/ab/cabcdefghij.so", "frames/0123456789abcdef.bin"])
        payload = base["so"] if target.startswith("kernels/") else base["pickle"]
        members = [m for m in members if m[0] != target] + [(target, payload, None, 0)]
        manifest = json.loads(dict(base["members"])[MANIFEST])
        sign = rng.choice(["keep", "other", "none"])
        outcome = harness.run("payload", _zip(_with_manifest(members, manifest, sign=sign, rehash=True, rng=rng)),
                              sample=i % 10 == 0)
        assert outcome == "refused"


def test_zip_bombs_are_refused_or_streamed(base, tmp_path, monkeypatch):
    """A small zip declaring a huge member: over the limit it is refused from the central directory, before
    anything is decompressed; within it, ``--list`` hashes it in chunks without holding it in memory."""
    import tracemalloc

    import superkernel.static_kernel.package as package_mod
    from superkernel.tools.static_compile import list_packages

    bomb = b"\0" * (48 << 20)
    members = [m for m in _members(base) if not m[0].startswith("frames/")]
    members.append(("kernels/zz/c0123456789bomb.so", bomb, None, 0))
    manifest = json.loads(dict(base["members"])[MANIFEST])
    data = _zip(_with_manifest(members, manifest, sign="none", rehash=True, rng=random.Random(0)), stored=False)
    assert len(data) < (1 << 20)
    harness = Harness(tmp_path, base)
    harness.pkg.parent.mkdir(parents=True)
    harness.pkg.write_bytes(data)
    tracemalloc.start()
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert list_packages(harness.build) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "NOT trusted" in out.getvalue() and peak < (8 << 20), peak
    monkeypatch.setattr(package_mod, "MAX_MEMBER_BYTES", 1 << 20)
    monkeypatch.setattr(zipfile.ZipExtFile, "read", lambda *a, **k: pytest.fail("decompressed"))
    with pytest.raises(PackageError, match=r"kernels/zz/c0123456789bomb.so' is 50331648 bytes \(limit 1048576\)"):
        read_manifest(harness.pkg)


def test_enough_cases_ran():
    """(Runs last.) At least 1000 cases when the whole module ran, and signed mutations reached the deep checks."""
    total = sum(COUNTS.values())
    print(f"\npackage fuzz cases: {total} ({', '.join(f'{k} {v}' for k, v in sorted(COUNTS.items()))})")
    print("refusals by first words: " + ", ".join(f"{k!r} {v}" for k, v in REASONS.most_common(25)))
    families = {k.split(":")[0] for k in COUNTS}
    if not {"byte_flip", "member_flip", "manifest_set", "signature", "payload"} <= families:
        pytest.skip("only part of the module ran")
    assert total >= 1000
    assert COUNTS["clean:loaded"] == 1 and COUNTS["payload:loaded"] == 0
