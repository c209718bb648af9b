"""The H200 scenario matrices (benchmarks/gpu_matrix.py, docs/gpu-runs.md): the committed journals of
them are re-analysed and graded as the matrix's table grades them (`results.json`: the grades of the
analyzer as it stands). The first matrix's rules were decided on its `tune` half and its `held_out` half
reported as it came out; at stop 20 the rules were revised on all of it, and the second matrix
(`held_out_2`) recorded afterwards and reported as it came out; at stop 21 span boundaries began reading
host memory, and the third matrix was recorded with them, its rules decided on `tune_3` and `held_out_3`
reported as it came out; at stop 22 the rule for host growth beside a young PyTorch-engine process's
warm-up was decided on all of the third, the fourth matrix (`held_out_4`) recorded and reported as it
came out, the rules revised on it, and the fifth (`held_out_5`) recorded after that; at stop 24 the
sixth (`held_out_6`, recorded after stop 23's rule) was reported as it came out, the rules revised on
it, and the seventh (`held_out_7`) recorded after that; at stop 25 the eighth (`held_out_8`) was
recorded and reported as it came out, the young-process rule revised on it, and the ninth (`held_out_9`)
recorded after that and reported as it came out; at stop 26 the tenth (`held_out_10`) was recorded after
a grouped fit's noise changed and reported as it came out, the rules revised on it, and the eleventh
(`held_out_11`) recorded after that and reported as it came out, the rules revised on it, and the
twelfth (`held_out_12`) recorded after that and reported as it came out; at stop 27 the thirteenth
(`held_out_13`), recorded after the rules revised on the twelfth, was reported as it came out, the slope
rule revised on the tenth to thirteenth, and the fourteenth (`held_out_14`) recorded after that and reported
as it came out, the steadiness rule revised on it, and the fifteenth (`held_out_15`) and sixteenth (`held_out_16`)
recorded after that, with no rule changed between them, and reported as they came out, the trough rate
revised on them, and the seventeenth (`held_out_17`) and eighteenth (`held_out_18`) recorded after that,
with no rule changed between them, and reported as they came out; at stop 28 the nineteenth to
twenty-second (`held_out_19` to `held_out_22`) were recorded with the heap counter preloaded, each after the
host-stage rule revised on the one before, and reported as they came out; at stop 29 the young-process
rule was revised on the nineteenth and twenty-second (what LMDeploy's first heap trim left) and their rows
re-graded from the device's journals, with no matrix recorded after it; at stop 33 the twenty-third
(`held_out_23`, recorded after stop 32's rules) was reported as it came out, the give-back rules decided on
it, and the twenty-fourth (`held_out_24`, written down before them) reported as they graded it; after that
the allocating stage came to be named alone; at stop 34 the twenty-fifth (`held_out_25`, written down after
all of stop 33's rules) was reported as it came out, and the leak's class read from its allocating stage's
chunks decided on the twenty-third to twenty-fifth. Each row of `results.json` says which analyzer graded it (`graded_at`): the
rows of the journals kept here are re-graded by every analyzer change; the others keep the grade of
the last analyzer that had their journal. These tests keep the analyzer from changing its answers on
those runs unnoticed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import analyse

MATRIX = Path(__file__).parent / "data" / "gpu" / "matrix"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_matrix  # noqa: E402

ENTRIES = {entry["id"]: entry for entry in json.loads((MATRIX / "manifest.json").read_text())}
RESULTS = {row["id"]: row for row in json.loads((MATRIX / "results.json").read_text())}
COMMITTED = sorted(identifier for identifier, entry in ENTRIES.items() if entry["committed"])


@pytest.mark.parametrize("identifier", COMMITTED)
def test_a_recorded_scenario_is_graded_as_in_the_table(identifier: str):
    row = gpu_matrix.grade(ENTRIES[identifier], analyse(MATRIX / f"{identifier}.jsonl.gz").summary)
    recorded = RESULTS[identifier]
    assert {key: row[key] for key in ("found", "class_right", "stage_found", "stage_right", "slope_right")} == \
        {key: recorded[key] for key in ("found", "class_right", "stage_found", "stage_right", "slope_right")}


def _rows(halves: tuple[str, ...], expected_negative: bool) -> list[dict]:
    return [row for row in RESULTS.values()
            if row["half"] in halves and (ENTRIES[row["id"]]["expected_class"] == "negative") == expected_negative]


def _half(half: str) -> dict[str, dict]:
    return {row["id"]: row for row in RESULTS.values() if row["half"] == half}


def _no_negative_called_a_leak(halves: tuple[str, ...], count: int) -> None:
    negatives = _rows(halves, expected_negative=True)
    assert len(negatives) == count and all(not row["leak_found"] for row in negatives)


def _as_recorded(matrix: int) -> list[dict]:
    """A matrix's rows as the analyzer of its day graded them (benchmarks/results/h200-*/)."""
    (path,) = (Path(__file__).resolve().parents[2] / "benchmarks" / "results").glob(
        f"h200-*/matrix{matrix}-graded-as-recorded.json")
    return json.loads(path.read_text())


def test_no_negative_of_the_first_matrix_is_called_a_leak():
    _no_negative_called_a_leak(("tune", "held_out"), 12)


def test_the_second_matrix_negatives_called_leaks():
    """As it came out: TurboMind's own host growth over 1 200 requests (~30 KiB per request, steady) and
    fragmentation whose cache had not reached its bound within 120 requests. The fragmentation run,
    kept here, is clean since its cache was seen giving memory back (stop 21); the host run was graded
    before the 128 KiB-per-request floor for host growth and its journal was not kept."""
    negatives = _rows(("held_out_2",), expected_negative=True)
    assert len(negatives) == 11
    assert [row["id"] for row in negatives if row["leak_found"]] == ["tm-step-40x1200"]
    assert RESULTS["tm-step-40x1200"]["graded_at"] == "stop 20"
    assert RESULTS["tm-fragment-8x120"]["graded_at"] == "stop 21"


def test_no_negative_of_the_third_matrix_is_called_a_leak():
    _no_negative_called_a_leak(("tune_3", "held_out_3"), 18)


