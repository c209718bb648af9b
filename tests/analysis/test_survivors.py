"""What each stage kept of what it allocated in each half of the run (survivors.py), from the heap counter's last
reading of its large chunks by stage and by when they were allocated: synthetic readings of a leak, a leak beside
a working set, a cache that drops its oldest entries, warm-up, a buffer kept once, and the window's ends."""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest

from conftest import CPU_RUNS, analyse
from vlmtrace import semconv as sc
from vlmtrace.analysis.step2_preparing.heap_readings import latest_survivors
from vlmtrace.analysis.step3_verdict.heap_tags import Charges
from vlmtrace.analysis.step3_verdict.survivors import GIVE_BACK, Kept, kept_by, last_give_back_ns, with_kept_rates
from vlmtrace.analysis.wording import verdict_sentence
from vlmtrace.report.figures import growth_figure

MiB = 1 << 20
MS = 1_000_000
ORIGIN_MS = 1_700_000_000_000
STAGE = sc.HEAP_STAGE_TAGS.index(sc.STAGE_VISION_PREPROCESS)
WIDTH_MS = 250


def _requests(count: int, every_ms: int = 100, lasting_ms: int = 400, first_ms: int = 1000) -> pd.DataFrame:
    starts = ORIGIN_MS * MS + (first_ms + np.arange(count) * every_ms) * MS
    return pd.DataFrame({"start_ns": starts, "end_ns": starts + lasting_ms * MS})


