"""The class of a verdict decided by one ordered list of rules (class_rules.py): the first rule whose test
holds decides, each names its outcome, and says it in words the report shows and in rules.py's names the
JSON keeps."""

from __future__ import annotations

import dataclasses
import re

import pytest

from vlmtrace.analysis import rules
from vlmtrace.analysis.registry import BELOW_THRESHOLD, INCONCLUSIVE, NO_GROWTH
from vlmtrace.analysis.step3_verdict import class_rules as cr
from vlmtrace.analysis.step3_verdict import explanations as ex

STEADY = cr.Evidence(grows=True, rises=True, plateau_reason=None, unsteady=None, unsteady_by=None)


def test_every_rule_has_its_own_name_and_the_last_decides_whatever_is_left():
    assert len({rule.name for rule in cr.RULES}) == len(cr.RULES)
    assert cr.RULES[-1].applies(
        cr.Evidence(grows=False, rises=False, plateau_reason="anything", unsteady=None, unsteady_by=None)
    )


def test_the_words_a_user_reads_name_no_number_from_the_rules_table():
    names = {rule.name for rule in rules.TABLE}
    for rule in cr.RULES:
        assert not set(re.findall(r"[A-Z][A-Z_]+[A-Z]", rule.words)) & names, rule.name


@pytest.mark.parametrize(
    ("evidence", "rule", "klass"),
    [
        (STEADY, "STEADY_RISE", "tensor_leak"),
        (
            cr.Evidence(grows=True, rises=True, plateau_reason=None, unsteady="slowing down", unsteady_by=ex.WARM_UP),
            "UNSTEADY",
            INCONCLUSIVE,
        ),
        (
            cr.Evidence(grows=False, rises=True, plateau_reason=None, unsteady=None, unsteady_by=None),
            "SLIGHT_RISE",
            BELOW_THRESHOLD,
        ),
        (
            cr.Evidence(grows=False, rises=False, plateau_reason=None, unsteady=None, unsteady_by=None),
            "NO_RISE",
            NO_GROWTH,
        ),
        (
            cr.Evidence(grows=True, rises=True, plateau_reason=cr.RECORD_REASON, unsteady=None, unsteady_by=None),
            "HIGH_WATER_MARK",
            NO_GROWTH,
        ),
        (
            cr.Evidence(grows=True, rises=True, plateau_reason=cr.STOPPED_REASON, unsteady=None, unsteady_by=None),
            "STOPPED",
            NO_GROWTH,
        ),
    ],
)
def test_the_shape_of_the_settled_levels_decides_where_the_heap_counter_says_nothing(evidence, rule, klass):
    decided = cr.decide(evidence, "tensor_leak")
    assert (decided.rule.name, decided.klass) == (rule, klass)


def test_a_heap_that_grew_once_is_inconclusive_though_its_chunks_rose_and_resident_memory_called_it_a_leak():
    evidence = dataclasses.replace(STEADY, allocations_rising="rose", grew_once="one jump")
    decided = cr.decide(evidence, "host_growth")
    assert (decided.rule.name, decided.klass) == ("GREW_ONCE", INCONCLUSIVE)
    assert decided.explanation == ex.ONE_OFF_STEP and decided.words == "the heap grew once and has stayed level since"


def test_an_unsteady_rise_names_the_explanation_it_could_not_tell_from_a_leak_in_both_forms():
    decided = cr.decide(
        cr.Evidence(grows=True, rises=True, plateau_reason=None, unsteady="why", unsteady_by=ex.WARM_UP),
        "cache_retention",
    )
    assert decided.json.startswith(f"{ex.WARM_UP}: ") and ex.WARM_UP in decided.words
    assert decided.explanation == ex.WARM_UP