def test_third_matrix_host_stages_are_named_on_both_backends():
    """Span boundaries read host memory: the stage of host growth is named, not withheld as the
    sampler alone left it (second matrix: 0 of 8 host stages named)."""
    host = [row for row in RESULTS.values() if row["half"] in ("tune_3", "held_out_3")
            and row["expected"] == "host_growth" and ENTRIES[row["id"]]["stage"] != "outside"]
    assert len(host) == 18
    # 13 as the third matrix came out; 14 since a stage rising beside a young PyTorch-engine process's
    # settling warm-up is named by its own rise (stop 22: `pt-host-prompt-1x120-1MiB`).
    assert sum(row["stage_right"] is True for row in host) == 14


def test_stages_named_wrong():
    """None in the first matrix once its rules were revised; one in the second (a sampled NVML reading
    split by span counts, which favoured the PyTorch engine's many steps; graded before that split
    counted each stage per request); two host stages of the third's tune half, where the leaking stage
    reused freed heap pages and the growth in RSS appeared where pages were next touched. In the fourth,
    one as it came out (a young process's inconclusive rise named the warm-up's stage), withheld since.
    The fifth's and the eighth's to the eighteenth's are in their own tests."""
    wrong = sorted(row["id"] for row in RESULTS.values() if row["stage_right"] is False
                   and row["half"] not in ("held_out_5", "held_out_8", "held_out_9", "held_out_10", "held_out_11", "held_out_12",
                                           "held_out_13", "held_out_14", "held_out_17", "held_out_18"))
    assert wrong == ["pt-host-after_response-1x120-2MiB", "pt-native-after_response-1x600-2MiB",
                     "tm-host-vision.preprocess-1x600-0.5MiB"]


def test_no_negative_of_the_fourth_matrix_is_called_a_leak():
    """Fifteen negatives, ten of them in the PyTorch engine's first 60-240 requests, where the stage-rise
    rule could mistake LMDeploy's warm-up for a leak."""
    _no_negative_called_a_leak(("held_out_4",), 15)


def test_young_pytorch_host_growth_of_the_fourth_matrix():
    """Host growth in a PyTorch-engine process's first 60-120 requests: called where a stage kept rising
    beside a settling warm-up, or where it outran the warm-up; inconclusive, never wrong, where the run
    cannot tell (40 prompts a call: 3 calls; a slow leak in the warm-up's own stage; a leak split between
    two spans)."""
    young = {row["id"]: row for row in RESULTS.values() if row["half"] == "held_out_4"
             and row["expected"] == "host_growth" and row["requests"] <= 120 and row["id"].startswith("pt-")}
    assert len(young) == 14
    missed = sorted(identifier for identifier, row in young.items() if not row["class_right"])
    assert missed == ["pt-host-after_response-1x120-0.5MiB", "pt-host-outside-40x120-0.5MiB",
                      "pt-host-prompt-40x120-0.5MiB", "pt-host-vision.forward-40x120-2MiB",
                      "pt-host-vision.preprocess-1x120-0.5MiB"]
    assert not any(row["leak_found"] for identifier, row in young.items() if identifier in missed)
    assert [identifier for identifier, row in young.items() if row["stage_right"] is False] == []


def test_the_fifth_matrix_as_it_came_out():
    """Recorded after the rules were revised on the fourth. No negative called a leak; the injected
    misses are two rises taken for high-water marks (8 and 40 prompts a call: nearly every request lies
    within the concurrency of a new input maximum) and a PyTorch-engine run of 60 requests too short to
    tell from its warm-up; two stages named wrong, both host memory first touched outside the leaking span."""
    rows = _half("held_out_5")
    assert len(rows) == 36
    _no_negative_called_a_leak(("held_out_5",), 14)
    # and `pt-host-prompt-8x240-0.5MiB` right since stop 26 (a grouped fit's noise measured from each
    # group's own level: its rise between new input maxima is more than noise, not a high-water mark)
    assert sorted(identifier for identifier, row in rows.items() if row["class_right"] is False) == [
        "pt-host-prompt-8x60-1MiB", "pt-host-vision.preprocess-40x240-1MiB"]
    assert sorted(identifier for identifier, row in rows.items() if row["stage_right"] is False) == [
        "pt-host-after_response-1x120-1MiB", "tm-host-prompt-1x60-1MiB"]


def test_the_sixth_matrix_after_the_rule_was_revised_on_it():
    """Recorded after stop 23 and, as it came out, 11 of 23 injected classes right: young PyTorch-engine
    host growth over 160-200 requests at 8 and 16 in flight, where LMDeploy's warm-up was still rising
    in every stage, was `inconclusive` or a plateau (benchmarks/results/h200-2026-12-04/
    matrix6-graded-as-recorded.json). A stage three times ahead of the next needs no settled rest, and
    the shape tests read that stage's own level (stop 24): 17 right, no negative called a leak, no stage wrong."""
    rows = _half("held_out_6")
    assert len(rows) == 35
    _no_negative_called_a_leak(("held_out_6",), 12)
    # Two more right since stop 25, where the young-process rule withholds the class only up to 160
    # requests (the stage still up to 200): `pt-host-outside-8x200-0.5MiB`, `pt-host-prompt-1x200-0.5MiB`.
    assert sorted(identifier for identifier, row in rows.items() if row["class_right"] is False) == [
        "pt-host-engine-1x160-2MiB", "pt-host-prompt-16x160-0.5MiB",
        "pt-host-vision.forward-8x160-0.5MiB", "pt-native-prompt-16x160-2MiB"]
    assert not any(row["leak_found"] for row in rows.values() if row["class_right"] is False)
    assert [identifier for identifier, row in rows.items() if row["stage_right"] is False] == []
    as_recorded = _as_recorded(6)
    assert sum(row["class_right"] is True for row in as_recorded) == 11 + 12  # injected + negatives


def test_the_seventh_matrix_as_it_came_out():
    """Recorded after the stop-24 rule, to test it: young PyTorch-engine host growth at 8 and 16 in flight
    over 160-240 requests, and negatives of the same shapes. No negative called a leak, no stage wrong;
    two rises still inconclusive (a 200-request run whose stage was not three times ahead of the next,
    and one slowing by half between its halves)."""
    rows = _half("held_out_7")
    assert len(rows) == 16
    _no_negative_called_a_leak(("held_out_7",), 6)
    # and `pt-host-engine-16x200-1MiB` right since stop 25 (the young-process rule's class window: 160)
    assert sorted(identifier for identifier, row in rows.items() if row["class_right"] is False) == [
        "pt-host-after_response-8x200-1MiB"]
    assert [identifier for identifier, row in rows.items() if row["stage_right"] is False] == []
    # 4 as it came out; 5 since a stage rise's own slope holds past the young-process window (stop 24,
    # after the seventh: `pt-host-prompt-16x240-1MiB`, 1.38 → 1.02 MiB per request); 6 since the rate from
    # the first level and the troughs after one fall (stop 27: `pt-host-vision.preprocess-8x240-0.5MiB`,
    # 0.761 → 0.504).
    assert sum(row["slope_right"] is True for row in rows.values()) == 6


