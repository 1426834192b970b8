"""Command line: help for every flag, one-line errors for bad inputs, static-compile registration."""

from __future__ import annotations

import re
import subprocess
import sys
import types

import pytest

from superkernel.tools import cli

from .wf_helpers import error_lines, run_cli


def _flags(parser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")}


@pytest.mark.parametrize("command", ["optimize", "analyze", "bench"])
def test_help_explains_every_flag(command):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[command]
    for action in sub._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 15, f"{command} {action.option_strings} has no help"
    text = run_cli(command, "--help").out
    for flag in _flags(sub):
        assert flag in text


def test_optimize_defaults_give_the_demo():
    args = cli.build_parser().parse_args(["optimize"])
    assert (args.model, args.strategy, args.mode, str(args.output)) == ("llama-tiny", "auto", "both", "superkernel_out")


def test_python_dash_m_runs_the_cli():
    proc = subprocess.run([sys.executable, "-m", "superkernel", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for command in ("optimize", "analyze", "bench"):
        assert command in proc.stdout


@pytest.mark.parametrize("argv, code", [
    (["--help"], 0), (["optimize", "--help"], 0), (["static-compile", "--help"], 0),
    (["optimize", "--strategy", "fastest"], 2), (["optimize", "--strategy", "mlp", "--search", "predicted"], 2),
    (["bench", "--config", "x.yaml", "--mode", "both"], 2), (["analyze", "--batch-size", "0"], 2),
    (["static-compile"], 2),
])
def test_help_and_argument_errors_import_no_torch(argv, code):
    """The parser and the checks before any work import neither torch nor transformers (they take seconds)."""
    script = ("import sys; from superkernel.tools.cli import main; rc = main(sys.argv[1:]); "
              "sys.stdout.flush(); print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules)); "
              "sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.splitlines()[-1] == "HEAVY []"


def test_static_compile_is_registered_when_available(monkeypatch):
    seen = {}

    def register(subparsers):
        p = subparsers.add_parser("static-compile", help="fake")
        p.set_defaults(func=lambda args: seen.setdefault("ran", 7))
        return p

    fake = types.ModuleType("superkernel.tools.static_compile")
    fake.register = register
    monkeypatch.setitem(sys.modules, "superkernel.tools.static_compile", fake)
    import superkernel.tools as tools_pkg

    monkeypatch.setattr(tools_pkg, "static_compile", fake, raising=False)  # `from superkernel.tools import ...` reads it
    import superkernel.static_kernel as pkg

    monkeypatch.setattr(pkg, "cli", fake, raising=False)
    assert cli.main(["static-compile"]) == 7 and seen["ran"] == 7


@pytest.mark.parametrize("argv, needle", [
    (["optimize", "--model", "gpt-17"], r"unknown model 'gpt-17'.*llama-tiny.*qwen3-moe-tiny.*deepseek-v3-tiny"),
    (["optimize", "--strategy", "fastest"], r"unknown strategy 'fastest'; choose one of: attention, mlp, moe, "
                                            r"decoder_layer, all_layers, custom, auto"),
    (["optimize", "--mode", "turbo"], r"unknown mode 'turbo'"),
    (["optimize", "--steps", "0"], r"--steps must be >= 1"),
    (["optimize", "--options", "stream-fusion=7"], r"invalid value '7' for scope option 'stream-fusion'"),
    (["optimize", "--strategy", "custom"], r"needs scopes"),
    (["optimize", "--scope", "a=model.layers.*"], r"add --strategy custom"),
    (["optimize", "--strategy", "moe"], r"strategy 'moe' does not apply to LlamaForCausalLM: no MoE blocks"),
    (["optimize", "--strategy", "custom", "--scope", "x=model.layerz.*.self_attn"],
     r"module glob 'model.layerz.\*.self_attn' matches no submodule"),
    (["bench", "--config", "/nonexistent/superkernel.yaml"], r"plan file .* does not exist"),
    (["analyze", "--model", "./no/such/dir"], r"checkpoint directory .* does not exist"),
])
def test_bad_inputs_are_one_clear_line(argv, needle, tmp_path):
    result = run_cli(*argv, "--output", str(tmp_path)) if argv[0] == "optimize" else run_cli(*argv)
    assert result.code == 2
    lines = error_lines(result.err)
    assert len(lines) == 1, result.err
    assert lines[0].startswith("superkernel") and "error:" in lines[0]
    assert re.search(needle, lines[0]), lines[0]
    assert "Traceback" not in result.err
    assert not (tmp_path / "superkernel_optimization_report.md").exists()


def test_empty_checkpoint_dir_is_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("optimize", "--model", str(empty), "--output", str(tmp_path / "out"))
    assert result.code == 2
    assert error_lines(result.err) == [f"superkernel: error: checkpoint directory {str(empty)!r} has no config.json"]


def test_outputs_never_overwrite_an_input(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    scopes = out / "superkernel.yaml"
    scopes.write_text("attention: model.layers.*.self_attn\n")
    result = run_cli("optimize", "--strategy", "custom", "--scopes-file", str(scopes), "--mode", "reduce-overhead",
                     "--steps", "1", "--warmup", "1", "--prompt-len", "2", "--output", str(out), "--quiet")
    assert result.code == 2
    assert "refusing to write" in result.err and "input of this run" in result.err
    assert scopes.read_text() == "attention: model.layers.*.self_attn\n"


def test_malformed_scopes_file(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("attention: [unclosed\n")
    result = run_cli("optimize", "--strategy", "custom", "--scopes-file", str(bad), "--output", str(tmp_path))
    assert result.code == 2 and len(error_lines(result.err)) == 1 and "--scopes-file" in result.err


def test_model_without_static_cache_support_exits_one(monkeypatch, tmp_path):
    from superkernel.tools.advisor import workflow

    def no_static_cache(*args, **kwargs):
        raise NotImplementedError("this cache layout is not supported")

    monkeypatch.setattr(workflow, "prepare", no_static_cache)
    result = run_cli("optimize", "--output", str(tmp_path), "--quiet")
    assert result.code == 1
    assert error_lines(result.err) == ["superkernel: error: llama-tiny (LlamaForCausalLM) cannot decode with a "
                                       "preallocated transformers StaticCache: NotImplementedError: this cache layout "
                                       "is not supported"]


def test_non_positive_tolerance_is_rejected(tmp_path):
    result = run_cli("optimize", "--tolerance", "0", "--output", str(tmp_path))
    assert result.code == 2 and error_lines(result.err) == ["superkernel: error: --tolerance must be > 0, got 0.0"]
