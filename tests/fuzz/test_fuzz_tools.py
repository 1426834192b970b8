"""Fuzz: plan YAML files and checkpoint directories given to the superkernel command.

Every generated input ends in a valid result or in the documented clear error
(``PlanFileError`` / ``ModelLoadError``, one line, exit 2 on the command line) -- never
another exception, never a traceback, and never code execution: payloads that would
create a marker file (a YAML ``!!python/object`` tag, a pickle ``__reduce__``, a
``modeling_*.py`` behind ``auto_map``) are planted and the marker must stay absent.
Seeded and bounded (a few seconds).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import string
from pathlib import Path

import pytest
import yaml

from superkernel.tools.advisor.plan_file import PlanFile, PlanFileError, read_plan
from superkernel.tools.models import ModelLoadError, load_model
from superkernel.tools.models.archs import save_checkpoint

SEED = 20261124
VALID_PLAN = {"version": 1, "model": "llama-tiny", "strategy": "attention", "mode": "reduce-overhead",
              "options": "", "scopes": {"attention": ["model.layers.*.self_attn"]}, "measured": {"x": 1}}
JUNK_VALUES = [None, 0, -1, 1.5, True, "", "x", "max-autotune", "reduce-overhead", [], [""], ["a", 3], {}, {"a": []},
               {"a": "m.*"}, {"": "m"}, {3: "m"}, "stream-fusion=1", "stream-fusion=1:stream-fusion=0",
               "strict-scope-check=abort", "colour=red", 10**30, float("nan"), "\x00", "é" * 5]


class Payload:
    """Unpickling (or a YAML python/object tag) would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _mutated_plan(rng: random.Random) -> dict:
    plan = json.loads(json.dumps(VALID_PLAN))
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        key = rng.choice(list(VALID_PLAN) + ["backend", "extra", "Scopes"])
        if op < 0.5:
            plan[key] = rng.choice(JUNK_VALUES)
        elif op < 0.7:
            plan.pop(key, None)
        elif op < 0.85:
            plan["backend"] = rng.choice(["superkernel", "torch.compile", "inductor", None, 1])
            if plan["backend"] == "torch.compile" and rng.random() < 0.5:
                plan["scopes"] = {}
        else:
            plan["scopes"] = {rng.choice(["a", "", "attn"]): rng.choice(JUNK_VALUES)}
    return plan


def _plan_text(rng: random.Random, marker: Path) -> str:
    kind = rng.random()
    if kind < 0.55:
        return yaml.safe_dump(_mutated_plan(rng), sort_keys=False)
    if kind < 0.7:  # broken YAML text
        text = yaml.safe_dump(VALID_PLAN)
        pos = rng.randrange(len(text))
        return text[:pos] + rng.choice(["\t", ":", "- [", "{", "'", "\x00", "&a *a", "\n  - "]) + text[pos:]
    if kind < 0.8:  # arbitrary printable junk
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 200)))
    if kind < 0.9:  # a code-execution attempt through YAML tags
        return (f"version: 1\nmode: reduce-overhead\nscopes: {{a: m}}\n"
                f"model: !!python/object/apply:builtins.open [{str(marker)!r}, 'w']\n")
    # a top-level scalar / list / anchors bomb (small)
    return rng.choice(["3", "[1, 2]", "null", "a: &x [*x]", "~", "'just a string'",
                       "a: &a [1,1]\nb: &b [*a,*a]\nc: &c [*b,*b]\nscopes: *c\nmode: reduce-overhead\n"])


def test_fuzz_plan_files(tmp_path):
    rng = random.Random(SEED)
    marker = tmp_path / "PLAN_PWNED"
    outcomes = {"ok": 0, "error": 0}
    for i in range(400):
        path = tmp_path / f"plan_{i}.yaml"
        data = _plan_text(rng, marker)
        path.write_bytes(data.encode("utf-8", "surrogatepass") if rng.random() < 0.95 else os.urandom(64))
        try:
            plan = read_plan(path)
        except PlanFileError as exc:
            message = str(exc)
            assert message and "\n" not in message.strip() or len(message) < 2000, message
            outcomes["error"] += 1
            continue
        assert isinstance(plan, PlanFile)
        assert plan.backend in ("superkernel", "torch.compile")
        assert isinstance(plan.scopes, dict) and all(isinstance(g, list) for g in plan.scopes.values())
        outcomes["ok"] += 1
    assert not marker.exists()
    assert outcomes["ok"] > 10 and outcomes["error"] > 100, outcomes
    with pytest.raises(PlanFileError, match="does not exist"):
        read_plan(tmp_path / "missing.yaml")
    with pytest.raises(PlanFileError):
        read_plan(tmp_path)  # a directory


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory) -> Path:
    return save_checkpoint("llama", tmp_path_factory.mktemp("fuzz_ckpt") / "base", num_hidden_layers=1)


CONFIG_FIELDS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                 "architectures", "dtype", "torch_dtype", "rope_parameters", "num_key_value_heads", "auto_map",
                 "intermediate_size", "text_config", "max_position_embeddings"]
# small values only: a huge size would make the model allocate gigabytes before failing
CONFIG_VALUES = [None, "", "llama", "gpt2", "not_a_model", "bert", 0, -3, 2, 3, 7, 1.5, True, [], ["x"], {},
                 {"x": 1}, "float16", "bfloat16", "int8", "\x00", "../../etc"]


