"""Every number that decides a verdict is an entry of the rules table (analysis/rules.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from vlmtrace.analysis import rules

ANALYSIS = Path(__file__).resolve().parents[2] / "src" / "vlmtrace" / "analysis"
# The modules whose numbers decide a class, a stage, a rate or an outlook.
DECIDING = [
    *sorted((ANALYSIS / "step2_preparing").glob("*.py")),
    *sorted((ANALYSIS / "step3_verdict").glob("*.py")),
    *sorted((ANALYSIS / "step4_outlook").glob("*.py")),
    ANALYSIS / "pipeline.py",
    ANALYSIS / "registry.py",
]
# Numbers that decide nothing: none, one, and two (halves of a run, pairs, a line's two parameters); unit
# constants (nanoseconds in a microsecond, millisecond and second).
ALLOWED_VALUES = {0, 1, 2, 1000, 1_000_000, 1e9}
# Named constants that are not verdict thresholds: how much to show or sample, codes, and bit widths.
ALLOWED_NAMES = {
    "ANCESTOR_DEPTH",  # parent links followed to find a span's request
    "CONTAINER_SAMPLE",  # spans read to tell which stages hold others
    "FRESH_WINDOW_NS",  # a reading this close to a span boundary belongs to it
    "MAX_NESTING",  # spans open inside one another at one time
    "MS",  # nanoseconds in a millisecond
    "SHOWN",  # stages listed in the evidence
    "BYTE_BITS",
    "WORD_BITS",  # bit widths of the packed candidate sets
    "ORIGIN_SAMPLE",
    "ORIGIN_SPAN_END",
    "ORIGIN_SPAN_START",
    "ORIGIN_PROMPT_END",
    "ORIGIN_RESPONSE_END",  # codes
    "TIME_CONSTANT_STEPS",  # the resolution of the saturating fit's grid
    "SHAPE_PARAMETERS",
    "REGIME_PARAMETERS",  # a fitted shape's or regime's parameter count, for the information criterion
    "ROUNDING",  # a spread this small against its running sums is floating-point rounding
}


def _stray_numbers(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    allowed_nodes = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, (ast.Name, ast.Tuple)) for t in node.targets):
            names = {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if names and names <= ALLOWED_NAMES:
                allowed_nodes |= {id(n) for n in ast.walk(node.value)}
    return [
        f"{path.parent.name}/{path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and type(node.value) in (int, float)
        and node.value not in ALLOWED_VALUES
        and id(node) not in allowed_nodes
    ]


def test_no_number_deciding_a_verdict_is_written_outside_the_rules_table():
    assert [stray for path in DECIDING for stray in _stray_numbers(path)] == []


def test_a_number_written_into_a_deciding_module_is_caught(tmp_path: Path):
    written = tmp_path / "leaks.py"
    written.write_text(
        (ANALYSIS / "step3_verdict" / "leaks.py").read_text()
        + "\n\ndef _slowing(first, second):\n    return second < 0.6 * first\n"
    )
    assert [stray.split(": ")[-1] for stray in _stray_numbers(written)] == ["0.6"]


def test_every_rule_has_a_value_a_unit_a_meaning_and_the_run_it_guards_against():
    names = [rule.name for rule in rules.TABLE]
    assert len(names) == len(set(names))
    for rule in rules.TABLE:
        assert getattr(rules, rule.name) == rule.value
        assert rule.unit and rule.means and rule.guards_against


def test_the_minimum_correlation_is_defined_once():
    defined = [path for path in ANALYSIS.rglob("*.py") if "MIN_CORRELATION = " in path.read_text()]
    assert defined == [ANALYSIS / "rules.py"]