def test_the_eighth_matrix_as_it_came_out():
    """Recorded at stop 25 to test stop 24's last changes (a stage rise's own slope for any run length,
    `request.response`): 40 and 1 in flight over 160-240 requests. No negative called a leak; both
    after-response leaks named `request.response`. Four of the five PyTorch-engine leaks at 40 in flight
    inconclusive (six calls: every point lies near a new input maximum), two stages wrong."""
    rows = _half("held_out_8")
    assert len(rows) == 20
    _no_negative_called_a_leak(("held_out_8",), 8)
    as_recorded = {row["id"]: row for row in _as_recorded(8)}
    assert sorted(identifier for identifier, row in as_recorded.items() if row["class_right"] is False) == [
        "pt-host-engine-40x160-1MiB", "pt-host-prompt-40x240-1MiB", "pt-host-vision.forward-40x240-0.5MiB",
        "pt-host-vision.preprocess-1x200-1MiB", "pt-host-vision.preprocess-40x200-2MiB"]
    assert sorted(identifier for identifier, row in as_recorded.items() if row["stage_right"] is False) == [
        "pt-host-engine-1x240-0.5MiB", "tm-host-vision.preprocess-1x200-0.5MiB"]
    assert [as_recorded[identifier]["stage_found"] for identifier in (
        "pt-host-after_response-40x200-2MiB", "pt-host-after_response-1x200-2MiB")] == ["request.response"] * 2
    assert sum(row["slope_right"] is True for row in as_recorded.values()) == 8
    # Tuning since (stop 25): the young-process rule withholds the class up to 160 requests, the stage
    # up to 200: `pt-host-vision.preprocess-1x200-1MiB` is a leak, its stage withheld. And since stop 26
    # a heap's trim starts a stretch of the high-water test: `pt-host-prompt-40x240-1MiB` is a leak.
    assert sorted(identifier for identifier, row in rows.items() if row["class_right"] is False) == [
        "pt-host-engine-40x160-1MiB", "pt-host-vision.forward-40x240-0.5MiB", "pt-host-vision.preprocess-40x200-2MiB"]
    assert rows["pt-host-vision.preprocess-1x200-1MiB"]["stage_right"] == "withheld"


def test_the_ninth_matrix_as_it_came_out():
    """Recorded at stop 25 after the young-process rule came to withhold the class only up to 160
    requests: PyTorch-engine runs of 170-200 requests at 1, 8 and 16 in flight. No negative called a leak
    (the change's risk). Two 0.5 MiB-per-request leaks at one in flight taken for high-water marks in
    vision.preprocess, where the heap's new pages were touched (docs/gpu-runs.md, "Stop 25"); slopes
    11-62 % over where LMDeploy's warm-up is in the fit."""
    rows = _half("held_out_9")
    assert len(rows) == 20
    _no_negative_called_a_leak(("held_out_9",), 10)
    assert sorted(identifier for identifier, row in rows.items() if row["class_right"] is False) == [
        "pt-host-after_response-16x200-0.5MiB", "pt-host-prompt-1x180-0.5MiB", "pt-host-vision.forward-1x180-0.5MiB"]
    as_recorded = {row["id"]: row for row in _as_recorded(9)}
    assert sorted(identifier for identifier, row in as_recorded.items() if row["stage_right"] is False) == [
        "pt-host-prompt-1x180-0.5MiB", "pt-host-vision.forward-1x180-0.5MiB"]
    assert not any(rows[identifier]["leak_found"] for identifier in (
        "pt-host-prompt-1x180-0.5MiB", "pt-host-vision.forward-1x180-0.5MiB"))
    # Withheld since stop 26: vision.preprocess's resident size did not move in a quarter or more of the
    # calls, where a leak's stage rises in every one (naming.sporadic).
    assert [identifier for identifier, row in rows.items() if row["stage_right"] is False] == []
    assert sum(row["stage_right"] == "withheld" for row in rows.values()) == 4
    # 1 until stop 27; since then a host leak's rate runs from its first level through the lowest level
    # after each fall, one fall enough: three more within 10 % (0.81 → 0.54, 1.24 → 0.98, 1.31 → 0.96).
    assert sum(row["slope_right"] is True for row in rows.values()) == 4


def _came_out(matrix: int, classes_wrong: list[str], stages_wrong: list[str], stages_right: int, withheld: int,
              slopes: int, runs: int = 24) -> dict[str, dict]:
    """A matrix of stop 26 or later as the analyzer of its day graded it: the misses by name, the rest counted."""
    as_recorded = {row["id"]: row for row in _as_recorded(matrix)}
    assert len(as_recorded) == runs
    assert sorted(identifier for identifier, row in as_recorded.items() if row["class_right"] is False) == classes_wrong
    assert sorted(identifier for identifier, row in as_recorded.items() if row["stage_right"] is False) == stages_wrong
    assert sum(row["stage_right"] is True for row in as_recorded.values()) == stages_right
    assert sum(row["stage_right"] == "withheld" for row in as_recorded.values()) == withheld
    assert sum(row["slope_right"] is True for row in as_recorded.values()) == slopes
    return as_recorded


def _regraded(half: str, as_recorded: dict[str, dict], revised: tuple[str, ...], stop: str = "stop 26") -> dict[str, dict]:
    """The half's rows as the analyzer grades them now; every row but `revised` as it came out (at `stop`)."""
    rows = _half(half)
    assert {identifier: row for identifier, row in rows.items() if identifier not in revised} == {
        identifier: {**row, "graded_at": stop} for identifier, row in as_recorded.items() if identifier not in revised}
    return rows


