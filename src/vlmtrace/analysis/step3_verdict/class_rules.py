"""The class of a component's verdict, decided in one place: an ordered list of rules, read top to bottom,
the first whose test holds decides. Each rule names its outcome, the explanation it stands for, what it
says in the JSON (`json`, with the names of the numbers in rules.py it applies) and what the report says
(`words`), the shape of OpenTelemetry's rule-based sampler (each rule a test and the decision it gives).

The evidence is what the earlier steps read (leaks.component_growth: the settled levels' shape;
verdict.component_verdict: the heap counter's charges and what each stage kept), gathered first, so that no
step sets a class another step overrides. The heap counter's readings come first: where they tell, resident
memory's shape, which holds the work in flight at each reading, does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vlmtrace.analysis import rules
from vlmtrace.analysis.registry import BELOW_THRESHOLD, INCONCLUSIVE, NO_GROWTH
from vlmtrace.analysis.step3_verdict import explanations as ex
from vlmtrace.analysis.units import format_bytes

LEAK = "leak"  # the component's own leak class (registry.BY_NAME[component].leak_class)
RECORD_REASON = "rises only at requests with a larger input than any before (a high-water mark)"
RELEASE_REASON = "rises, then is released again (torch.cuda.empty_cache, the cache guard's trims, or the allocator freeing its cache)"
LEVEL_REASON = "rose, then stayed level"
STOPPED_REASON = "stopped rising in the second half of the run"


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What decides the class of one component's verdict."""

    grows: bool  # a significant rise: above zero with 95 % confidence, more than noise and MIN_GROWTH_BYTES
    rises: bool  # above zero with 95 % confidence, however little
    plateau_reason: str | None  # why a rise is a plateau (a high-water mark, stopped, given back, level)
    unsteady: str | None  # why a significant rise cannot yet be told from a leak
    unsteady_by: str | None  # the explanation that could not be told from a leak
    beside_warmup: bool = False  # one stage kept rising while the rest of a young process settled
    # Host memory of a process that may run the PyTorch engine, read from its first request: LMDeploy's own host
    # warm-up there rises ~1 MiB a request after a level start, and is given back at its heap trim. What the
    # levels did before the current regime (a level start, a fall) does not lift that rise to a leak.
    host_warm_up: bool = False
    kept_through_trim: bool = False  # a young process kept KEPT_ACROSS_TRIM_BYTES across LMDeploy's first heap trim
    trims: int = 0  # LMDeploy's heap trims the rate was read across
    onset: str | None = (
        None  # "request ~N (hh:mm)" where the current growth regime, rising faster and giving nothing back, began
    )
    stopped: str | None = None  # "request ~N (hh:mm)" where the last rising regime ended, the current one level
    # The heap counter's readings (host memory with the heap counter loaded; None where they do not tell):
    kept_by_stage: str | None = None  # the allocating stage kept as much of each half of the run
    filling: str | None = None  # the allocating stage's chunks kept less after each give-back
    grew_once: str | None = None  # the heap's bytes in use jumped once and stayed level
    allocations_rising: str | None = None  # the allocating stage's chunks still in use pass the leak tests


@dataclasses.dataclass(frozen=True)
class ClassRule:
    name: str
    outcome: str  # LEAK, INCONCLUSIVE, BELOW_THRESHOLD or NO_GROWTH
    applies: Callable[[Evidence], bool]
    json: str
    words: str


@dataclasses.dataclass(frozen=True)
class Decision:
    rule: ClassRule
    klass: str
    json: str  # "<explanation>: <the rule in rules.py's names>"
    words: str  # the rule in a sentence a user reads

    @property
    def explanation(self) -> str:
        """What the series is (explanations.py's names), or "no rise", "slight rise"."""
        return self.json.split(":", 1)[0]


def _grows_steadily(evidence: Evidence) -> bool:
    return evidence.grows and evidence.plateau_reason is None and evidence.unsteady is None


