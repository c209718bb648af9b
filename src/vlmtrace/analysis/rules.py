"""Every number that decides a verdict, in one table: its value, unit, what it means, and the kind of run
it guards against. The analysis modules import these names; tests/analysis/test_rules.py fails when a
number deciding a verdict is written anywhere else. `docs/analysis.md` explains the rules they belong to.

Each entry is a `Rule`; the module-level name holds its value, so a step reads `rules.MIN_GROWTH_BYTES`
as a plain number, and `TABLE` lists them all (for the docs and the test).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

KiB = 1024
MiB = 1024 * KiB


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    value: float
    unit: str
    means: str
    guards_against: str


TABLE: list[Rule] = []
Number = TypeVar("Number", int, float)  # a count stays an int, a rate or ratio a float


def _rule(name: str, value: Number, unit: str, means: str, guards_against: str) -> Number:
    TABLE.append(Rule(name, value, unit, means, guards_against))
    return value


# --- Growth and its class (step3_verdict/leaks.py) ---------------------------------------------------------
MIN_POINTS_TO_FIT = _rule(
    "MIN_POINTS_TO_FIT",
    5,
    "settled levels",
    "a component with fewer readable settled levels gets no verdict at all",
    "a trace with a handful of requests, where any line is noise",
)
MIN_GROWTH_BYTES = _rule(
    "MIN_GROWTH_BYTES",
    8 * MiB,
    "bytes",
    "growth over the whole run below this is not worth a verdict (and a fall this large is memory given back)",
    "short runs whose rise is one allocator block or one buffer more at the end",
)
NOISE_MULTIPLE = _rule(
    "NOISE_MULTIPLE",
    3.0,
    "noise standard deviations",
    "growth over the run must exceed this many robust standard deviations of the levels around the line",
    "noisy host readings (RSS under load) whose slope interval barely clears zero",
)
WARMUP_FRACTION = _rule(
    "WARMUP_FRACTION",
    0.05,
    "share of points",
    "the first settled levels left out of the fit (CUDA context, workspaces, the first cache fill)",
    "a first request that allocates once what every later one reuses",
)
TAIL_FLAT_RATIO = _rule(
    "TAIL_FLAT_RATIO",
    0.25,
    "share of the overall slope",
    "a second half rising at under this share of the whole run's slope (and not above zero) stopped rising",
    "a plateau: memory that rose early, then stayed level",
)
STEADY_RATIO = _rule(
    "STEADY_RATIO",
    0.6,
    "share of the first half's rate",
    "a leak keeps its rate: a second half under this share of the first half's is slowing down",
    "warm-up and a cache filling towards its bound, which decay within the run",
)
GIVE_BACK_SHARE = _rule(
    "GIVE_BACK_SHARE",
    1 / 3,
    "share of the rise",
    "an idle level falling this share of its rise below its high-water level gave memory back",
    "a bounded working set (fragmentation, a tensor cache) that evicts and refills",
)
GIVE_BACK_FREQUENCY = _rule(
    "GIVE_BACK_FREQUENCY",
    0.1,
    "share of steps",
    "idle levels falling by MIN_GROWTH_BYTES at this share of their steps gave memory back",
    "a cache that evicts often by small amounts; a leak's idle level never falls so",
)
MAX_SETTLE_RUNS = _rule(
    "MAX_SETTLE_RUNS",
    20,
    "run lengths",
    "the estimate of how many more requests would settle a slowing rise stops at this many run lengths",
    "a rise that barely slows, whose estimate would run to millions of requests",
)
YOUNG_REQUESTS = _rule(
    "YOUNG_REQUESTS",
    200,
    "requests",
    "within a PyTorch-engine process's first requests, slow host growth names no stage (LMDeploy's warm-up holds as much)",
    "LMDeploy's own host warm-up (~1 MiB a request) charged to whichever stage ran",
)
YOUNG_CLASS_REQUESTS = _rule(
    "YOUNG_CLASS_REQUESTS",
    160,
    "requests",
    "within a PyTorch-engine process's first requests, host growth below WARMUP_HOST_RATE is inconclusive",
    "LMDeploy's host warm-up read as a leak on a short run",
)
WARMUP_HOST_RATE = _rule(
    "WARMUP_HOST_RATE",
    2 * MiB,
    "bytes per request",
    "host growth this fast or faster is more than LMDeploy's own warm-up",
    "a young process's warm-up, which rises up to ~1.2 MiB a request",
)
KEPT_ACROSS_TRIM_BYTES = _rule(
    "KEPT_ACROSS_TRIM_BYTES",
    24 * MiB,
    "bytes",
    "a young process's lowest host level after LMDeploy's first heap trim, this far above its start, is kept",
    "the warm-up's few MiB kept through the trim, read as a leak",
)
HOST_MIN_LEAK_RATE = _rule(
    "HOST_MIN_LEAK_RATE",
    128 * KiB,
    "bytes per request",
    "host growth slower than this per request is not a leak however long the run",
    "LMDeploy's own host memory, which grows ~30-45 KiB a request for thousands of requests",
)

# --- Competing explanations of a rising series (step3_verdict/explanations.py) ------------------------------
FIT_MARGIN = _rule(
    "FIT_MARGIN",
    2.0,
    "BIC units",
    "an explanation wins over another only when its Bayesian information criterion is lower by this much",
    "a shape chosen over a straight line by a difference the points' scatter explains",
)
EXACT_FIT = _rule(
    "EXACT_FIT",
    1e-3,
    "share of the rise",
    "a straight line whose residuals stay under this share of the rise fits exactly: no rule on input maxima withholds it",
    "a steady leak at every request read as a high-water mark because its calls are large",
)

SHORTEST_WARM_UP = _rule(
    "SHORTEST_WARM_UP",
    1 / 30,
    "share of the run",
    "the shortest time constant a saturating warm-up is fitted with (shorter is a one-off step)",
    "a jump read as a warm-up",
)
LONGEST_WARM_UP = _rule(
    "LONGEST_WARM_UP",
    1 / 2,
    "share of the run",
    "the longest time constant a saturating warm-up is fitted with (longer cannot be told from a line within the run)",
    "a steady leak read as a warm-up that has not bent yet",
)
MAX_STRETCH_SHARE = _rule(
    "MAX_STRETCH_SHARE",
    0.5,
    "levels per point",
    "a high-water mark needing this share of the points as levels or more (one per stretch between new input "
    "maxima) is not fitted: it would pass through every point",
    "large calls, where nearly every request lies beside a new input maximum whatever the cause",
)

# --- Growth regimes (step3_verdict/regimes.py) -----------------------------------------------------------
REGIME_MARGIN = _rule(
    "REGIME_MARGIN",
    10.0,
    "BIC units",
    "a split into one more growth regime is kept only when it lowers the information criterion by this much",
    "noise read as a change of rate, a steady leak split into regimes",
)
MAX_REGIMES = _rule(
    "MAX_REGIMES",
    4,
    "regimes",
    "the settled levels are split into at most this many growth regimes",
    "a sawtooth or a staircase cut at every tooth",
)
REGIME_RATIO = _rule(
    "REGIME_RATIO",
    2.0,
    "times the slower rate",
    "neighbouring growth regimes are one unless the faster rises at least this many times the slower's rate (or the slower does not rise)",
    "a leak whose rate follows its inputs (a larger image keeps more) read as a change of rate",
)
MIN_REGIME_SHARE = _rule(
    "MIN_REGIME_SHARE",
    0.1,
    "share of points",
    "a growth regime holds at least this share of the settled levels (and MIN_POINTS_TO_FIT)",
    "a rate read from the last few requests, an outlier made a regime",
)

# --- Settled levels and the stage (step2_preparing) ----------------------------------------------------------
MIN_SETTLED_POINTS = _rule(
    "MIN_SETTLED_POINTS",
    8,
    "busy periods",
    "fewer busy periods, and the levels are read under load rather than between requests",
    "a trace too short for the idle regime",
)
IDLE_COVERAGE = _rule(
    "IDLE_COVERAGE",
    0.8,
    "share of busy periods",
    "busy periods followed by a quiet reading at least this often are read in the idle regime",
    "a service under continuous load whose 'idle' readings hold requests in flight",
)
MIN_CORRELATION = _rule(
    "MIN_CORRELATION",
    0.3,
    "correlation",
    "a correlation weaker than this ties neither a releasing stage to an allocating one nor an input feature to retained bytes",
    "chance correlation between two unrelated series",
)
DRIVER_SIGNIFICANCE = _rule(
    "DRIVER_SIGNIFICANCE",
    2.6,
    "standard errors",
    "a rank correlation must also exceed this many standard errors (1/sqrt(points)) to name an input feature",
    "short runs where a correlation of 0.3 is chance",
)
MIN_DRIVER_POINTS = _rule(
    "MIN_DRIVER_POINTS",
    10,
    "settled levels",
    "fewer points, and no input feature is named as driving the retained bytes",
    "a handful of requests whose inputs happen to line up with memory",
)
MIN_SOLE_INTERVALS = _rule(
    "MIN_SOLE_INTERVALS",
    5,
    "intervals",
    "a stage alone in fewer intervals has no rate of its own (the others' median stands in)",
    "a stage seen alone once, whose one change would set its rate",
)
RATE_FLOOR = _rule(
    "RATE_FLOOR",
    1e-3,
    "share of the largest rate",
    "a stage with no rate of its own still takes this sliver of what it alone could have done",
    "a stage never charged because it never ran alone",
)
GAIN_BYTES = _rule(
    "GAIN_BYTES",
    64 * KiB,
    "bytes",
    "a releasing stage gained memory itself in a window when it gained more than this",
    "rounding and allocator noise counted as a gain",
)
GAIN_SHARE = _rule(
    "GAIN_SHARE",
    0.25,
    "share of what the allocating stage kept per window",
    "a releasing stage gained memory itself in a window only when it gained more than this share of what the stage "
    "that handed it memory kept per window",
    "a leak's stage withheld for the few hundred KiB that intervals shared under CPU load charge beside it",
)
STAGE_SHARE_MIN = _rule(
    "STAGE_SHARE_MIN",
    0.5,
    "share of what the stages retained",
    "a stage is named only when it holds at least this share of what the stages retained",
    "naming one stage of several that kept about as much",
)
SEPARATION = _rule(
    "SEPARATION",
    2.0,
    "times the runner-up stage",
    "a stage is named only when it holds this many times what the next stage holds",
    "two stages the trace cannot separate, one named by a coin toss",
)
SAMPLED_STAGE_SHARE_MIN = _rule(
    "SAMPLED_STAGE_SHARE_MIN",
    2 / 3,
    "share of what the stages retained",
    "read by the sampler (several requests' every stage per interval), a stage must hold this share to be named",
    "a stage named from coarse readings that span many stages",
)
SHARED_CHARGE_SHARE = _rule(
    "SHARED_CHARGE_SHARE",
    0.5,
    "share of the stage's net change",
    "a host stage charged this share or more in intervals other stages ran in too is named only where its charges "
    "in the intervals it ran alone separate it as well (STAGE_SHARE_MIN, SEPARATION)",
    "a leak charged to the stage that runs beside every other (TurboMind's stream) by the estimated split",
)
QUIET_CHARGE_BYTES = _rule(
    "QUIET_CHARGE_BYTES",
    64 * KiB,
    "bytes",
    "a call whose charge to the stage stays within this of zero is quiet",
    "a small heap leak at one prompt in flight, charged to a stage that holds nothing most calls",
)
SPORADIC_SHARE = _rule(
    "SPORADIC_SHARE",
    0.25,
    "share of calls",
    "a host stage quiet in this share of the calls or more is sporadic and not named",
    "a stage named for a few large charges a leak's stage never shows",
)
MIN_SPORADIC_WINDOWS = _rule(
    "MIN_SPORADIC_WINDOWS",
    8,
    "calls",
    "fewer calls, and the sporadic-stage rule does not apply",
    "a share of quiet calls read from a handful of them",
)
HANDED_SHARE = _rule(
    "HANDED_SHARE",
    0.1,
    "share of what the stage kept",
    "a stage that freed this share of another's bytes took part in a hand-off",
    "a stage named for bytes another stage frees",
)
RELEASER_GAINS = _rule(
    "RELEASER_GAINS",
    0.05,
    "share of windows",
    "a releasing stage that gains memory itself this often may hold what it was handed: no stage is named",
    "a hand-off read as one stage keeping everything",
)
HEAP_EXPLAINS = _rule(
    "HEAP_EXPLAINS",
    0.5,
    "share of the resident rise",
    "the heap's rise, at least this share of the resident rise, lets the heap counter place host growth",
    "resident pages (mmap, libraries) the heap counter does not see",
)
STEPWISE_SHARE = _rule(
    "STEPWISE_SHARE",
    0.8,
    "share of span readings",
    "span readings repeating the sampler's reading this often change only with the samples",
    "span readings read as finer than they are",
)
MIN_SAMPLED_BOUNDARIES = _rule(
    "MIN_SAMPLED_BOUNDARIES",
    10,
    "span boundaries",
    "fewer span boundaries with readings, and their reading step is not judged",
    "a step read from a handful of readings",
)
RECORDED_READ_TIMES = _rule(
    "RECORDED_READ_TIMES",
    0.5,
    "share of readings",
    "readings whose read time differs from the span time this often were read by vlmtrace's own probe",
    "a trace from another recorder, whose read times are the span times",
)
CONTAINER_SHARE = _rule(
    "CONTAINER_SHARE",
    0.5,
    "share of a stage's spans",
    "a stage with a child in this share of its spans holds other stages' work (a container)",
    "a request span charged with everything its stages kept",
)

# --- The allocating stage (step3_verdict/heap_tags.py, survivors.py, stage_rise.py) -----------------------
MIN_STAGE_RATE = _rule(
    "MIN_STAGE_RATE",
    1024,
    "bytes per request",
    "below this, a stage's heap chunks did not grow",
    "one buffer more at the end of a run",
)
HEAP_GROWTH_EXPLAINED = _rule(
    "HEAP_GROWTH_EXPLAINED",
    0.9,
    "share of the heap's growth",
    "the allocating stage's charges are what the heap grew by where they are at least this share of it",
    "chunks charged to the wrong stage in an asyncio task switch (up to 7 %)",
)
MIN_CHARGED_POINTS = _rule(
    "MIN_CHARGED_POINTS",
    5,
    "settled levels",
    "fewer settled levels with the heap counter's charges, and the charges are not read",
    "a process that loaded the heap counter late",
)
MIN_TROUGHS = _rule(
    "MIN_TROUGHS",
    3,
    "levels",
    "the kept rate across heap trims needs at least this many levels that hold only what was kept",
    "a rate read from two points",
)
MIN_HALF_REQUESTS = _rule(
    "MIN_HALF_REQUESTS",
    20,
    "requests",
    "each half of the chunks' births must hold this many requests",
    "a half that is a few calls of the work in flight",
)
MIN_BIRTH_REQUESTS = _rule(
    "MIN_BIRTH_REQUESTS",
    5,
    "requests",
    "fewer requests started before the last reading, and what each stage kept is not read",
    "a process that ended before its first calls",
)
SETTLED_SHARE = _rule(
    "SETTLED_SHARE",
    0.1,
    "share of the candidate's gain",
    "the rest of the process counts as settled from where it gains under this share of the rising stage",
    "LMDeploy's warm-up still rising beside a leak",
)
MIN_AFTER = _rule(
    "MIN_AFTER",
    4,
    "calls",
    "fewer calls after the rest settled, and the whole run is fitted",
    "a stage's rate read from the last few calls",
)
PARTS = _rule(
    "PARTS",
    3,
    "parts of the run",
    "the first and the last of this many parts are compared: LMDeploy's warm-up is front-loaded",
    "a warm-up stage read as rising steadily",
)
CLEAR_SEPARATION = _rule(
    "CLEAR_SEPARATION",
    3.0,
    "times the next stage",
    "a stage whose last-part growth is this many times the next stage's needs no settled rest",
    "a leak beside a warm-up that never settles within the run",
)
MIN_STAGE_CALLS = _rule(
    "MIN_STAGE_CALLS",
    8,
    "calls",
    "fewer calls, and no stage's own rise is read",
    "a stage rise read from a handful of calls",
)

# --- The outlook (step4_outlook) -------------------------------------------------------------------------
MIN_COMPARED_REQUESTS = _rule(
    "MIN_COMPARED_REQUESTS",
    10,
    "requests",
    "the latency after a cache release is compared with the others only with this many requests on each side",
    "a block's first request alone standing for 'the others'",
)

# --- Allocation sites (step4_outlook/allocation_sites.py) ----------------------------------------------------
SITE_STAGE_EXPLAINS = _rule(
    "SITE_STAGE_EXPLAINS",
    0.8,
    "share of the rate",
    "where the spans cannot tell which stage held a growth, a capture window's sites of one stage name it when "
    "they explain at least this share of the verdict's rate (and SEPARATION × any other stage's sites)",
    "a stage named from a window that saw a small part of the growth, or several stages' allocations",
)
SITES_EXPLAIN = _rule(
    "SITES_EXPLAIN",
    0.5,
    "share of the rate",
    "a host verdict whose allocation sites explain less of its rate says the rest is outside Python's heap",
    "a leak in a C extension or native library read as the few Python sites a capture window saw",
)