def test_the_tenth_matrix_as_it_came_out():
    """Recorded at stop 26 after a grouped fit's noise came to be measured from each group's own level:
    small leaks of every kind at 1, 8 and 16 in flight over 220-300 requests on both backends, and
    negatives whose level rises at new input maxima. Every leak called (the noise change gained
    `pt-host-vision.forward-8x240-0.5MiB`; the analyzer before it missed it); one negative called a leak:
    a fresh PyTorch-engine process whose heap grew, was trimmed back below its start once, and grew
    again (`pt-step-16x240`). One stage wrong: TurboMind's prompt processing, whose heap pages were first
    touched in the engine's stream."""
    as_recorded = _came_out(10, ["pt-step-16x240"], ["tm-host-prompt-8x240-0.5MiB"], stages_right=8, withheld=3, slopes=7)
    # Revised on it (stop 26): a rise that fell, once, to near where it began is memory given back, not
    # kept (leaks._fell_back). On every committed journal of the ten matrices it changes two verdicts,
    # both here: this negative's, and the host rise beside a torch-cache leak (the process's heap, not
    # the injected cause), which was a second leak verdict there.
    # And since stop 27 a host leak's rate is read across one fall too, from its first level through the
    # lowest level after it (leaks._kept_rate): three slopes nearer, one of them now within 10 %.
    rows = _regraded("held_out_10", as_recorded, ("pt-step-16x240", "pt-cache-engine-16x240-1MiB",
                                                  "pt-host-engine-8x240-0.5MiB", "pt-host-vision.forward-8x240-0.5MiB",
                                                  "pt-host-vision.preprocess-1x240-0.5MiB"))
    _no_negative_called_a_leak(("held_out_10",), 12)
    assert rows["pt-host-vision.preprocess-1x240-0.5MiB"]["slope_found"] == "0.458"
    assert rows["pt-step-16x240"]["found"] == "inconclusive,no_growth"
    assert rows["pt-cache-engine-16x240-1MiB"]["found"] == "cache_retention"


def test_the_eleventh_matrix_as_it_came_out():
    """Recorded at stop 26 after a host rise given back to near where it began came to be inconclusive:
    small leaks of every kind in fresh processes at 1, 8 and 16 in flight over 220-300 requests, where
    glibc trims its heap, and negatives of the same shapes. The given-back rule moved nothing here; the
    grouped-noise change gained `pt-host-prompt-8x280-0.5MiB` (the analyzer before both: 21/24). Missed: a
    0.5 MiB leak whose heap was trimmed twice inside the stretches between new input maxima
    (`inconclusive`); one negative called a leak: a stage rising beside a heap trimmed twice back below
    its start (`pt-none-16x260`)."""
    as_recorded = _came_out(11, ["pt-host-engine-16x280-0.5MiB", "pt-none-16x260"], ["pt-host-engine-1x220-0.5MiB"],
                            stages_right=7, withheld=4, slopes=5)
    # Revised on it (stop 26): the given-back rule reads the process's own level, also where a stage's
    # rise is the fit (what any stage keeps, the process keeps); on every committed journal of the eleven
    # matrices it changes this negative only.
    # And a host leak's rate comes from the lowest levels after its heap's trims, where it fell twice or
    # more (leaks._kept_rate): `pt-host-prompt-8x280-0.5MiB` 0.698 → 0.51 MiB per request.
    # And the stage named wrong is withheld since (naming.sporadic: its resident size did not move in a
    # quarter or more of the calls); and a heap's trim starts a stretch of the high-water test, so the
    # leak trimmed twice inside its stretches is called (0.552 MiB per request, from its troughs).
    # Since stop 27 a rate is read across one fall too (from the first level): 0.486 for the one-in-flight
    # engine leak (0.662); the one trimmed twice inside its stretches reads 0.552 from its troughs.
    rows = _regraded("held_out_11", as_recorded, ("pt-none-16x260", "pt-host-prompt-8x280-0.5MiB",
                                                  "pt-host-engine-1x220-0.5MiB", "pt-host-engine-16x280-0.5MiB"))
    _no_negative_called_a_leak(("held_out_11",), 12)
    assert rows["pt-none-16x260"]["found"] == "inconclusive,no_growth"
    assert (rows["pt-host-prompt-8x280-0.5MiB"]["slope_found"], rows["pt-host-prompt-8x280-0.5MiB"]["slope_right"]) == ("0.51", True)
    assert rows["pt-host-engine-1x220-0.5MiB"]["stage_right"] == "withheld"
    assert rows["pt-host-engine-16x280-0.5MiB"]["found"] == "host_growth"


def test_the_twelfth_matrix_as_it_came_out():
    """Recorded at stop 26 after the given-back rule came to read the process's own level and a host
    leak's rate to come from the lowest levels after its heap's trims: 300-request runs at 8 and 16 in
    flight, small leaks of every kind and negatives of the same shapes. No negative called a leak; slopes
    9 of 12 (the analyzer of stop 25: 6, with the same classes and stages). Missed: a 0.5 MiB prompt
    leak at 16 in flight (`inconclusive`: 28 % of its points near a new input maximum); one stage wrong,
    a 0.5 MiB heap leak at one in flight (vision.preprocess touched the heap's new pages)."""
    as_recorded = _came_out(12, ["pt-host-prompt-16x300-0.5MiB"], ["pt-host-prompt-1x240-0.5MiB"],
                            stages_right=8, withheld=3, slopes=9)
    _no_negative_called_a_leak(("held_out_12",), 12)
    # Revised after it (naming.sporadic, decided on all twelve): the wrong stage is withheld.
    # And since stop 27 (a rate read across one fall, from the first level): that leak's slope 0.702 → 0.498.
    # And since stop 33 (leaks._plateau: the second half's slope within the stretches a heap's fall leaves) the
    # missed leak is called, its slope still 23 % high.
    rows = _regraded("held_out_12", as_recorded, ("pt-host-prompt-1x240-0.5MiB", "pt-host-outside-16x300-1MiB",
                                                  "pt-host-engine-8x300-1MiB", "pt-host-prompt-16x300-0.5MiB"))
    assert (rows["pt-host-prompt-16x300-0.5MiB"]["found"], rows["pt-host-prompt-16x300-0.5MiB"]["slope_right"]) == ("host_growth", False)
    assert rows["pt-host-prompt-1x240-0.5MiB"]["stage_right"] == "withheld"
    assert rows["pt-host-prompt-1x240-0.5MiB"]["slope_right"] is True
    assert rows["pt-host-outside-16x300-1MiB"]["slope_right"] is True


