"""What decided a verdict (`evidence.decision`), as a reader of the report reads it: each rule named by its
threshold's value instead of its constant's name, and the runner-up explanation's distance in words. The JSON
summary keeps the rules' names (docs/analysis.md, "Every rule in one table")."""

from __future__ import annotations

import re

from vlmtrace.analysis import FIT_MARGIN, RULES_TABLE

_RULES = {rule.name: rule for rule in RULES_TABLE}
_NAME = re.compile(r"\b[A-Z][A-Z0-9_]+\b")  # replaced where it is a rule's name only
_TAG = re.compile(r" \(([A-Z][A-Z0-9_]+)\)")  # "… at least 2 × the next stage (SEPARATION)"
# How much worse the runner-up fits, by its information criterion above the best fit's (Kass and Raftery's
# scale for a difference in BIC), largest first.
_DISTANCES = ((10.0, "fits far worse"), (6.0, "fits clearly worse"), (FIT_MARGIN, "fits somewhat worse"))


def rule_value(name: str) -> str:
    """A rule's threshold as the sentence around its name needs it: bytes in bytes, a share in per cent."""
    rule = _RULES[name]
    if rule.unit.startswith("bytes"):  # a threshold is a round number of its unit: 8 MiB, 128 KiB
        size, unit = next(
            (
                (size, unit)
                for size, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))
                if rule.value >= size
            ),
            (1, "B"),
        )
        return f"{rule.value / size:g} {unit}" + rule.unit.removeprefix("bytes")
    if rule.unit.startswith("share"):
        return f"{rule.value:.0%}"
    return f"{rule.value:g}"


def in_words(text: str) -> str:
    """`text` with each rule's name replaced by its value; a name in brackets after its value is dropped."""
    text = _TAG.sub(lambda match: "" if match.group(1) in _RULES else match.group(0), text)
    return _NAME.sub(lambda match: rule_value(match.group(0)) if match.group(0) in _RULES else match.group(0), text)


def runner_up_in_words(runner_up: dict) -> str:
    """`warm-up (saturating), which fits far worse`: the other explanation and how far behind the best it lies."""
    above = runner_up["bic_above_best"]
    distance = next(
        (words for least, words in _DISTANCES if above >= least),
        "fits about as well: a longer run would tell them apart",
    )
    return f"{runner_up['explanation']}, which {distance}"


def decided_in_words(decision: dict) -> str:
    """The report's sentence under a component: what decided its class, the runner-up, the stage and the rate."""
    words = decision.get("decided_by_words")
    parts = [f"Decided by: {words}" if words else f"Decided by {in_words(decision['class'])}"]
    if decision.get("runner_up"):
        parts.append(f"next best explanation: {runner_up_in_words(decision['runner_up'])}")
    parts += [f"stage: {in_words(decision['stage'])}", f"rate: {in_words(decision['rate'])}"]
    return "; ".join(parts) + "."
