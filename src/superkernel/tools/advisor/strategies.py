"""Scope strategies: which submodules get which scope label.

Each strategy turns a :class:`ModelStructure` into ``{label: [module globs]}`` for
``superkernel.apply_scopes``. ``auto`` considers every strategy that applies to the model
(listed bottom-up, from the smallest scope); ``optimize`` tries them in the order the
profile predicts (:mod:`~superkernel.tools.advisor.search`, docs/workflow.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (structure imports torch: this module stays light for the command line's parser)
    from superkernel.tools.advisor.structure import ModelStructure

#: Every strategy name, in the bottom-up order ``auto`` tries them.
STRATEGY_ORDER = ("attention", "mlp", "moe", "decoder_layer", "all_layers")
STRATEGIES = (*STRATEGY_ORDER, "custom", "auto")

DESCRIPTIONS = {
    "attention": "one scope 'attention' around every attention module (smallest, lowest risk)",
    "mlp": "one scope 'mlp' around every dense MLP (feed-forward) module",
    "moe": "one scope 'moe' around every MoE block (router + experts + shared experts)",
    "decoder_layer": "one scope per decoder layer ('decoder_layer_<i>'): attention + MLP/MoE + norms",
    "all_layers": "one scope 'all_layers' over the whole stack of decoder layers",
    "custom": "your labels -> module globs (--scope LABEL=GLOB or --scopes-file FILE.yaml)",
    "auto": "every strategy that applies (default search: predicted, see --search)",
}

#: ``optimize --search``: which of the strategy's plans are measured, and how their steps are timed.
PREDICTED, ALL, EXHAUSTIVE = "predicted", "all", "exhaustive"
SEARCHES = {
    PREDICTED: "plans in order of the gain the decode-step profile predicts; those that cover too little or cannot "
               "beat the best measured one are skipped; each measured plan is timed again interleaved with plain "
               "torch.compile, the close ones once more with eager and torch.compile at the end (the showdown)",
    ALL: "every plan in every mode, then every plan that passed meets eager and torch.compile in the showdown",
    EXHAUSTIVE: "every plan in every mode, each timed once in its own run, one after another (no interleaved "
                "re-timing)",
}


def default_search(strategy: str) -> str:
    """``predicted`` for ``auto`` (several plans to choose among), ``all`` for one strategy (one plan)."""
    return PREDICTED if strategy == "auto" else ALL


class StrategyError(ValueError):
    """A strategy that is unknown or does not apply to the model."""


@dataclass(frozen=True)
class StrategyChoice:
    """What ``--strategy``, ``--search`` and the custom scopes ask for, checked (:func:`parse_strategy`)."""
    strategy: str
    search: str                                         # a key of SEARCHES
    custom_scopes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def every_plan(self) -> bool:
        """Every plan in every mode is measured (no plan skipped on its prediction)."""
        return self.search != PREDICTED

    @property
    def retimed(self) -> bool:
        """Measured plans stay compiled and are timed again, interleaved with the baselines."""
        return self.search != EXHAUSTIVE


def strategy_name(text: str) -> str:
    """``text`` if it names a strategy, else :class:`StrategyError` listing them."""
    if text not in STRATEGIES:
        raise StrategyError(f"unknown strategy {text!r}; choose one of: {', '.join(STRATEGIES)}")
    return text


def parse_strategy(strategy: str, search: str | None = None,
                   custom_scopes: dict[str, list[str]] | None = None) -> StrategyChoice:
    """The one check of a strategy, its search policy and custom scopes (before any model loads).

    ``search`` None: :func:`default_search`. ``predicted`` chooses among several plans, so it needs ``auto``."""
    strategy_name(strategy)
    search = default_search(strategy) if search is None else search
    if search not in SEARCHES:
        raise StrategyError(f"unknown search {search!r}; choose one of: {', '.join(SEARCHES)}")
    if search == PREDICTED and strategy != "auto":
        raise StrategyError(f"--search {PREDICTED} chooses among the plans of --strategy auto; --strategy {strategy} "
                            f"is one plan: use --search {ALL} or {EXHAUSTIVE}")
    custom_scopes = dict(custom_scopes or {})
    if strategy != "custom" and custom_scopes:
        raise StrategyError("--scope/--scopes-file give scopes for --strategy custom; add --strategy custom")
    if strategy == "custom":
        custom_scopes = custom_plan(custom_scopes).scopes
    return StrategyChoice(strategy, search, custom_scopes)


@dataclass(frozen=True)
class ScopePlan:
    strategy: str
    scopes: dict[str, list[str]]      # label -> module globs

    @property
    def labels(self) -> list[str]:
        return list(self.scopes)

    def describe(self) -> str:
        return "; ".join(f"{label}: {', '.join(globs)}" for label, globs in self.scopes.items())


def compress(paths: list[str], layers_path: str | None, num_layers: int) -> list[str]:
    """``model.layers.0.self_attn`` .. ``model.layers.N.self_attn`` -> ``model.layers.*.self_attn``.

    Only when the paths cover every layer with the same suffix; otherwise the exact paths.
    """
    if not paths or not layers_path:
        return list(paths)
    prefix = layers_path + "."
    suffixes = set()
    indices = set()
    for p in paths:
        if not p.startswith(prefix):
            return list(paths)
        index, _, rest = p[len(prefix):].partition(".")
        indices.add(index)
        suffixes.add(rest)
    if len(suffixes) == 1 and indices == {str(i) for i in range(num_layers)}:
        rest = suffixes.pop()
        return [f"{layers_path}.*" + (f".{rest}" if rest else "")]
    return list(paths)


def applicable(structure: ModelStructure) -> dict[str, str | None]:
    """Strategy -> None when it applies, else the reason it does not."""
    reasons: dict[str, str | None] = {}
    no_layers = "no decoder layer stack found in the module tree"
    reasons["attention"] = None if structure.attention_paths else "no attention modules found"
    reasons["mlp"] = None if structure.mlp_paths else "no dense MLP modules (every feed-forward is MoE)"
    reasons["moe"] = None if structure.moe_paths else "no MoE blocks (dense model)"
    stack = structure.layers or structure.parallel_layers  # a module per layer, or parallel per-layer lists
    reasons["decoder_layer"] = None if stack else no_layers
    reasons["all_layers"] = None if stack else no_layers
    return reasons


def plan_for(strategy: str, structure: ModelStructure) -> ScopePlan:
    """The scopes of one built-in strategy (not ``auto`` or ``custom``: :func:`select_plans`)."""
    if strategy_name(strategy) not in STRATEGY_ORDER:
        raise StrategyError(f"strategy {strategy!r} is not one plan; built-in strategies: {', '.join(STRATEGY_ORDER)}")
    reason = applicable(structure)[strategy]
    if reason:
        raise StrategyError(f"strategy {strategy!r} does not apply to {structure.architecture}: {reason}")
    n, lp = structure.num_layers, structure.layers_path
    if strategy == "attention":
        scopes = {"attention": compress(structure.attention_paths, lp, n)}
    elif strategy == "mlp":
        scopes = {"mlp": compress(structure.mlp_paths, lp, n)}
    elif strategy == "moe":
        scopes = {"moe": compress(structure.moe_paths, lp, n)}
    elif strategy == "decoder_layer" and not structure.layers:
        # No module per layer: layer i's label on entry i of every parallel list (they run in one
        # iteration of the model's layer loop, with its residual glue between them).
        scopes = {f"decoder_layer_{i}": members for i, members in enumerate(structure.parallel_layers)}
    elif strategy == "decoder_layer":
        scopes = {f"decoder_layer_{p.index}": [p.path] for p in structure.layers}
    elif not structure.layers:
        scopes = {"all_layers": [f"{path}.*" for path in structure.parallel_lists]}
    else:
        # The layers run back to back, so one label on each of them is one scope over the stack
        # (the ModuleList itself has no forward to wrap).
        scopes = {"all_layers": compress(structure.layer_paths, lp, n)}
    return ScopePlan(strategy, scopes)


def select_plans(choice: StrategyChoice, structure: ModelStructure) -> list[ScopePlan]:
    """The plans of a checked choice: every applicable one for ``auto``, else the one it names."""
    if choice.strategy == "auto":
        return auto_plans(structure)
    if choice.strategy == "custom":
        return [ScopePlan("custom", choice.custom_scopes)]
    return [plan_for(choice.strategy, structure)]


def auto_plans(structure: ModelStructure) -> list[ScopePlan]:
    """Every strategy that applies, bottom-up from the smallest scope."""
    return [plan_for(s, structure) for s, why in applicable(structure).items() if why is None]


def custom_plan(scopes: dict[str, str | list[str]]) -> ScopePlan:
    if not scopes:
        raise StrategyError("strategy 'custom' needs scopes: --scope LABEL=GLOB (repeatable) or --scopes-file FILE.yaml")
    norm: dict[str, list[str]] = {}
    for label, globs in scopes.items():
        if not isinstance(label, str) or not label.strip():
            raise StrategyError(f"scope labels must be non-empty strings, got {label!r}")
        items = [globs] if isinstance(globs, str) else list(globs) if isinstance(globs, (list, tuple)) else None
        if not items or not all(isinstance(g, str) and g.strip() for g in items):
            raise StrategyError(f"scope {label!r}: expected a module glob or a list of globs, got {globs!r}")
        norm.setdefault(label.strip(), []).extend(g.strip() for g in items)
    return ScopePlan("custom", norm)


def load_scopes_file(path: Path) -> dict[str, list[str]]:
    """Scopes from YAML: ``label: glob`` / ``label: [globs]``, or a superkernel.yaml's ``scopes``."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StrategyError(f"--scopes-file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise StrategyError(f"--scopes-file {path}: {' '.join(str(exc).split())}") from None
    if isinstance(data, dict) and "scopes" in data:
        data = data["scopes"]
    if not isinstance(data, dict):
        raise StrategyError(f"--scopes-file {path}: expected a mapping label -> module glob(s)")
    return custom_plan(data).scopes


def parse_scope_args(values: list[str]) -> dict[str, list[str]]:
    """``["attn=model.layers.*.self_attn", "ffn=a,b"]`` -> ``{"attn": [...], "ffn": ["a", "b"]}``."""
    out: dict[str, list[str]] = {}
    for value in values:
        label, sep, globs = value.partition("=")
        if not sep or not label.strip() or not globs.strip():
            raise StrategyError(f"--scope {value!r}: expected LABEL=GLOB[,GLOB...], e.g. attn=model.layers.*.self_attn")
        out.setdefault(label.strip(), []).extend(g.strip() for g in globs.split(",") if g.strip())
    return out