def test_the_thirteenth_matrix_as_it_came_out():
    """Recorded at stop 27, the first held-out test of the two rules decided on the twelfth: a host stage
    whose resident size stood still in a quarter of its calls is withheld (naming.sporadic), and a
    heap's trim of 8 MiB or more starts a stretch of the high-water test (leaks._plateau). Small host
    leaks at every stage at one in flight, host leaks at 16 and 40 in flight, negatives of the same
    shapes. Every class right, every negative clean, no stage wrong. The analyzer before the two rules on
    the same journals: two stages wrong (`pt-host-engine-1x260-0.5MiB`, `tm-host-vision.preprocess-1x260-1MiB`,
    both withheld now) and `pt-host-engine-16x320-0.5MiB` inconclusive (called now, its slope read from
    two troughs 16 % low). Slopes missed: that one, a 0.5 MiB prompt leak 10.2 % over, and a 1 MiB leak at
    40 in flight read from its heap's troughs at 0.45 MiB per request (the stage's own fit: 1.05)."""
    as_recorded = _came_out(13, [], [], stages_right=7, withheld=5, slopes=9)
    _no_negative_called_a_leak(("held_out_13",), 12)
    # Revised on it, with the tenth to twelfth (stop 27): a rate read across one fall too, from the first
    # level; beside a young process's warm-up the troughs' line stands only where it reads less than the
    # stage's rise. (Taken from the first level after two falls as well until the fourteenth to sixteenth
    # said otherwise: 0.494 and 0.819 here then, 0.419 and 0.448 now.)
    rows = _regraded("held_out_13", as_recorded, ("pt-host-engine-1x260-0.5MiB",), stop="stop 27")
    assert rows["pt-host-engine-16x320-0.5MiB"]["slope_found"] == "0.419"
    assert rows["pt-host-engine-1x260-0.5MiB"]["stage_right"] == "withheld"
    assert rows["tm-host-vision.preprocess-1x260-1MiB"]["stage_right"] == "withheld"
    assert rows["pt-host-engine-16x320-0.5MiB"]["found"] == "host_growth"


def test_the_fourteenth_matrix_as_it_came_out():
    """Recorded at stop 27 after a host leak's rate came to run from its first level through the lowest
    level after each of LMDeploy's heap trims, and the trims became spans of their own: PyTorch-engine runs
    of 280-320 requests at 1, 8, 16 and 40 in flight. Every negative clean; slopes 10/12 (the analyzer
    before the rate change: 9, `pt-host-engine-40x280-1MiB` 0.75 → 0.952). Three leaks `inconclusive`: a
    0.5 MiB leak at one in flight whose second half rose at half the first's rate, a 0.5 MiB leak outside
    any request in a process too young to tell from LMDeploy's warm-up, and a 2 MiB leak at 40 in flight
    with 46 % of its points near a new input maximum. One stage wrong: a tensor leak the harness injects
    around the engine step's wrapper, so before its span starts, charged outside any span."""
    as_recorded = _came_out(14, ["pt-host-outside-8x300-0.5MiB", "pt-host-prompt-40x280-2MiB",
                                 "pt-host-vision.forward-1x280-0.5MiB"], ["pt-tensor-engine-16x300-0.5MiB"],
                            stages_right=6, withheld=5, slopes=10)
    _no_negative_called_a_leak(("held_out_14",), 12)
    # Revised on it (stop 27): where the heap was trimmed twice or more, what the troughs kept decides
    # whether the rise is steady (leaks._kept_steadily), not the halves of the levels, each of which holds
    # a different part of the working set's saw-tooth. It calls two of the three; on the 120 runs of the
    # tenth to fourteenth matrices and every committed journal it moves nothing else.
    # And after the sixteenth (stop 27): after two falls or more the rate runs through the troughs alone,
    # as at stop 26, so this 40-in-flight leak reads 0.75 again.
    rows = _regraded("held_out_14", as_recorded, ("pt-host-vision.forward-1x280-0.5MiB", "pt-host-outside-8x300-0.5MiB",
                                                  "pt-host-engine-40x280-1MiB"), stop="stop 27")
    assert rows["pt-host-engine-40x280-1MiB"]["slope_found"] == "0.75"
    assert [rows[identifier]["found"] for identifier in ("pt-host-vision.forward-1x280-0.5MiB", "pt-host-outside-8x300-0.5MiB")] == [
        "host_growth", "host_growth"]
    _no_negative_called_a_leak(("held_out_14",), 12)


def test_the_fifteenth_matrix_as_it_came_out():
    """Recorded at stop 27 after a rise across two or more heap trims came to be judged steady by what its
    troughs kept: ten leaks and fourteen negatives of 300-400 requests at 1, 8 and 16 in flight. Every class
    right, every negative clean, no stage wrong. Slopes 7 of 10: three 0.5 MiB leaks at 8 and 16 in flight
    10-14 % over. The analyzer before the steadiness rule grades it the same; the one before stop 27's rate
    from the first level (564a48c): 9 of 10 (0.513 and 0.521 where the first level, which holds what
    LMDeploy's warm-up kept through the first trim, now reads 0.569 and 0.551)."""
    as_recorded = _came_out(15, [], [], stages_right=5, withheld=5, slopes=7)
    _no_negative_called_a_leak(("held_out_15",), 14)
    # Revised after the sixteenth (stop 27): after two falls or more the troughs alone, as at stop 26.
    rows = _regraded("held_out_15", as_recorded, ("pt-host-outside-16x320-0.5MiB", "pt-host-after_response-16x320-0.5MiB",
                                                  "pt-host-vision.forward-1x300-0.5MiB", "pt-host-prompt-1x400-0.5MiB"),
                     stop="stop 27")
    assert [rows[identifier]["slope_found"] for identifier in (
        "pt-host-outside-16x320-0.5MiB", "pt-host-after_response-16x320-0.5MiB")] == ["0.513", "0.521"]
    assert sum(row["slope_right"] is True for row in rows.values()) == 9


