"""Fuzz: scope option strings and CompilerConfig dicts.

Every generated input ends in a valid result or in the documented clear error
(ValueError / TypeError / AttributeError whose message names the offending key or
value and what is allowed) -- never another exception type. Seeded and bounded.
"""

from __future__ import annotations

import random
import string

import pytest

import superkernel as sk
from superkernel.ir.graph import OPTION_VALUES

SEED = 20261123
KEYS = list(OPTION_VALUES) + ["stream_fusion", "Stream-Fusion", "strict-scope", "", "x", "stream-fusion ", "é"]
VALUES = [v for vs in OPTION_VALUES.values() for v in vs] + ["", "2", "true", "ABORT", " 1", "1 ", "=", "None", "\x00"]


def _option_string(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 4)):
        shape = rng.random()
        if shape < 0.6:
            parts.append(f"{rng.choice(KEYS)}={rng.choice(VALUES)}")
        elif shape < 0.8:
            parts.append(rng.choice(KEYS))
        else:
            parts.append("".join(rng.choice(string.printable) for _ in range(rng.randint(0, 8))))
    return rng.choice([":", "::", ": ", ";"]).join(parts)


def _expected(text: str) -> sk.ScopeOptions | None:
    """Reference parse: None where the string must be rejected."""
    values = {k: v[0] for k, v in OPTION_VALUES.items()}
    seen = set()
    for part in text.split(":"):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            return None
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in OPTION_VALUES or value not in OPTION_VALUES[key] or key in seen:
            return None
        seen.add(key)
        values[key] = value
    return sk.ScopeOptions(values["stream-fusion"] == "1", values["strict-scope-check"])


def test_fuzz_scope_option_strings() -> None:
    rng = random.Random(SEED)
    accepted = rejected = 0
    for _ in range(800):
        text = _option_string(rng)
        want = _expected(text)
        try:
            got = sk.parse_options(text)
            sk.super_kernel("s", text)  # the public entry validates the same way
        except ValueError as exc:
            assert want is None, f"{text!r} rejected: {exc}"
            message = str(exc)
            assert "allowed" in message or "twice" in message, message
            rejected += 1
            continue
        assert want is not None and got == want, f"{text!r} accepted as {got}, expected rejection or {want}"
        accepted += 1
    assert accepted > 50 and rejected > 50  # both outcomes are exercised


@pytest.mark.parametrize("bad", [1, 1.5, b"stream-fusion=1", ["stream-fusion=1"], {"stream-fusion": "1"}])
def test_scope_options_of_wrong_type(bad) -> None:
    with pytest.raises(TypeError, match="scope options must be a string"):
        sk.super_kernel("s", bad)


def test_duplicate_scope_option_keys_are_rejected() -> None:
    with pytest.raises(ValueError, match="given twice"):
        sk.super_kernel("s", "stream-fusion=1:stream-fusion=0")


# --- CompilerConfig ---------------------------------------------------------------------

def _schema(section) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, field in section._fields.items():
        out[name] = field
    for name, cls in section._sections.items():
        out[name] = _schema(cls)
    return out


SCHEMA = _schema(sk.CompilerConfig)
JUNK = [None, True, False, 0, 1, -3, 2.5, float("nan"), "", "txt", "py", "reduce-overhead", "max-autotune",
        "MAX-AUTOTUNE", "/nonexistent/dir", [], [1, 2], [True], [0], [1.0], ["1"], (4,), {}, {"a": 1}, {1: 2},
        b"bytes", object()]


def _config_dict(rng: random.Random, schema: dict[str, object], depth: int = 0) -> dict[object, object]:
    out: dict[object, object] = {}
    for name, item in schema.items():
        if rng.random() < 0.5:
            continue
        if isinstance(item, dict) and rng.random() < 0.8:
            out[name] = _config_dict(rng, item, depth + 1)
        elif hasattr(item, "default") and rng.random() < 0.4:
            out[name] = item.default
        else:
            out[name] = rng.choice(JUNK)
    if rng.random() < 0.15:
        out[rng.choice(["unknown", "Mode", "debug_", 3, None])] = rng.choice(JUNK)
    return out


def test_fuzz_compiler_config_dicts() -> None:
    rng = random.Random(SEED + 1)
    accepted = rejected = 0
    for _ in range(700):
        values = _config_dict(rng, SCHEMA) if rng.random() < 0.95 else rng.choice(JUNK)
        try:
            cfg = sk.CompilerConfig.from_dict(values)
        except (ValueError, TypeError, AttributeError) as exc:
            message = str(exc)
            assert message and "\n" not in message, repr(message)
            assert "config" in message or "allowed" in message or "must be" in message, message
            rejected += 1
            continue
        # what was accepted round-trips and is one of the allowed values
        again = sk.CompilerConfig.from_dict(cfg.to_dict())
        assert again == cfg
        assert cfg.mode in ("reduce-overhead", "max-autotune")
        assert all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                   for b in cfg.experimental_config.static_kernel.batch_sizes)
        accepted += 1
    assert accepted > 20 and rejected > 100


@pytest.mark.parametrize("values, match", [
    ({"experimental_config": {"static_kernel": {"batch_sizes": [True]}}}, "positive integers"),
    ({"mode": True}, "allowed values"),
    ({"debug": {"graph_dump": {"type": 1}}}, "allowed values"),
    ({1: "x"}, "keys must be field names"),
    ({"debug": 3}, "must be a mapping"),
])
def test_config_errors_name_the_problem(values, match) -> None:
    with pytest.raises((ValueError, TypeError, AttributeError), match=match):
        sk.CompilerConfig.from_dict(values)