RULES: tuple[ClassRule, ...] = (
    ClassRule(
        "KEPT_BY_STAGE",
        LEAK,
        lambda e: e.kept_by_stage is not None,
        f"{ex.STEADY_LEAK}: the stage kept the same share of what it allocated in both halves of the run",
        "the stage that allocated it kept as much of what it allocated in the second half of the run as in the first",
    ),
    ClassRule(
        "FILLING",
        INCONCLUSIVE,
        lambda e: e.filling is not None,
        f"{ex.BOUNDED_CACHE}: the allocating stage's chunks rise ever slower",
        "what the allocating stage kept grew more slowly after each give-back, as a cache filling towards its bound does",
    ),
    ClassRule(
        "GREW_ONCE",
        INCONCLUSIVE,
        lambda e: e.grew_once is not None,
        f"{ex.ONE_OFF_STEP}: the heap grew once and has stayed level since",
        "the heap grew once and has stayed level since",
    ),
    ClassRule(
        "ALLOCATIONS_RISING",
        LEAK,
        lambda e: e.allocations_rising is not None,
        f"{ex.STEADY_LEAK}: the large heap chunks one stage allocated and still holds rose steadily",
        "the large heap chunks one stage allocated and still holds kept rising at the same rate in both halves of the run",
    ),
    ClassRule(
        "STAGE_BESIDE_WARM_UP",
        LEAK,
        lambda e: _grows_steadily(e) and e.beside_warmup,
        f"{ex.STEADY_LEAK}: one stage keeps rising at a leak's rate while the rest of the process settles",
        "one stage kept rising at a leak's rate while the rest of the process settled after LMDeploy's warm-up",
    ),
    ClassRule(
        "KEPT_ACROSS_TRIM",
        LEAK,
        lambda e: _grows_steadily(e) and e.kept_through_trim,
        f"{ex.STEADY_LEAK}: kept KEPT_ACROSS_TRIM_BYTES or more across LMDeploy's first heap trim",
        f"the process kept {format_bytes(rules.KEPT_ACROSS_TRIM_BYTES)} or more across LMDeploy's first heap trim",
    ),
    ClassRule(
        "KEPT_ACROSS_TRIMS",
        LEAK,
        lambda e: _grows_steadily(e) and e.trims >= 2,
        f"{ex.STEADY_LEAK}: what the heap kept rose steadily across LMDeploy's heap trims",
        "what the heap kept after each of LMDeploy's heap trims rose steadily",
    ),
    ClassRule(
        "STOPPED_RISING",
        NO_GROWTH,
        lambda e: (
            e.grows
            and e.plateau_reason is None
            and e.stopped is not None
            and (e.unsteady is None or (e.unsteady_by == ex.WARM_UP and not e.host_warm_up))
            and e.trims == 0
            and not e.beside_warmup
            and not e.kept_through_trim
        ),
        f"{ex.PLATEAU}: the current growth regime does not rise (REGIME_MARGIN, MIN_REGIME_SHARE), an earlier one did",
        "it rose until {stopped} and has stayed level since",
    ),
    ClassRule(
        "GROWING_SINCE",
        LEAK,
        lambda e: (
            e.onset is not None
            and not e.beside_warmup
            and not e.kept_through_trim
            and e.trims == 0
            and (
                (e.unsteady is None and e.plateau_reason is None)
                or (not e.host_warm_up and e.plateau_reason in (None, LEVEL_REASON))
            )
        ),
        f"{ex.STEADY_LEAK}: the current growth regime rises by more than MIN_GROWTH_BYTES and NOISE_MULTIPLE × its "
        "noise, faster than the one before (REGIME_MARGIN, MIN_REGIME_SHARE)",
        "it has been rising since {onset}, faster than before: the rate is read from then on",
    ),
    ClassRule(
        "STEADY_RISE",
        LEAK,
        _grows_steadily,
        f"{ex.STEADY_LEAK}: rises by more than MIN_GROWTH_BYTES and NOISE_MULTIPLE × its noise, its second half "
        "keeping STEADY_RATIO of the first half's rate",
        "it rose by more than its noise and kept rising at about the same rate in both halves of the run",
    ),
    ClassRule(
        "UNSTEADY",
        INCONCLUSIVE,
        lambda e: e.unsteady is not None,
        "{explanation}: cannot be told from a steady leak on this run",
        "a {explanation} fits this run about as well as a steady leak",
    ),
    ClassRule(
        "SLIGHT_RISE",
        BELOW_THRESHOLD,
        lambda e: e.plateau_reason is None and e.rises,
        "slight rise: above zero with 95% confidence, under MIN_GROWTH_BYTES or the component's minimum leak rate",
        "it rises, but by less over the run than is worth calling a leak",
    ),
    ClassRule(
        "NO_RISE",
        NO_GROWTH,
        lambda e: e.plateau_reason is None,
        "no rise: the slope's 95% interval includes zero",
        "it did not rise: its rate per request may well be zero",
    ),
    ClassRule(
        "HIGH_WATER_MARK",
        NO_GROWTH,
        lambda e: e.plateau_reason == RECORD_REASON,
        f"{ex.HIGH_WATER_MARK}: flat between new input maxima, a rise within those stretches fitting no better",
        "it rose only at requests bringing a larger input than any before, and stayed level between them",
    ),
    ClassRule(
        "GIVEN_BACK",
        NO_GROWTH,
        lambda e: e.plateau_reason == RELEASE_REASON,
        f"{ex.GIVEN_BACK}: fell back by MIN_GROWTH_BYTES or more at least twice",
        f"it fell back by {format_bytes(rules.MIN_GROWTH_BYTES)} or more at least twice",
    ),
    ClassRule(
        "LEVEL",
        NO_GROWTH,
        lambda e: e.plateau_reason == LEVEL_REASON,
        f"{ex.PLATEAU}: not a significant rise, its second half above where it began",
        "it rose early on and has stayed level since",
    ),
    ClassRule(
        "STOPPED",
        NO_GROWTH,
        lambda e: True,
        f"{ex.PLATEAU}: its second half rises under TAIL_FLAT_RATIO of the run's slope",
        "it rose, then stopped rising in the second half of the run",
    ),
)


def decide(evidence: Evidence, leak_class: str) -> Decision:
    """The first rule whose test holds (the last holds always)."""
    rule = next(rule for rule in RULES if rule.applies(evidence))
    said = {"explanation": evidence.unsteady_by or "", "onset": evidence.onset, "stopped": evidence.stopped}
    return Decision(
        rule, leak_class if rule.outcome == LEAK else rule.outcome, rule.json.format(**said), rule.words.format(**said)
    )
