"""benchmarks/RESULTS.md and benchmarks/results/: every figure cites a file that exists, every file is cited.

One result file per configuration, overwritten in place (history lives in git), so a file nothing
cites is a run someone forgot, and a link to a missing file is a figure without its source.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RESULTS_PAGE = BENCH / "RESULTS.md"
RESULTS_DIR = BENCH / "results"

#: the pages that may cite a result file
CITING = [RESULTS_PAGE, BENCH / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_NAME_CHAR = r"A-Za-z0-9_.\-"
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_BRACES = re.compile(rf"([{_NAME_CHAR}/]+)\.\{{([a-z0-9,]+)\}}")


def expand_braces(text: str) -> str:
    """``name.{json,md}`` -> ``name.json name.md``, as the pages write a result's two files."""
    return _BRACES.sub(lambda m: " ".join(f"{m.group(1)}.{ext}" for ext in m.group(2).split(",")), text)


def cites(text: str, name: str) -> bool:
    """Whether ``text`` names the file ``name`` as a whole name (``real_width.md`` is not cited by
    ``onnx_real_width.md``), alone, in a path or in a link."""
    return re.search(rf"(?<![{_NAME_CHAR}]){re.escape(name)}(?![{_NAME_CHAR}]|\.[A-Za-z0-9])", text) is not None


def cited_names(texts: list[str], names: list[str]) -> set[str]:
    """The names among ``names`` that some text cites; ``X.json`` is cited with its markdown twin ``X.md``
    (the same result, machine-readable)."""
    cited = {n for n in names if any(cites(t, n) for t in texts)}
    return cited | {n for n in names if n.endswith(".json") and n[: -len(".json")] + ".md" in cited}


def test_the_citation_check_tells_names_apart():
    assert cites("see `onnx_real_width.md`", "onnx_real_width.md")
    assert cites("[x](results/real_width.md)", "real_width.md")
    assert not cites("see onnx_real_width.md", "real_width.md")
    assert not cites("see real_width.md.bak", "real_width.md")
    assert not cites("see real_width_f32.md", "real_width.md")
    text = expand_braces("`benchmarks/results/tp_cpu.{json,md}`")
    assert cites(text, "tp_cpu.json") and cites(text, "tp_cpu.md")
    assert cited_names(["a.md"], ["a.md", "a.json", "b.json"]) == {"a.md", "a.json"}


def test_every_link_of_results_page_points_to_a_file():
    text = RESULTS_PAGE.read_text()
    links = [t for t in _LINK.findall(text) if "://" not in t and not t.startswith("#")]
    assert len(links) > 20, "RESULTS.md should cite its result files as relative links"
    missing = [t for t in links if not (RESULTS_PAGE.parent / t.split("#")[0]).is_file()]
    assert not missing, f"RESULTS.md links to files that do not exist: {missing}"


def test_every_result_file_is_cited():
    names = sorted(p.name for p in RESULTS_DIR.iterdir() if p.is_file())
    texts = [expand_braces(p.read_text()) for p in CITING]
    uncited = sorted(set(names) - cited_names(texts, names))
    assert not uncited, (
        f"result files cited by no page ({', '.join(p.relative_to(ROOT).as_posix() for p in CITING[:2])}, docs/*.md): "
        f"{uncited}; cite each in benchmarks/RESULTS.md, or delete a superseded run (git keeps it)")


def test_result_paths_in_the_benchmark_pages_exist():
    """RESULTS.md and benchmarks/README.md name a file that is there wherever they write ``results/NAME`` as a
    path (a run replaced since is cited as ``NAME at COMMIT``, without the path)."""
    dangling = []
    for page in CITING[:2]:
        for m in re.finditer(rf"results/([{_NAME_CHAR}]+\.(?:md|json|png))", expand_braces(page.read_text())):
            if re.search(r"[A-Z]{3,}", m.group(1)):  # a placeholder: results/NAME.md, onnx_rule_ab_RULE.md
                continue
            if not (RESULTS_DIR / m.group(1)).is_file():
                dangling.append(f"{page.relative_to(ROOT)}: {m.group(0)}")
    assert not dangling, f"paths to result files that do not exist: {dangling}"


def test_readme_links_the_results_page():
    assert "(benchmarks/RESULTS.md)" in (ROOT / "README.md").read_text()