def test_the_sixteenth_matrix_as_it_came_out():
    """Recorded at stop 27 with the analyzer of the fifteenth: PyTorch-engine runs of 560-600 requests
    (four heap trims), 40 in flight, TurboMind host leaks at every stage, GPU classes under load. Every
    class right, every negative clean, no stage wrong (7 right, 7 withheld), slopes 13 of 14 (a 1 MiB leak
    at 40 in flight read 0.90). The analyzer of 564a48c: classes 23 (the steady-across-trims rule calls
    `pt-host-outside-1x320-1MiB`), slopes 14 (0.915 there)."""
    as_recorded = {row["id"]: row for row in _as_recorded(16)}
    assert len(as_recorded) == 24
    assert [identifier for identifier, row in as_recorded.items() if row["class_right"] is False] == []
    assert [identifier for identifier, row in as_recorded.items() if row["stage_right"] is False] == []
    assert sum(row["stage_right"] is True for row in as_recorded.values()) == 7
    assert sum(row["stage_right"] == "withheld" for row in as_recorded.values()) == 7
    assert [identifier for identifier, row in as_recorded.items() if row["slope_right"] is False] == [
        "pt-host-vision.forward-40x400-1MiB"]
    _no_negative_called_a_leak(("held_out_16",), 10)
    # Revised after it (stop 27): after two falls or more the troughs alone, as at stop 26: 14 of 14.
    rows = _regraded("held_out_16", as_recorded, ("pt-host-prompt-16x600-0.5MiB", "pt-host-vision.forward-40x400-1MiB",
                                                  "pt-host-outside-1x320-1MiB"), stop="stop 27")
    assert rows["pt-host-outside-1x320-1MiB"]["found"] == "host_growth"
    assert rows["pt-host-vision.forward-40x400-1MiB"]["slope_found"] == "0.915"
    assert sum(row["slope_right"] is True for row in rows.values()) == 14


def test_the_seventeenth_matrix_as_it_came_out():
    """Recorded at stop 27 after a host leak's rate came to start at the first level only across one heap
    trim (after two or more: the troughs alone): runs of 200-250 requests (one trim) and 360-380 (two) at 1,
    8 and 16 in flight. Every class right, every negative clean; slopes 9 of 12, against 6 by the analyzer
    of 564a48c (stop 26: a fit where the heap was trimmed once) and 8 by the first level after any number
    of trims; one stage wrong: TurboMind's prompt processing, placed in `engine.stream` as in the tenth."""
    as_recorded = _came_out(17, [], ["tm-host-prompt-8x200-0.5MiB"], stages_right=6, withheld=5, slopes=9)
    _no_negative_called_a_leak(("held_out_17",), 12)
    rows = _regraded("held_out_17", as_recorded, (), stop="stop 27")
    assert [rows[identifier]["slope_found"] for identifier in (
        "pt-host-prompt-1x210-0.5MiB", "pt-host-engine-8x200-0.5MiB", "pt-host-outside-16x210-1MiB")] == ["0.511", "0.549", "0.98"]


def test_the_eighteenth_matrix_as_it_came_out():
    """Recorded at stop 27 with the seventeenth's analyzer: the run lengths the matrices before it left out,
    60-120 requests (young processes) and 1 200-3 000 (many heap trims, long TurboMind runs). Every negative
    clean, five of them `inconclusive` in their first 80-100 requests. One leak missed: a tensor leak at 40
    prompts a call over three calls (`inconclusive`). Two stages wrong: TurboMind's prompt processing in
    `engine.stream` (one in flight, as at 8 in the tenth and seventeenth) and a tensor leak the harness
    allocates before the engine step's span starts (the fourteenth's caveat). The analyzer of 564a48c grades
    it the same."""
    as_recorded = _came_out(18, ["pt-tensor-prompt-40x120-0.5MiB"], ["pt-tensor-engine-8x120-0.5MiB", "tm-host-prompt-1x100-0.5MiB"],
                            stages_right=7, withheld=3, slopes=10)
    _no_negative_called_a_leak(("held_out_18",), 12)
    _regraded("held_out_18", as_recorded, (), stop="stop 27")


def _host_rows(half: str) -> tuple[str, ...]:
    return tuple(identifier for identifier, entry in ENTRIES.items() if entry["half"] == half and entry["cause"] == "host")


def _stages_now(half: str) -> tuple[int, int, int]:
    rows = _half(half).values()
    return (sum(row["stage_right"] is True for row in rows), sum(row["stage_right"] == "withheld" for row in rows),
            sum(row["stage_right"] is False for row in rows))


def test_the_nineteenth_matrix_as_it_came_out():
    """Recorded at stop 28 with the heap counter preloaded, graded by 15c3547, where the heap's readings
    replaced resident pages for host stages: TurboMind's prompt processing and vision preprocessing at one
    prompt in flight placed right (resident pages: `engine.stream`), a TurboMind engine leak and an
    after-response leak placed in vision preprocessing. Re-graded now (the heap only vetoes): no stage wrong."""
    as_recorded = _came_out(19, ["pt-host-after_response-8x160-0.5MiB", "pt-host-prompt-1x150-0.5MiB", "pt-host-vision.forward-1x150-1MiB"],
                            ["tm-host-after_response-8x160-1MiB", "tm-host-engine-1x200-0.5MiB"], stages_right=9, withheld=4, slopes=12)
    _no_negative_called_a_leak(("held_out_19",), 8)
    rows = _regraded("held_out_19", as_recorded, _host_rows("held_out_19"), stop="stop 28")
    assert _stages_now("held_out_19") == (5, 10, 0)
    assert rows["tm-host-engine-1x200-0.5MiB"]["stage_found"] == "engine.stream"
    # Since stop 29 (leaks._kept_across_one_trim) the two young leaks of 150 requests are called by what
    # LMDeploy's first heap trim left, and so is one at 8 in flight whose levels were too noisy for a fit.
    assert [(rows[identifier]["found"], rows[identifier]["slope_found"], rows[identifier]["graded_at"]) for identifier in (
        "pt-host-prompt-1x150-0.5MiB", "pt-host-vision.forward-1x150-1MiB", "pt-host-after_response-8x160-0.5MiB")] == [
        ("host_growth", "0.465", "stop 29"), ("host_growth", "0.988", "stop 29"), ("host_growth", "0.525", "stop 29")]


