"""``superkernel static-compile``: build a static kernel package, list or clean packages.

::

    superkernel static-compile --model llama-tiny --build-dir DIR [--config superkernel.yaml] [--batch-sizes 1,2,4]
    superkernel static-compile --list DIR      # packages, what they hold, whether they match and are trusted
    superkernel static-compile --trust PACKAGE # show a package, then sign it with this user's key
    superkernel static-compile --clean DIR     # remove packages, records and build leftovers

The build loads the model (``superkernel.tools.models.load_model``), applies the plan's scopes
and mode when ``--config`` is given, compiles the decode step with the superkernel
backend (static kernels enabled) once per batch size, runs one warm-up step each (which
records every operator's shapes and compiles every partition ahead of time) and writes
one package. A later process that compiles the same decode step with static kernels
enabled and the same build dir loads the package instead of compiling.

The graphs must be the ones the deployment will run: same model, same plan, same
decode-step function (``superkernel.tools.decode``'s), same KV-cache length
(``--prompt-len`` + 36 by default, as ``superkernel.tools.decode.prepare``) and batch sizes.

Packages are code: a process loads only packages signed with this user's key (every build
signs its package). ``--trust`` is how a person vouches for one built elsewhere (another
user, another machine, a copy that was signed with another key): it checks the package's
integrity, prints what it holds and who built it, and signs it (docs/static_kernel.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# (superkernel.static_kernel imports torch: it is imported where a command needs it, so that the
# parser, --help and argument errors stay fast)
from superkernel.tools.static_session import (  # noqa: F401 - (decode_session, batch_inputs: also used from here)
    batch_inputs, build_config, check_cache_len, check_plan, decode_session,
)
from superkernel.util import positive_int, remove_tree, safe_text


def _batch_sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch-sizes must be comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--batch-sizes must be comma-separated positive integers, got {text!r}")
    return sorted(set(values))


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group()
    what.add_argument("--list", type=Path, metavar="DIR", dest="list_dir",
                      help="show the packages in DIR, what they hold, whether they match this machine and whether "
                           "they are trusted")
    what.add_argument("--clean", type=Path, metavar="DIR", dest="clean_dir",
                      help="remove the packages, shape records and build leftovers in DIR")
    what.add_argument("--trust", type=Path, metavar="PACKAGE", dest="trust_pkg",
                      help="check PACKAGE's integrity, show what it holds and who built it, and sign it with this "
                           "user's key so that it loads (run this only for packages you decided to trust)")
    p.add_argument("--model", default=None, metavar="NAME|PATH",
                   help="zoo model (e.g. llama-tiny) or a local Hugging Face checkpoint directory")
    p.add_argument("--config", type=Path, default=None, metavar="FILE.yaml",
                   help="a plan written by superkernel optimize (superkernel.yaml): its scopes and mode are applied")
    p.add_argument("--build-dir", type=Path, default=None, metavar="DIR",
                   help="where records and the package go (must exist and be writable)")
    p.add_argument("--batch-sizes", type=_batch_sizes, default=None, metavar="1,2,4",
                   help="build one static variant per batch size (default 1)")
    p.add_argument("--mode", default=None, choices=("max-autotune", "reduce-overhead"),
                   help="override the plan's mode (static kernels are built for max-autotune partitions; "
                        "reduce-overhead on CPU packages the native CPU modules)")
    p.add_argument("--prompt-len", type=positive_int("--prompt-len"), default=32, help="prompt tokens prefilled before decoding (default 32)")
    p.add_argument("--max-cache-len", type=positive_int("--max-cache-len"), default=None,
                   help="KV-cache length of the decode step (default prompt-len + 36, as superkernel.tools.decode.prepare)")
    p.add_argument("--seed", type=int, default=0, help="seed of zoo weights and prompt (default 0)")
    p.add_argument("--device", default="auto", metavar="auto|cpu|cuda[:N]",
                   help="where the package's kernels run; auto = cuda when available, else cpu (default auto). "
                        "A package holds one device kind: a CUDA process never loads a CPU package, nor the "
                        "reverse")
    p.add_argument("--threads", type=positive_int("--threads"), default=None,
                   help="torch CPU threads while building (default: torch's default); precompiled frames are "
                        "used by processes with the same thread count")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--nproc", type=positive_int("--nproc"), default=None, metavar="N",
                   help="build for a tensor-parallel job of N ranks on this node (the model sharded by its plan; "
                        "one builder per node, every rank then loads the package); under torchrun the command "
                        "joins the job (docs/distributed.md)")
    p.add_argument("--tp-plan", type=Path, default=None, metavar="FILE",
                   help="with --nproc: tensor-parallel plan {module or parameter glob: style} (default: the "
                        "model's transformers tp_plan)")
    p.add_argument("--rebuild", action="store_true",
                   help="build a new package even when the build dir holds one for another world size (without "
                        "it that is an error naming both sizes)")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``static-compile`` subcommand to the main ``superkernel`` parser."""
    p = subparsers.add_parser(
        "static-compile", help="record shapes and build every kernel ahead of time into a package",
        description="Static kernel compilation: run the decode step once per batch size with static kernels "
                    "enabled, record every operator's shapes, compile every partition ahead of time and write "
                    "one package (static_kernel_<datetime>.skpkg) that later processes load instead of compiling.")
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    listing = any(getattr(args, k, None) is not None for k in ("list_dir", "clean_dir", "trust_pkg"))
    if not listing and (not args.model or args.build_dir is None):
        print("superkernel static-compile: error: --model and --build-dir are required to build "
              "(or use --list DIR / --trust PACKAGE / --clean DIR)", file=sys.stderr)
        return 2
    from superkernel.static_kernel.package import PackageError
    from superkernel.userkey import TrustError

    try:
        if getattr(args, "list_dir", None) is not None:
            return list_packages(args.list_dir, as_json=args.json)
        if getattr(args, "clean_dir", None) is not None:
            return clean(args.clean_dir)
        if getattr(args, "trust_pkg", None) is not None:
            return trust_package(args.trust_pkg)
        if args.rebuild:
            from superkernel.static_kernel.settings import ENV_REBUILD

            os.environ[ENV_REBUILD] = "1"  # (ranks started by --nproc inherit it)
        from superkernel.tools.distributed.launcher import in_job

        if args.nproc is not None or in_job():
            from superkernel.tools.distributed.nproc import static_compile

            return static_compile(args)
        if args.tp_plan is not None:
            raise ValueError("--tp-plan needs --nproc N (or a torchrun job)")
        if args.config is not None:  # a bad plan is rejected before the model is loaded
            from superkernel.tools.advisor.plan_file import read_plan

            read_plan(args.config)
        if args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        from superkernel.tools.advisor.environment import pick_device

        device = str(pick_device(args.device))  # a CUDA request on a machine without one: an error, before loading
        result = build(args.model, args.build_dir, batch_sizes=args.batch_sizes, plan=args.config, mode=args.mode,
                       prompt_len=args.prompt_len, max_cache_len=args.max_cache_len, seed=args.seed, device=device)
    except (ValueError, OSError, PackageError, TrustError) as exc:
        print(f"superkernel static-compile: error: {safe_text(' '.join(str(exc).split()), 600)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        c = result["counters"]
        print(f"package: {result['package'] or '(none written: nothing new to build)'}")
        print(f"batch sizes {result['batch_sizes']}: {c.get('compiled', 0)} partitions compiled, "
              f"{c.get('loaded', 0)} loaded from an existing package, {c.get('frames_built', 0)} precompiled "
              f"frames, {c.get('native_built', 0)} native CPU modules built, {c.get('native_loaded', 0)} loaded, "
              f"{c.get('records', 0)} shape records "
              f"in {', '.join(result['record_dirs']) or '-'} ({result['seconds']:.1f}s)")
        for notice in result.get("notices", []):
            print(f"  {notice}")
    return 0 if result["package"] or result["counters"].get("loaded") or result["counters"].get("native_loaded") else 1


# --- build -------------------------------------------------------------------------------

def build(model: str, build_dir: Path, *, batch_sizes: list[int] | None = None, plan: Path | None = None,
          mode: str | None = None, prompt_len: int = 32, max_cache_len: int | None = None, seed: int = 0,
          device: str = "cpu", compiler_config: Any = None) -> dict[str, Any]:
    """Build (or extend) the package in ``build_dir`` for ``model``'s decode step; returns a summary.

    ``compiler_config`` (optional) is the configuration to build for (copied; static kernels
    are switched on); its ``static_kernel.batch_sizes`` apply when ``batch_sizes`` is not given.
    """
    import torch

    import superkernel
    from superkernel.pipeline.backend import find_backend
    from superkernel.tools.models import load_model

    from superkernel.static_kernel.package import find_packages
    from superkernel.static_kernel.settings import resolve_build_dir
    from superkernel.static_kernel.store import check_layout

    start = time.perf_counter()
    build_dir = resolve_build_dir(build_dir)
    check_plan(plan)  # a bad plan is rejected before the model is loaded
    cfg, _ = build_config(None, build_dir, batch_sizes=batch_sizes, plan=plan, mode=mode,
                          compiler_config=compiler_config)
    check_layout(cfg, build_dir, device)  # a package for another world size: an error before anything loads
    loaded = load_model(model, seed=seed, device=device)
    cfg, sizes = build_config(loaded.model, build_dir, batch_sizes=batch_sizes, plan=plan, mode=mode,
                              compiler_config=compiler_config)
    cache_len = max_cache_len or prompt_len + 36

    results: dict[str, Any] = {"model": model, "batch_sizes": sizes, "build_dir": str(build_dir), "package": None,
                               "counters": {}, "record_dirs": [], "notices": []}
    packages: list[str] = []
    counters: dict[str, int] = {}
    for batch in sizes:
        session = decode_session(loaded.model, batch=batch, prompt_len=prompt_len, max_cache_len=cache_len,
                                 seed=seed, device=device)
        step = superkernel.compile(session.step_fn(), cfg)
        backend = find_backend(step)
        assert backend.static_kernels.enabled  # (the config enables static kernels)
        backend.static_kernels.extend = True  # build shapes the package lacks instead of falling back
        ids, pos = batch_inputs(session, 0, batch)
        with torch.no_grad():
            step(ids, pos)
        backend.static_kernels.finalize()
        packages += [str(p) for p in backend.static_kernels.packages_written if str(p) not in packages]
        counters = {k: int(v) for k, v in backend.static_kernels.counters.items()}  # cumulative: state is shared
        results["record_dirs"] += [str(d) for d in backend.static_kernels.run_dirs if str(d) not in results["record_dirs"]]
        results["notices"] += [n for n in backend.static_kernels.notices if n not in results["notices"]]
        torch._dynamo.reset()
    existing = find_packages(build_dir)
    alive = [p for p in packages if Path(p).exists()]
    held = counters.get("loaded") or counters.get("native_loaded")
    results["package"] = alive[-1] if alive else (str(existing[0]) if existing and held else None)
    results["counters"] = counters
    results["seconds"] = time.perf_counter() - start
    return results


# --- list / clean --------------------------------------------------------------------------

def list_packages(build_dir: Path, *, as_json: bool = False) -> int:
    from superkernel.static_kernel.environment import environment, environment_mismatch
    from superkernel.static_kernel.package import OUTPUTS_DIR, PackageError, describe, find_packages, read_manifest

    build_dir = Path(build_dir)
    if not build_dir.is_dir():
        print(f"superkernel static-compile: error: {str(build_dir)!r} is not a directory", file=sys.stderr)
        return 2
    rows = []
    for path in find_packages(build_dir):
        row: dict[str, Any] = {"path": str(path)}
        try:
            pkg = read_manifest(path)
            row.update(describe(pkg))
            kind = pkg.manifest.get("environment", {}).get("device_kind", "cpu")

            reason = environment_mismatch(pkg.manifest.get("environment", {}), environment(kind))
            try:
                pkg.verify(keep=False)  # hashes in chunks: an untrusted package's sizes cost no memory
                integrity = "ok"
            except PackageError as exc:
                integrity = str(exc)
            row["integrity"] = integrity
            row["matches_this_machine"] = reason is None and integrity == "ok"
            row["why_not"] = reason or (None if integrity == "ok" else integrity)
        except PackageError as exc:
            row.update({"matches_this_machine": False, "why_not": str(exc), "trusted": False,
                        "untrusted": f"unreadable: {exc}"})
        rows.append(row)
    if as_json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    if not rows:
        print(f"no static kernel packages under {build_dir / OUTPUTS_DIR}")
        return 0
    t = safe_text  # every string below comes from a package file someone else may have written
    for row in rows:
        ok = "matches this machine" if row["matches_this_machine"] else f"does NOT match: {t(row['why_not'], 300)}"
        print(t(row["path"], 4096))
        if "artifacts" in row:
            env = row.get("environment", {}) if isinstance(row.get("environment"), dict) else {}
            graphs = "; ".join(f"{t(h, 10)[:10]} {t(','.join(map(str, g.get('names', []))), 120)} "
                               f"({t(g.get('variants'), 20)} shape variant(s))"
                               for h, g in list(row["graphs"].items())[:20] if isinstance(g, dict))
            print(f"  created {t(row['created'], 40)}  {t(row['artifacts'], 20)} compiled partitions, "
                  f"{t(row.get('frames', 0), 20)} precompiled frames, {t(row['kernels'], 20)} kernel libraries, "
                  f"{t(row.get('native', 0), 20)} native CPU modules, {row['bytes'] / 1e6:.2f} MB")
            print(f"  torch {t(env.get('torch'), 60)}  python {t(env.get('python'), 40)}  {t(env.get('device_kind'), 20)} "
                  f"[{t(env.get('device_capability'), 40)}]  config {t(row.get('config_fingerprint'), 40)}")
            print(f"  graphs: {graphs or '-'}")
        print(f"  {ok} (compiler config is checked when a backend loads it)")
        if row["trusted"]:
            print("  trusted: signed with this user's key")
        elif "artifacts" in row:
            print(f"  NOT trusted ({t(row['untrusted'], 200)}); it is not loaded. If you trust it: "
                  f"superkernel static-compile --trust {t(row['path'], 4096)}")
        else:
            print("  NOT trusted (unreadable); it is not loaded")
    return 0


def trust_package(path: Path) -> int:
    """Show what a package is, check its integrity, and sign it with this user's key."""
    from superkernel.static_kernel.environment import environment, environment_mismatch
    from superkernel.static_kernel.package import OUTPUTS_DIR, describe, read_manifest, resign
    from superkernel.static_kernel.trust import key_path

    path = Path(path)
    if not path.is_file() or path.is_symlink():
        print(f"superkernel static-compile: error: {str(path)!r} is not a package file", file=sys.stderr)
        return 2
    pkg = read_manifest(path)  # PackageError: malformed (one line, exit 2)
    pkg.verify()
    info = describe(pkg)
    m, env = pkg.manifest, info["environment"]
    by = m.get("created_by") if isinstance(m.get("created_by"), dict) else {}
    t = safe_text  # strings from the package's manifest
    print(t(path, 4096))
    print(f"  created {t(info['created'], 40)} by superkernel {t(by.get('superkernel', '?'), 40)} "
          f"(pid {t(by.get('pid', '?'), 20)})")
    print(f"  {t(info['artifacts'], 20)} compiled partitions, {t(info['frames'], 20)} precompiled frames, "
          f"{t(info['kernels'], 20)} kernel libraries, {t(info['native'], 20)} native CPU modules, "
          f"{info['bytes'] / 1e6:.2f} MB; manifest sha256 {__import__('hashlib').sha256(pkg.manifest_bytes).hexdigest()[:16]}")
    print(f"  built for torch {t(env.get('torch'), 60)}  python {t(env.get('python'), 40)}  {t(env.get('system'), 40)} "
          f"{t(env.get('machine'), 40)}  {t(env.get('device_kind'), 20)} [{t(env.get('device_capability'), 40)}]")
    reason = environment_mismatch(env, environment(str(env.get("device_kind") or "cpu")))
    if reason:
        print(f"  note: it does not match this machine ({safe_text(reason, 300)}); it will be ignored until it does")
    if pkg.trusted:
        print("  already trusted (signed with this user's key)")
        return 0
    print(f"  was not trusted: {safe_text(pkg.untrusted, 300)}")
    resign(pkg)
    print(f"  trusted now: signed with this user's key ({key_path()}); processes of this user load it")
    if not (path.name.startswith("static_kernel_") and path.name.endswith(".skpkg")):
        print("  note: backends only find packages named static_kernel_*.skpkg under "
              f"<build_dir>/{OUTPUTS_DIR}/*/; rename or move it there")
    return 0


def clean(build_dir: Path) -> int:
    """Remove the packages and output folders under ``build_dir`` — never through a symlink: a linked build
    dir, outputs folder or output folder is refused or skipped, and trees are removed without following links."""
    from superkernel.static_kernel.package import OUTPUTS_DIR

    build_dir = Path(build_dir)
    root = build_dir / OUTPUTS_DIR
    for path in (build_dir, root):
        if path.is_symlink():
            print(f"superkernel static-compile: error: {safe_text(path)} is a symbolic link; --clean never deletes "
                  "through a link (give the real directory)", file=sys.stderr)
            return 2
    if not root.is_dir():
        print(f"nothing to clean: {safe_text(root)} does not exist")
        return 0
    from superkernel.static_kernel.lock import build_lock

    lock = build_lock(root)
    try:
        lock.acquire(timeout=0.5)
    except Exception:  # noqa: BLE001 - filelock.Timeout
        print(f"superkernel static-compile: error: a build is running in {safe_text(root)}; try again when it ends",
              file=sys.stderr)
        return 2
    removed_pkgs = 0
    removed_dirs = 0
    skipped = []
    try:
        for child in sorted(root.iterdir()):
            if not child.name.endswith("_outputs"):
                continue
            if child.is_symlink() or not child.is_dir():
                skipped.append(child.name)
                continue
            removed_pkgs += len([p for p in child.glob("static_kernel_*.skpkg") if not p.is_symlink()])
            if remove_tree(child):
                removed_dirs += 1
    finally:
        lock.release()
    try:
        os.unlink(root / ".build.lock")
        root.rmdir()
    except OSError:
        pass
    print(f"removed {removed_pkgs} package(s) and {removed_dirs} output folder(s) from {safe_text(root)}")
    if skipped:
        print(f"  left {len(skipped)} symbolic link(s) alone: {safe_text(', '.join(skipped))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="superkernel static-compile")
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = ["static-compile", *(argv if argv is not None else sys.argv[1:])]  # (--nproc: the ranks' command)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
