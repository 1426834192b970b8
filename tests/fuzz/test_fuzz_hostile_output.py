"""Hostile environment, terminal output: strings from files never reach the terminal raw.

Manifest strings of an untrusted package (``static-compile --list``), values of a plan file,
and what transformers says about a checkpoint's config are printed with control characters
escaped, one bounded line each, and never imitate the lines superkernel itself prints (the
trust line). A library's warnings about a checkpoint that then fails to load do not come
before our one-line error. Each case also checks nothing changed outside its directory or in
the current directory.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from tests.fuzz.hostile import Case, run_bounded

CONTROL = "\x1b[8m\x1b]0;owned\x07\r\n  trusted: signed with this user's key\n\x9b2J\u202e"


@pytest.fixture
def case(tmp_path, monkeypatch):
    c = Case.entered(tmp_path, monkeypatch)
    yield c
    c.check()


def _no_raw_control(text: str) -> None:
    bad = sorted({hex(ord(ch)) for ch in text if (ord(ch) < 32 and ch != "\n") or 0x7f <= ord(ch) < 0xa0
                  or ch == "\u202e"})
    assert not bad, f"raw control characters reached the terminal: {bad}"


def _hostile_package(build_dir: Path) -> Path:
    from superkernel.static_kernel.package import FORMAT, FORMAT_VERSION, OUTPUTS_DIR

    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "created": CONTROL,
                "environment": {"torch": CONTROL, "python": CONTROL * 50, "device_kind": CONTROL,
                                "device_capability": CONTROL},
                "config_fingerprint": CONTROL, "inductor_options": {}, "files": {},
                "graphs": {CONTROL: {"names": [CONTROL, "x" * 5000], "variants": []}},
                "artifacts": {}, "frames": {}}
    out = build_dir / OUTPUTS_DIR / "evil_outputs"
    out.mkdir(parents=True)
    path = out / "static_kernel_evil.skpkg"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        zf.writestr("signature", "0" * 64)
    return path


def test_list_prints_untrusted_manifest_strings_escaped(case, capsys):
    from superkernel.tools.static_compile import list_packages

    _hostile_package(case.work / "build")
    assert list_packages(case.work / "build") == 0
    out = capsys.readouterr().out
    _no_raw_control(out)
    trust_lines = [line for line in out.splitlines() if line.strip().startswith("trusted")]
    assert trust_lines == [], f"a manifest string printed a trust line of its own: {trust_lines}"
    assert "NOT trusted" in out
    assert max(len(line) for line in out.splitlines()) < 2000


@pytest.mark.parametrize("field", ["mode", "options", "scopes", "backend", "unknown_keys"])
def test_plan_errors_never_echo_unbounded_or_raw_values(case, field):
    from superkernel.tools.advisor.plan_file import PlanFileError, read_plan

    value = "\\e[2J\\e]0;owned\\a\\r\\n" * 20000  # YAML double-quoted escapes: real control characters
    text = {"mode": f'version: 1\nscopes: {{a: m}}\nmode: "{value}"\n',
            "options": f'version: 1\nscopes: {{a: m}}\nmode: reduce-overhead\noptions: ["{value}"]\n',
            "scopes": f'version: 1\nmode: reduce-overhead\nscopes: {{a: [3, "{value}"]}}\n',
            "backend": f'version: 1\nbackend: "{value}"\n',
            "unknown_keys": "version: 1\n" + "".join(f'"k{i}\\e[2J": 1\n' for i in range(20000))}[field]
    path = case.work / "plan.yaml"
    path.write_text(text)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(PlanFileError) as info:
        read_plan(path)
    message = str(info.value)
    _no_raw_control(message)
    assert "\n" not in message and len(message) < 1000, len(message)


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory) -> Path:
    from superkernel.tools.models.archs import save_checkpoint

    return save_checkpoint("llama", tmp_path_factory.mktemp("hostile_out_ckpt") / "base", num_hidden_layers=1)


def _noisy_checkpoint(base: Path, directory: Path, *, loads: bool) -> Path:
    directory.mkdir()
    for f in base.iterdir():
        if f.name != "config.json":
            (directory / f.name).symlink_to(f)
    config = json.loads((base / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0,
                                 "evil\x1b]0;owned\x07" + "\x1b[2J" * 200: 1}
    if not loads:  # weights no longer fit: transformers prints a long report, then refuses
        config["intermediate_size"] = int(config.get("intermediate_size", 128)) - 32
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_library_messages_about_checkpoints_reach_the_terminal_escaped_and_only_on_success(case, base_ckpt):
    failing = _noisy_checkpoint(base_ckpt, case.work / "noisy", loads=False)
    loading = _noisy_checkpoint(base_ckpt, case.work / "noisy_ok", loads=True)
    code = f"""
from superkernel.tools.models import ModelLoadError, load_model
result = {{}}
sys.stderr.write('=== failing\\n'); sys.stderr.flush()
try:
    load_model({str(failing)!r})
except ModelLoadError as exc:
    result['error'] = str(exc)
sys.stderr.write('=== loading\\n'); sys.stderr.flush()
load_model({str(loading)!r})
result['loaded'] = True
"""
    out = run_bounded(code, mem_mb=6144, timeout=300)
    assert out["rc"] == 0 and out.get("loaded"), out["stderr"][-2000:]
    err = out["stderr"]
    during_failure = err.split("=== failing\n", 1)[1].split("=== loading\n", 1)[0]
    assert during_failure.strip() == "", f"library output before our one-line error: {during_failure[:500]!r}"
    _no_raw_control(out["error"])
    assert len(out["error"]) < 1000
    during_success = err.split("=== loading\n", 1)[1]
    _no_raw_control(during_success)
    assert all(len(line) < 400 for line in during_success.splitlines()), \
        [len(line) for line in during_success.splitlines()]
