"""Memory a working set gives back, on the PyTorch engine: LMDeploy's image preprocessing keeps ~1 MiB a
request of large heap chunks until a garbage collection or its heap trim (at its 128th session) frees them
(docs/analysis.md, "Give-backs"):
- a leak whose level the trim lowered in the run's second half keeps rising after it: not a plateau
  (rise_shapes.plateau_reason, its second half measured within the stretches a fall leaves);
- chunks another stage gave back are not what a leak's own chunks must account for, nor growth of that
  stage (heap_tags._kept_rate);
- a stage whose chunks settled between give-backs keeps a rise read across one fall of resident memory
  `inconclusive` (heap_tags.filling)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from conftest import GPU_RUNS, analyse
from vlmtrace.analysis.robust import Slope
from vlmtrace.analysis.step2_preparing.settle import SettledSeries
from vlmtrace.analysis.step3_verdict import heap_tags
from vlmtrace.analysis.step3_verdict.leaks import ComponentGrowth

MiB = 1 << 20


def host_verdict(identifier: str):
    summary = analyse(GPU_RUNS / f"{identifier}.jsonl.gz").summary
    (host,) = [verdict for verdict in summary.verdicts if verdict.component == "host"]
    return summary, host


def test_a_leak_the_trim_lowered_in_the_second_half_is_read_from_its_own_chunks():
    """0.5 MiB a request in the engine's forward at 8 in flight, 144 requests: resident memory fell 104 MiB at
    the trim (request 128). Read through every level it looks like a plateau ("stopped rising in the second
    half"), at 1.43 MiB a request; the engine's chunks rose 0.500 MiB a request and were never given back,
    and the preprocessing working set (0.93 MiB a request through every level) was."""
    summary, host = host_verdict("pt-host-engine-8x144-0.5MiB")
    assert summary.leak_found and host.klass == "host_growth"
    assert host.evidence["allocating_stage"] == "engine.forward"
    assert "slope_from_allocations" in host.evidence
    assert abs(host.slope_bytes_per_request / MiB - 0.5) < 0.01


def test_a_cache_filled_before_the_trim_is_not_called_a_leak():
    """A 40 MiB host cache in vision preprocessing, full at request 40, at one prompt in flight: resident
    memory fell once (the trim) and kept 39 MiB, which a line through the troughs reads as a 0.31 MiB-a-request leak. The
    stage's chunks were given back twice (a garbage collection at request 24, the trim): they kept 1.04 MiB
    a request up to the first and 0.15 after it."""
    summary, host = host_verdict("pt-hostlru-1x152-1MiB")
    assert not summary.leak_found and host.klass == "inconclusive"
    reason = host.evidence["inconclusive_reason"]
    assert reason.startswith(
        "the large heap chunks allocated in vision.preprocess kept +1.04 MiB per request up to their "
        "first give-back and +146.5 KiB after it: slowing"
    )


def test_a_leak_whose_stage_gives_its_working_set_back_stays_a_leak():
    """0.5 MiB a request in vision preprocessing, the working set's own stage, one prompt in flight: its chunks
    fell at a garbage collection (request 70) and, over two readings, at the trim (127-128), and what each
    give-back left rose at the leak's rate both times. A fall that straddles a reading is one give-back: read
    as two, the second trough lay one request after the first and 42 MiB below it."""
    summary, host = host_verdict("pt-host-vision.preprocess-1x144-0.5MiB")
    assert summary.leak_found and host.klass == "host_growth"
    assert host.evidence["allocating_stage"] == "vision.preprocess"
    assert abs(host.slope_bytes_per_request / MiB - 0.5) < 0.05


def _series(points: int) -> SettledSeries:
    x = np.arange(1, points + 1, dtype=float)
    features = pd.DataFrame({"input_tokens_max": np.full(points, 300.0)})
    return SettledSeries("idle", np.arange(points), x, (x * 1e9).astype(np.int64) + 500_000_000, features, 1.0)


def _growth(series: SettledSeries, trims: int) -> ComponentGrowth:
    fit = Slope(slope=0.5 * MiB, low=0.4 * MiB, high=0.6 * MiB, intercept=0.0, points=len(series.x), noise=0.0)
    return ComponentGrowth(
        process=0,
        component="host",
        klass="host_growth",
        per_request=fit,
        per_second=None,
        growth_bytes=64 * MiB,
        plateau=False,
        plateau_reason=None,
        points=len(series.x),
        first_point=0,
        record_increase_share=None,
        tail=None,
        x=series.x,
        y=series.x * fit.slope,
        t_ns=series.t_ns,
        features=series.features,
        trims=trims,
    )


def _samples(levels: np.ndarray, stage: str) -> pd.DataFrame:
    frame = pd.DataFrame({"process": 0, "t_ns": (np.arange(1, len(levels) + 1) * 1e9).astype(np.int64)})
    for name in heap_tags.STAGES:
        frame[name] = levels if name == stage else 0.0
    return frame


def _saw_tooth(kept_per_request: np.ndarray, falls_at: tuple[int, ...]) -> np.ndarray:
    """A stage's chunks: what it kept (cumulative `kept_per_request`) plus a working set of 1 MiB a request
    given back at `falls_at`."""
    working, level = [], 0.0
    for request in range(len(kept_per_request)):
        level = 0.0 if request in falls_at else level + MiB
        working.append(level)
    return np.cumsum(kept_per_request) + np.asarray(working)


def test_filling_needs_the_stage_to_settle_between_give_backs():
    """Synthetic: 150 requests, give-backs at 50 and 100. A cache of 0.8 MiB a request for 40 requests is
    settling; a steady 0.5 MiB a request is not; and the rule reads only a rise resident memory's rate was
    read across one fall of."""
    series, stage = _series(150), "vision.preprocess"
    cache = _saw_tooth(np.where(np.arange(150) < 40, 0.8 * MiB, 0.0), (50, 100))
    leak = _saw_tooth(np.full(150, 0.5 * MiB), (50, 100))
    assert heap_tags.filling(
        _growth(series, trims=1), heap_tags.at_settled_points(_samples(cache, stage), series), stage
    ).startswith("the large heap chunks allocated in vision.preprocess kept")
    assert (
        heap_tags.filling(_growth(series, trims=1), heap_tags.at_settled_points(_samples(leak, stage), series), stage)
        is None
    )
    assert (
        heap_tags.filling(_growth(series, trims=0), heap_tags.at_settled_points(_samples(cache, stage), series), stage)
        is None
    )
    assert (
        heap_tags.filling(_growth(series, trims=1), heap_tags.at_settled_points(_samples(cache, stage), series), None)
        is None
    )


def test_a_buffer_kept_once_before_the_trim_is_not_called_a_leak():
    """64 MiB of host memory kept once, at request 48, at one prompt in flight: resident
    memory kept it across the trim, which the one-trim rule read as a 0.47 MiB-a-request leak. The heap's bytes
    in use, without the preprocessing working set its stage gave back, rose by that one jump and stayed level
    on either side (heap_tags.grew_once)."""
    summary, host = host_verdict("pt-hoststep-1x144")
    assert not summary.leak_found and host.klass == "inconclusive"
    assert host.evidence["inconclusive_reason"].startswith("the heap's bytes in use rose by 64.")
    assert "memory kept once, not a leak" in host.evidence["inconclusive_reason"]


def test_a_leak_beside_a_working_set_given_back_is_not_one_jump():
    """0.5 MiB a request in prompt processing at one prompt in flight: the heap's bytes in use, less the
    working set, jump where a garbage collection freed it before the charges' next sample, but they rise on
    either side of that jump: still a leak."""
    summary, host = host_verdict("pt-host-prompt-1x136-0.5MiB")
    assert summary.leak_found and host.klass == "host_growth"