def test_the_twentieth_matrix_as_it_came_out():
    """Recorded at stop 28 after the hand-off rule (4c86cee): it withheld the nineteenth's wrong engine stage,
    and on the twentieth two stages the heap placed were still wrong, both where resident pages were right."""
    as_recorded = _came_out(20, ["tm-host-engine-8x220-0.5MiB"], ["pt-host-after_response-1x250-1MiB", "tm-host-engine-1x240-1MiB"],
                            stages_right=8, withheld=6, slopes=14)
    _no_negative_called_a_leak(("held_out_20",), 8)
    _regraded("held_out_20", as_recorded, _host_rows("held_out_20"), stop="stop 28")
    assert _stages_now("held_out_20") == (9, 7, 0)


def test_the_twenty_first_matrix_as_it_came_out():
    """Recorded at stop 28 after the two-witness rule (cb9775e: the heap named a stage resident pages
    withheld): two stages wrong, both the heap's where resident pages withheld or named no span."""
    as_recorded = _came_out(21, ["pt-host-prompt-40x240-2MiB"], ["pt-host-engine-1x190-0.5MiB", "pt-host-outside-1x240-0.5MiB"],
                            stages_right=10, withheld=4, slopes=14)
    _no_negative_called_a_leak(("held_out_21",), 8)
    _regraded("held_out_21", as_recorded, ("pt-host-engine-1x190-0.5MiB", "pt-host-outside-1x240-0.5MiB"), stop="stop 28")
    assert _stages_now("held_out_21") == (11, 5, 0)


def test_the_twenty_second_matrix_as_it_came_out():
    """Recorded at stop 28 after the heap came to only veto (03ece67), twelve runs: no stage wrong, four right,
    six withheld (resident pages alone: six right, two wrong). Three young PyTorch-engine leaks of 140
    requests at one prompt in flight are `inconclusive` (the warm-up rule)."""
    young = ("pt-host-engine-1x140-1MiB", "pt-host-outside-1x140-1MiB", "pt-host-vision.preprocess-1x140-1MiB")
    as_recorded = _came_out(22, list(young), [], stages_right=4, withheld=6, slopes=6, runs=12)
    _no_negative_called_a_leak(("held_out_22",), 2)
    # Since stop 33 (leaks._plateau: the second half's slope within the stretches the trim leaves) the negative
    # trimmed once at 8 in flight is `inconclusive` (its level fell back below where it began), no longer a plateau.
    rows = _regraded("held_out_22", as_recorded, (*young, "pt-none-8x140"), stop="stop 28")
    assert [(rows[identifier]["found"], rows[identifier]["slope_right"]) for identifier in young] == [("host_growth", True)] * 3
    assert rows["pt-none-8x140"]["found"] == "inconclusive,no_growth"


def test_a_young_pytorch_leak_is_called_by_what_lmdeploys_first_heap_trim_left():
    """Stop 29 (leaks._kept_across_one_trim): at one prompt in flight the PyTorch engine's heap working set
    rises ~1 MiB a request until LMDeploy's trim at its 128th session gives it back; what the trim left is
    kept. A 1 MiB-per-request leak of 140 requests is called at its rate; a negative of 140 requests at 8 in
    flight, trimmed too, is not; nor is one whose level fell once without a trim span (glibc returning the
    top of its heap: pt-fragment-1x120, recorded before trims were spans), which stays inconclusive."""
    leak = analyse(MATRIX / "pt-host-engine-1x140-1MiB.jsonl.gz").summary
    host = next(verdict for verdict in leak.verdicts if verdict.component == "host")
    assert host.klass == "host_growth" and leak.leak_found
    assert abs(host.slope_bytes_per_request / 2**20 - 1) < 0.05
    assert host.evidence["slope_from_trims"].startswith("the heap was trimmed 1 time")
    assert host.stage is None  # in a young process the warm-up's stages hold as much: no stage named
    assert not analyse(MATRIX / "pt-none-8x140.jsonl.gz").summary.leak_found
    fragment = analyse(MATRIX / "pt-fragment-1x120.jsonl.gz").summary
    assert not fragment.leak_found
    assert {verdict.klass for verdict in fragment.verdicts if verdict.component == "host"} == {"inconclusive"}


def test_the_twenty_third_matrix_as_it_came_out():
    """Recorded at stop 33 with the heap counter, held out for stop 29's one-trim rule and stop 32's leak rate
    from the allocating stage and hand-off revision (graded by 2c3f516). No stage wrong; two classes wrong,
    both PyTorch-engine runs past LMDeploy's first heap trim: a 0.5 MiB leak at eight in flight whose level
    fell at the trim in the run's second half (called a plateau), and a 40 MiB host cache filled before the
    trim (what the one-trim rule was known not to tell from a leak: gpu_matrix's TWENTY_THIRD_TABLE)."""
    as_recorded = _came_out(23, ["pt-host-engine-8x144-0.5MiB", "pt-hostlru-1x152-1MiB"], [], stages_right=13, withheld=5,
                            slopes=17, runs=28)
    assert sum(row["allocating_right"] is True for row in as_recorded.values() if "allocating_right" in row) == 14
    # Revised on it (stop 33): a heap's fall cuts the plateau test's second half too (leaks._plateau); a stage's
    # chunks that other give-backs show settling keep a leak read across one fall `inconclusive`
    # (heap_tags.filling); chunks another stage gave back are a working set (heap_tags._kept_rate).
    # And (stop 33, naming.allocation_stage) the allocating stage is named wherever the charges separate one,
    # as stop 32 measured without it: 14 of 14 right here, and 1 of 1 among the stages withheld.
    revised = ("pt-host-engine-8x144-0.5MiB", "pt-hostlru-1x152-1MiB", "pt-host-prompt-1x136-0.5MiB",
               "pt-host-engine-1x152-1MiB", "pt-warmup-1x152", "pt-step-8x144", "pt-host-vision.preprocess-1x144-0.5MiB")
    rows = _regraded("held_out_23", as_recorded, revised, stop="stop 32")
    assert all(row["class_right"] for row in rows.values())
    assert _stages_now("held_out_23") == (17, 1, 0)
    assert sum(row["slope_right"] is True for row in rows.values()) == 18
    assert (rows["pt-host-engine-8x144-0.5MiB"]["found"], rows["pt-host-engine-8x144-0.5MiB"]["slope_found"]) == ("host_growth", "0.5")
    assert {rows[identifier]["found"] for identifier in ("pt-hostlru-1x152-1MiB", "pt-warmup-1x152", "pt-step-8x144")} == {
        "inconclusive,no_growth"}