def _mutate_checkpoint(rng: random.Random, directory: Path, marker: Path) -> str:
    config_path = directory / "config.json"
    weights = sorted(directory.glob("*.safetensors"))
    kind = rng.choice(["config_field", "config_field", "config_bytes", "config_missing", "weights_missing",
                       "weights_flip", "weights_truncate", "pickle_only", "pickle_beside", "auto_map", "extra_py",
                       "weights_empty", "config_not_object"])
    if kind == "config_field":
        config = json.loads(config_path.read_text())
        for _ in range(rng.randint(1, 3)):
            field = rng.choice(CONFIG_FIELDS)
            if field == "auto_map":
                continue
            if rng.random() < 0.3:
                config.pop(field, None)
            else:
                config[field] = rng.choice(CONFIG_VALUES)
        config_path.write_text(json.dumps(config))
    elif kind == "config_bytes":
        raw = bytearray(config_path.read_bytes())
        for _ in range(rng.randint(1, 5)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        config_path.write_bytes(bytes(raw[: rng.randint(0, len(raw))]) if rng.random() < 0.5 else bytes(raw))
    elif kind == "config_missing":
        config_path.unlink()
    elif kind == "config_not_object":
        config_path.write_text(rng.choice(["[]", "3", "null", '"llama"', '{"model_type": 3}']))
    elif kind == "weights_missing":
        for w in weights:
            w.unlink()
    elif kind == "weights_empty":
        for w in weights:
            w.write_bytes(b"")
    elif kind == "weights_flip":
        for w in weights:
            raw = bytearray(w.read_bytes())
            for _ in range(rng.randint(1, 8)):  # often in the JSON header (first bytes)
                pos = rng.randrange(min(len(raw), 400)) if rng.random() < 0.7 else rng.randrange(len(raw))
                raw[pos] = rng.randrange(256)
            w.write_bytes(bytes(raw))
    elif kind == "weights_truncate":
        for w in weights:
            raw = w.read_bytes()
            w.write_bytes(raw[: rng.randint(0, len(raw) - 1)])
    elif kind in ("pickle_only", "pickle_beside"):
        if kind == "pickle_only":
            for w in weights:
                w.unlink()
        (directory / rng.choice(["pytorch_model.bin", "model.pt", "weights.bin"])).write_bytes(
            pickle.dumps({"model.embed_tokens.weight": Payload(marker)}))
    elif kind == "auto_map":
        (directory / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
        config = json.loads(config_path.read_text())
        config["auto_map"] = {"AutoConfig": "modeling_evil.C", "AutoModelForCausalLM": "modeling_evil.M"}
        config_path.write_text(json.dumps(config))
    elif kind == "extra_py":  # Python next to the weights, not referenced: must not run
        (directory / "modeling_llama.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
        (directory / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return kind


def test_fuzz_checkpoint_directories(base_ckpt, tmp_path):
    rng = random.Random(SEED)
    marker = tmp_path / "CKPT_PWNED"
    seen: dict[str, dict[str, int]] = {}
    for i in range(60):
        directory = tmp_path / f"ckpt_{i}"
        shutil.copytree(base_ckpt, directory)
        kind = _mutate_checkpoint(rng, directory, marker)
        counts = seen.setdefault(kind, {"ok": 0, "error": 0})
        try:
            loaded = load_model(str(directory))
        except ModelLoadError as exc:
            message = " ".join(str(exc).split())
            assert message and len(message) < 1200, message
            counts["error"] += 1
        else:
            assert loaded.num_parameters > 0
            counts["ok"] += 1
        assert not marker.exists(), f"case {i} ({kind}) ran planted code"
    for kind in ("config_missing", "weights_missing", "pickle_only", "auto_map"):
        if kind in seen:
            assert seen[kind]["ok"] == 0, (kind, seen[kind])
    assert sum(c["error"] for c in seen.values()) >= 20, seen
    print("checkpoint fuzz outcomes:", seen)


@pytest.mark.parametrize("case", ["auto_map", "pickle_only", "config_bytes", "weights_truncate"])
def test_checkpoint_errors_on_the_command_line_are_one_line_exit_2(base_ckpt, tmp_path, case):
    from tests.workflow.wf_helpers import run_cli

    rng = random.Random(case)
    marker = tmp_path / "CLI_PWNED"
    for attempt in range(5):  # a flipped byte may happen to keep the file valid: retry with another
        directory = tmp_path / f"{case}_{attempt}"
        shutil.copytree(base_ckpt, directory)
        _force(case, rng, directory, marker)
        result = run_cli("analyze", "--model", str(directory), "--prompt-len", "2")
        if result.code != 0:
            break
    lines = [line for line in result.err.splitlines() if line.startswith("superkernel")]
    assert result.code == 2, result.err
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    assert not marker.exists()


def _force(case: str, rng: random.Random, directory: Path, marker: Path) -> None:
    if case == "config_bytes":
        (directory / "config.json").write_bytes(b'{"model_type": "llama", "hidden_size": ')
    elif case == "weights_truncate":
        for w in directory.glob("*.safetensors"):
            w.write_bytes(w.read_bytes()[:100])
    else:
        _mutate_named(case, directory, marker)


def _mutate_named(kind: str, directory: Path, marker: Path) -> None:
    class Fixed(random.Random):
        def choice(self, seq):
            return kind if kind in seq else super().choice(seq)

    _mutate_checkpoint(Fixed(0), directory, marker)