def _reading(kept_per_request: callable, requests: pd.DataFrame) -> dict:
    """What the stage still holds of each request's allocation (`kept_per_request(index)` bytes), in the interval
    the request started in."""
    row = [0] * 64
    for index, start in enumerate(requests["start_ns"]):
        row[int((start - ORIGIN_MS * MS) // (WIDTH_MS * MS))] += int(kept_per_request(index))
    rows = [[] for _ in sc.HEAP_STAGE_TAGS]
    rows[STAGE] = row
    return {"origin_ms": ORIGIN_MS, "width_ms": WIDTH_MS, "bytes": rows}


def _kept(
    kept_per_request,
    count: int = 120,
    given_back_ns: int | None = None,
    read_after_ms: int = 1000,
    requests: pd.DataFrame | None = None,
) -> Kept | None:
    requests = _requests(count) if requests is None else requests
    read_ns = int(requests["end_ns"].max()) + read_after_ms * MS
    return kept_by(STAGE, (read_ns, _reading(kept_per_request, requests)), requests, given_back_ns)


def test_a_leak_keeps_the_same_share_of_each_half():
    kept = _kept(lambda index: MiB // 2)
    assert kept is not None and kept.steady() and kept.cut_at == "the reading"
    assert kept.first == pytest.approx(MiB / 2, rel=0.02) and kept.second == pytest.approx(MiB / 2, rel=0.02)
    assert kept.requests >= 110


@pytest.mark.parametrize(
    ("name", "kept_per_request"),
    [
        (
            "a cache dropping its oldest entries: only the last 40 requests' are left",
            lambda index: MiB if index >= 80 else 0,
        ),
        ("warm-up: new entries at first, then none", lambda index: MiB if index < 30 else 0),
        (
            "a cache filling towards its bound: the second half keeps a fifth of the first's rate",
            lambda index: MiB if index < 60 else MiB // 5,
        ),
        ("a buffer kept once", lambda index: 64 * MiB if index == 50 else 0),
        ("under a leak's rate", lambda index: 64 * 1024),
    ],
)
def test_what_is_no_leak_is_not_steady(name, kept_per_request):
    kept = _kept(kept_per_request)
    assert kept is not None and not kept.steady(), name


def test_the_window_ends_at_the_stage_s_last_give_back():
    """After the last give-back the stage's working set is still in use: 1 MiB a request more, not kept for good."""
    requests = _requests(120)
    given_back = int(requests["start_ns"].iat[90])
    kept = _kept(lambda index: MiB // 2 + (MiB if index >= 90 else 0), requests=requests, given_back_ns=given_back)
    assert kept.cut_at == GIVE_BACK and kept.until_ns == given_back
    assert kept.steady() and kept.second == pytest.approx(MiB / 2, rel=0.05)
    # Not cut there, the working set reads as the second half's rise: no longer as steady as a leak
    uncut = _kept(lambda index: MiB // 2 + (MiB if index >= 90 else 0), requests=requests)
    assert uncut.second > 1.4 * uncut.first


def test_the_window_ends_where_the_requests_still_running_at_the_reading_began():
    requests = _requests(120)
    requests.loc[100:, "end_ns"] += 60_000 * MS  # still running when the reading was taken
    kept = kept_by(STAGE, (int(requests["end_ns"].iat[99]) + MS, _reading(lambda index: MiB, requests)), requests, None)
    assert kept.cut_at == "the first request still running at the reading"
    assert kept.until_ns == int(requests["start_ns"].iat[100])


def test_too_short_a_window_reads_nothing():
    assert _kept(lambda index: MiB, count=30) is None
    requests = _requests(120)
    assert _kept(lambda index: MiB, requests=requests, given_back_ns=int(requests["start_ns"].iat[30])) is None
    assert (
        kept_by(
            STAGE,
            (ORIGIN_MS * MS, {"origin_ms": ORIGIN_MS, "width_ms": WIDTH_MS, "bytes": [[] for _ in sc.HEAP_STAGE_TAGS]}),
            requests,
            None,
        )
        is None
    )


def test_the_last_give_back_is_the_point_before_the_last_fall():
    levels = np.array([np.nan, 10, 20, 30, 5, 15, 25, 40, 12, 20]) * MiB
    t_ns = np.arange(len(levels)) * 1000
    assert last_give_back_ns(levels, t_ns) == 7000
    assert last_give_back_ns(np.arange(5.0) * MiB, np.arange(5) * 1000) is None
    # A give-back the sampler saw as two smaller falls, the stage allocating on meanwhile
    split = np.array([10, 40, 33, 58.1, 52.9, 48, 48]) * MiB
    assert last_give_back_ns(split, np.arange(len(split)) * 1000) == 3000
    assert last_give_back_ns(np.array([10, 40, 35, 36, 31]) * MiB, np.arange(5) * 1000) is None


def test_the_latest_well_formed_reading_of_each_process_is_kept():
    samples = pd.DataFrame({"process": [0, 0, 1, 0], "t_ns": [10, 30, 20, 40]})
    good = {"origin_ms": ORIGIN_MS, "width_ms": WIDTH_MS, "bytes": [[] for _ in sc.HEAP_STAGE_TAGS]}
    wrong_length = {**good, "bytes": [[]]}
    latest = latest_survivors(
        samples, [(0, good), (1, {**good, "width_ms": 500}), (2, good), (3, wrong_length), (3, {"origin_ms": "x"})]
    )
    assert latest == {0: (30, {**good, "width_ms": 500}), 1: (20, good)}


def test_the_leak_s_rate_is_what_the_halves_kept():
    kept = Kept(100, 0.45 * MiB, 0.55 * MiB, 0, "the reading")
    assert kept.rate == pytest.approx(0.5 * MiB)


def _host(analysis):
    (host,) = [verdict for verdict in analysis.summary.verdicts if verdict.component == "host"]
    return host


@pytest.mark.parametrize("compressed", [True, False], ids=["line reader", "columns (DuckDB)"])
def test_a_leak_beside_a_working_set_is_read_at_what_its_stage_kept(tmp_path, compressed):
    """Recorded on the CPU: 0.5 MiB a request kept in vision.preprocess, beside 1 MiB a request given back
    every 32; at 16 in flight resident memory rises at 0.66 MiB a request, a straight line fitting its levels
    better than flat stretches between new input maxima. Both readers read it."""
    folder = CPU_RUNS / "cpu-tm-hostgiveback-vision.preprocess-16x128-0.5MiB-heap"
    if not compressed:
        (source,) = folder.glob("*.jsonl.gz")
        (tmp_path / source.name.removesuffix(".gz")).write_bytes(gzip.decompress(source.read_bytes()))
        folder = tmp_path
    analysis = analyse(folder)
    host = _host(analysis)
    assert analysis.summary.leak_found and host.klass == "host_growth" and host.stage == "vision.preprocess"
    assert host.evidence["decision"]["explanation"] == "steady leak"
    reason = host.evidence["slope_from_survivors"]
    assert reason.startswith("the rate is what the large heap chunks allocated in vision.preprocess kept of each half")
    assert host.slope_bytes_per_request == pytest.approx(MiB / 2, rel=0.1)
    assert host.evidence["resident_slope_bytes_per_request"] > 0.6 * MiB
    assert host.evidence["survivors_stage"] == "vision.preprocess"
    assert "kept of each half of the run" in verdict_sentence(host, analysis.summary)
    # The growth figure draws what the stage still held of what it allocated by each request: a leak's straight line
    kept = next(
        trace
        for trace in growth_figure(analysis).data
        if trace.name == "still held, allocated in vision.preprocess by then"
    )
    x, y = np.asarray(kept.x, dtype=float), np.asarray(kept.y, dtype=float)
    assert x[0] <= 16 and x[-1] >= 112 and np.all(np.diff(y) >= 0)
    middle = np.searchsorted(x, 64)
    assert y[middle] / x[middle] == pytest.approx(0.5, rel=0.25) and y[-1] / x[-1] > 0.4


def test_a_leak_resident_memory_called_is_read_at_what_its_stage_kept():
    """Recorded on the CPU with the heap counter, a working set given back and rebuilt: resident memory called the leak at 0.70 MiB a request, the working set in it."""
    analysis = analyse(CPU_RUNS / "cpu-tm-hostgiveback-vision.preprocess-8x120-0.5MiB-heap")
    host = _host(analysis)
    assert host.klass == "host_growth" and "class_from_survivors" not in host.evidence
    assert host.evidence["slope_from_survivors"].startswith(
        f"the rate is what the large heap chunks allocated in vision.preprocess kept of each half of the run up to {GIVE_BACK}"
    )
    assert host.slope_bytes_per_request == pytest.approx(MiB / 2, rel=0.1)
    assert host.evidence["resident_slope_bytes_per_request"] > 0.65 * MiB


def test_a_leak_beside_a_working_set_under_load_is_named_by_what_its_stage_kept():
    """Recorded by the end-to-end test beside three busy loops on two cores (a run of 96 requests at 8 in flight): the
    working set's pages raised resident memory 0.84 MiB a request, and the line through what the stage's chunks
    left at each give-back read 0.40, under half of it, so no stage was named and the rate was resident memory's.
    What the stage kept of what it allocated in each half names it and reads the leak."""
    analysis = analyse(CPU_RUNS / "cpu-tm-hostgiveback-vision.preprocess-8x96-0.5MiB-heap-loaded")
    host = _host(analysis)
    assert host.klass == "host_growth" and host.stage == "vision.preprocess", host.evidence.get("stage_uncertain")
    assert host.evidence["allocating_stage"] == "vision.preprocess"
    assert host.evidence["heap_allocated_by_stage"]["vision.preprocess"] == pytest.approx(MiB / 2, rel=0.1)
    assert host.evidence["resident_slope_bytes_per_request"] > 0.8 * MiB
    assert host.slope_bytes_per_request == pytest.approx(MiB / 2, rel=0.1)


def _charges(kept: dict[str, float | None], given_back: tuple[str, ...]) -> Charges:
    return Charges(series=None, levels={}, given_back=given_back, kept=kept)


def test_only_a_given_back_stage_s_rate_is_read_from_what_it_kept():
    """A stage that gave its chunks back is read by what it kept of each half (its halves' mean); a stage that never
    gave back keeps its slope, and without a reading, or with too short a window, the line stands."""
    requests = _requests(120)
    read_ns = int(requests["end_ns"].max()) + 1000 * MS
    reading = _reading(lambda index: MiB // 2, requests)
    sampled = pd.DataFrame({"t_ns": [read_ns], sc.STAGE_VISION_PREPROCESS: [60.0 * MiB], sc.STAGE_ENGINE_STREAM: [0.0]})
    charges = _charges(
        {sc.STAGE_VISION_PREPROCESS: 0.4 * MiB, sc.STAGE_ENGINE_STREAM: 0.3 * MiB}, (sc.STAGE_VISION_PREPROCESS,)
    )
    read = with_kept_rates(charges, sampled, (read_ns, reading), requests).kept
    assert read[sc.STAGE_VISION_PREPROCESS] == pytest.approx(MiB / 2, rel=0.02)
    assert read[sc.STAGE_ENGINE_STREAM] == 0.3 * MiB
    assert with_kept_rates(charges, sampled, None, requests) is charges
    short = _requests(30)
    assert (
        with_kept_rates(charges, sampled, (read_ns, _reading(lambda index: MiB // 2, short)), short).kept
        == charges.kept
    )


@pytest.mark.parametrize("identifier", ["cpu-tm-hostlru-12x96-1MiB-heap", "cpu-tm-giveback-8x112-heap"])
def test_a_bounded_cache_and_a_working_set_are_not_called_by_what_they_kept(identifier):
    """A 40-entry cache kept nothing of the run's first half; a working set given back every 32 requests nothing at all."""
    analysis = analyse(CPU_RUNS / identifier)
    host = _host(analysis)
    assert not analysis.summary.leak_found and host.klass != "host_growth"
    assert not {"class_from_survivors", "slope_from_survivors"} & set(host.evidence)
