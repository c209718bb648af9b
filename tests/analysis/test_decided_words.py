"""The report's sentence on what decided a verdict: thresholds by their values, the runner-up's distance in words."""

from __future__ import annotations

from vlmtrace.analysis import rules
from vlmtrace.report.decided import decided_in_words, in_words, runner_up_in_words


def test_each_rule_name_becomes_its_threshold_in_its_unit():
    said = in_words(
        "rises by more than MIN_GROWTH_BYTES and NOISE_MULTIPLE × its noise, its second half keeping "
        "STEADY_RATIO of the first half's rate; under HOST_MIN_LEAK_RATE"
    )
    assert said == (
        "rises by more than 8 MiB and 3 × its noise, its second half keeping 60% of the first "
        "half's rate; under 128 KiB per request"
    )


def test_a_rule_named_in_brackets_after_its_value_is_dropped_and_other_capitals_stay():
    assert in_words(f"at least {rules.SEPARATION:g} × the next stage (SEPARATION)") == "at least 2 × the next stage"
    assert in_words("SIGABRT ended it (OOM_KILLER)") == "SIGABRT ended it (OOM_KILLER)"


def test_the_runner_up_is_placed_by_how_much_worse_it_fits():
    assert runner_up_in_words({"explanation": "plateau", "bic_above_best": 139.3}) == "plateau, which fits far worse"
    assert runner_up_in_words({"explanation": "warm-up", "bic_above_best": 7.0}) == "warm-up, which fits clearly worse"
    assert runner_up_in_words({"explanation": "warm-up", "bic_above_best": 3.0}) == "warm-up, which fits somewhat worse"
    assert runner_up_in_words({"explanation": "warm-up", "bic_above_best": 0.5}).startswith(
        "warm-up, which fits about as well"
    )


def test_the_whole_sentence_reads_without_a_rule_name():
    decision = {
        "class": "slight rise: under MIN_GROWTH_BYTES",
        "runner_up": None,
        "stage": "none named: nothing kept growing",
        "rate": "the Theil–Sen slope",
    }
    assert decided_in_words(decision) == (
        "Decided by slight rise: under 8 MiB; stage: none named: nothing kept growing; rate: the Theil–Sen slope."
    )