def test_the_twenty_fourth_matrix_as_it_came_out():
    """Recorded at stop 33, written down after the twenty-third was graded and before any rule was changed on
    it; graded by fe33970 (the give-backs, decided on the twenty-third). No stage wrong. Missed: three 0.5 MiB
    engine leaks at 8-16 in flight (a young process's warm-up rule at 112 requests; a rise that stayed level
    over 168, past the one-trim rule's 160; TurboMind, 43 % of 7 points at new input maxima), a vision
    preprocessing leak at 8 in flight that heap_tags.filling, held out here, left `inconclusive` (its stage's
    troughs hold the work in flight), and a 64 MiB host buffer kept once before the trim (`pt-hoststep-1x144`,
    called a leak by the analyzer of stop 32 too)."""
    as_recorded = _came_out(24, ["pt-host-engine-16x168-0.5MiB", "pt-host-engine-8x112-0.5MiB", "pt-host-vision.preprocess-8x152-0.5MiB",
                                 "pt-hoststep-1x144", "tm-host-engine-8x120-0.5MiB"], [], stages_right=7, withheld=4, slopes=7, runs=22)
    assert sum(row["allocating_right"] is True for row in as_recorded.values() if "allocating_right" in row) == 9
    # Since (stop 33, naming.allocation_stage) the allocating stage is named wherever the charges separate one;
    # and, revised on it (heap_tags.grew_once), the buffer kept once is `inconclusive`.
    # And at stop 34 (heap_tags.kept_rising, decided on the twenty-third to twenty-fifth) two engine leaks at 8-16 in
    # flight are called by their chunks.
    rows = _regraded("held_out_24", as_recorded, ("pt-host-engine-8x152-1MiB", "pt-host-engine-16x168-0.5MiB", "pt-hoststep-1x144",
                                                  "tm-host-engine-8x120-0.5MiB"), stop="stop 33")
    assert _stages_now("held_out_24") == (9, 2, 0)
    assert rows["pt-hoststep-1x144"]["found"] == "inconclusive,no_growth"
    assert [(rows[identifier]["found"], rows[identifier]["graded_at"]) for identifier in (
        "pt-host-engine-16x168-0.5MiB", "tm-host-engine-8x120-0.5MiB")] == [("host_growth", "stop 34")] * 2
    assert sorted(identifier for identifier, row in rows.items() if row["class_right"] is False) == [
        "pt-host-engine-8x112-0.5MiB", "pt-host-vision.preprocess-8x152-0.5MiB"]
    _no_negative_called_a_leak(("held_out_23", "held_out_24"), 21)


def test_the_twenty_fifth_matrix_as_it_came_out():
    """Recorded at stop 34, written down after all of stop 33's rules and graded by 493b8d1: no negative called
    a leak, no stage wrong or withheld. Missed: three leaks at 8-16 in flight that resident memory left
    `inconclusive` (a 1 MiB engine leak whose second half rose 0.19 MiB a request, two 0.5 MiB vision
    preprocessing leaks with most points at new input maxima), while the allocating stage's chunks read
    1.00, 0.61 and 0.50 MiB a request."""
    as_recorded = _came_out(25, ["pt-host-engine-16x176-1MiB", "pt-host-vision.preprocess-16x144-0.5MiB",
                                 "tm-host-vision.preprocess-8x112-0.5MiB"], [], stages_right=11, withheld=0, slopes=7, runs=20)
    assert sum(row["allocating_right"] is True for row in as_recorded.values() if "allocating_right" in row) == 11
    # Revised on it (heap_tags.kept_rising): the engine's and TurboMind's preprocessing leaks are called by their
    # chunks; the 16-in-flight preprocessing leak's chunks were given back, and it stays `inconclusive`.
    revised = ("pt-host-engine-16x176-1MiB", "tm-host-vision.preprocess-8x112-0.5MiB")
    rows = _regraded("held_out_25", as_recorded, revised, stop="stop 34")
    assert [(rows[identifier]["found"], rows[identifier]["slope_right"]) for identifier in revised] == [("host_growth", True)] * 2
    _no_negative_called_a_leak(("held_out_25",), 9)


def test_the_heap_counters_witness_is_said():
    """Where the heap counter read, the sentence says whether its bytes in use rose where resident pages did."""
    from vlmtrace.analysis.wording import verdict_sentence

    def host_sentence(identifier: str) -> str:
        analysis = analyse(MATRIX / f"{identifier}.jsonl.gz")
        (host,) = [verdict for verdict in analysis.summary.verdicts if verdict.component == "host"]
        return verdict_sentence(host, analysis.summary)

    assert host_sentence("pt-host-prompt-8x140-1MiB").startswith(
        "Host memory growth in request.prompt (60% of the rise in the run's last third), where the heap counter's bytes in use rose too:")
    assert "stage not named: resident pages rose in engine.stream, the heap's bytes in use in request.prompt" in host_sentence(
        "tm-host-prompt-1x140-0.5MiB")


def test_host_advice_follows_the_heap_counter():
    """Without the counter the advice says how to get it; where the two witnesses disagree it names both
    stages, and the advice to trace one request at a time (no help there) is not given."""
    def host_advice(identifier: str) -> tuple[str, list[str]]:
        recommendations = analyse(MATRIX / f"{identifier}.jsonl.gz").summary.recommendations
        (host,) = [r for r in recommendations if r.cause == "host_growth"]
        return host.detail, [r.action for r in recommendations]

    detail, _ = host_advice("tm-host-prompt-1x100-0.5MiB")  # eighteenth matrix: resident pages alone
    assert detail.endswith("trace again under `vlmtrace run --heap-counter`.")
    detail, actions = host_advice("tm-host-prompt-1x140-0.5MiB")  # twenty-second: the heap vetoed engine.stream
    assert "The heap counter's bytes in use rose in request.prompt, resident pages in engine.stream" in detail
    assert not any(action.startswith("Pin the stage") for action in actions)


def test_the_timeline_draws_the_heap_beside_resident_memory_where_it_was_read():
    from vlmtrace.report.figures import HEAP_LINE, timeline_figure

    def names(identifier: str) -> list[str]:
        analysis = analyse(MATRIX / f"{identifier}.jsonl.gz")
        return [trace.name for trace in timeline_figure(analysis, 0).data]

    assert HEAP_LINE in names("tm-host-prompt-1x140-0.5MiB")
    assert HEAP_LINE not in names("tm-host-prompt-1x100-0.5MiB")
