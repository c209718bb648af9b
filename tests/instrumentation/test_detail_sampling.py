"""`detail_every`: LMDeploy 0.18's real pipeline (stand-in TurboMind on the CPU) records every request's span
and readings, and the stage detail (the vision encoder's and TurboMind's stream spans, the prompt's end
reading, the sampling parameters) of the young requests, of every request while growth is suspected, and of
1 in K otherwise; the journal's header and the report say so."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
from lmdeploy import GenerationConfig
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import vlmtrace
from tests.export.journal_lines import journal_files
from tests.instrumentation.conftest import cpu_pipeline, exporter, image, standin_engines  # noqa: F401 - fixtures
from tests.support.spans import finished
from vlmtrace import semconv as sc
from vlmtrace.analysis import rules
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.wording import headline
from vlmtrace.capture.controller import AUTO, Bounds, CaptureController
from vlmtrace.capture.suspicion import Suspicion
from vlmtrace.config import Options
from vlmtrace.instrumentation import detail

GEN = GenerationConfig(max_new_tokens=4, top_k=1)
MiB = 1 << 20


def test_detail_every_is_read_from_the_keyword_and_the_variable_and_a_bad_value_keeps_every_request(caplog):
    assert Options.resolve({}, environ={}).detail_every == 1
    assert Options.resolve({}, environ={"VLMTRACE_DETAIL_EVERY": "16"}).detail_every == 16
    assert Options.resolve({"detail_every": 4}, environ={"VLMTRACE_DETAIL_EVERY": "16"}).detail_every == 4
    with caplog.at_level(logging.WARNING, logger="vlmtrace"):
        assert Options.resolve({}, environ={"VLMTRACE_DETAIL_EVERY": "0"}).detail_every == 1
        assert Options.resolve({"detail_every": True}, environ={}).detail_every == 1
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2 and "VLMTRACE_DETAIL_EVERY='0'" in warnings[0] and "detail_every=True" in warnings[1]


def test_the_young_requests_hold_three_of_the_analyzers_young_process():
    assert detail.YOUNG_REQUESTS == 3 * rules.YOUNG_REQUESTS and rules.YOUNG_REQUESTS >= rules.YOUNG_CLASS_REQUESTS


def _session(exporter, journal, every: int):  # noqa: F811
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return vlmtrace.instrument(tracer_provider=provider, journal=str(journal), sample_interval_ms=0, detail_every=every)


def _requests(pipe, count: int) -> None:
    for index in range(count):  # one at a time: the requests start in this order
        pipe([("describe this image", image(64, 48, index))], gen_config=GEN)


def _recorded(exporter) -> list[tuple[bool, set[str]]]:  # noqa: F811
    """Per request span, in start order: whether it says its detail was skipped, and its children's names."""
    spans = finished(exporter)
    children: dict[int, set[str]] = {}
    for span in spans:
        if span.parent is not None:
            children.setdefault(span.parent.span_id, set()).add(span.name)
    requests = sorted((s for s in spans if s.attributes.get(sc.STAGE) == sc.STAGE_REQUEST), key=lambda s: s.start_time)
    for span in requests:
        skipped = span.attributes.get(sc.REQUEST_DETAIL_SKIPPED) == 1
        has_detail = sc.GEN_AI_REQUEST_MAX_TOKENS in span.attributes and any(
            key in span.attributes for key in sc.PROMPT_END_KEYS.values()
        )
        assert skipped != has_detail  # a request has its detail, or says it has none
        assert sc.MEM_HOST_RSS in span.attributes and sc.GEN_AI_USAGE_INPUT_TOKENS in span.attributes
    return [
        (span.attributes.get(sc.REQUEST_DETAIL_SKIPPED) == 1, children.get(span.context.span_id, set()))
        for span in requests
    ]


@pytest.mark.lmdeploy
def test_young_requests_record_their_detail_and_1_in_k_after(cpu_pipeline, exporter, tmp_path):  # noqa: F811
    session = _session(exporter, tmp_path / "journal", 4)
    try:
        session.telemetry.detail.young = 5  # the product's 200, shortened
        _requests(cpu_pipeline, 14)
    finally:
        vlmtrace.uninstrument()
    recorded = _recorded(exporter)
    assert [skipped for skipped, _ in recorded] == [not (i < 5 or i % 4 == 0) for i in range(14)]
    stages = {sc.SPAN_VISION_PREPROCESS, sc.SPAN_TURBOMIND_STREAM}
    assert all(children == stages for skipped, children in recorded if not skipped)
    assert all(not children for skipped, children in recorded if skipped)


@pytest.mark.lmdeploy
def test_every_request_records_its_detail_while_the_live_suspicion_finds_growth(cpu_pipeline, exporter, tmp_path):  # noqa: F811
    session = _session(exporter, tmp_path / "journal", 4)
    suspicion = Suspicion(fit_every_s=0)
    controller = CaptureController(AUTO, Bounds(64, 300, 512 * MiB, 3600), None, (), suspicion)
    try:
        session.telemetry.detail = detail.DetailSampling(4, controller.growth_suspected, young=0)
        _requests(cpu_pipeline, 4)
        # The sampler's readings: host memory 3 MiB higher at every request completed (with no journal the
        # controller opens no capture window: the suspicion alone decides)
        for completed in range(1, 41):
            suspicion.add(completed, {sc.MEM_HOST_RSS: 500 * MiB + 3 * MiB * completed})
        assert controller.growth_suspected()
        _requests(cpu_pipeline, 4)
    finally:
        vlmtrace.uninstrument()
    assert [skipped for skipped, _ in _recorded(exporter)] == [False, True, True, True, False, False, False, False]


@pytest.mark.lmdeploy
def test_the_header_declares_the_sampling_and_the_report_says_it(cpu_pipeline, exporter, tmp_path):  # noqa: F811
    journal = tmp_path / "journal"
    session = _session(exporter, journal, 4)
    try:
        session.telemetry.detail.young = 2
        _requests(cpu_pipeline, 10)
    finally:
        vlmtrace.uninstrument()
    (path,) = journal_files(journal)
    header = orjson.loads(Path(path).read_bytes().splitlines()[0])
    assert header["resource"][sc.RESOURCE_DETAIL_EVERY] == 4
    assert header["resource"][sc.RESOURCE_DETAIL_YOUNG] == detail.YOUNG_REQUESTS
    assert header["resource"][sc.RESOURCE_DETAIL_WHILE_SUSPECTED] is True  # capture=auto, with a journal
    summary = analyze(read_inputs([str(path)])).summary
    skipped = sum(s for s, _ in _recorded(exporter))
    assert skipped == 6  # 2 young, then 2, 3, 5, 6, 7, 9 skipped of 2..9
    (process,) = summary.processes
    assert process["detail"] == {
        "every": 4,
        "young_requests": detail.YOUNG_REQUESTS,
        "while_suspected": True,
        "requests_without_detail": skipped,
    }
    assert (
        f"Stage detail on 1 in 4 requests after the first {detail.YOUNG_REQUESTS}, and on every request while "
        f"growth was suspected: {skipped} requests recorded none" in " ".join(headline(summary))
    )


@pytest.mark.lmdeploy
def test_with_detail_on_every_request_nothing_says_sampling(cpu_pipeline, exporter, tmp_path):  # noqa: F811
    journal = tmp_path / "journal"
    _session(exporter, journal, 1)
    try:
        _requests(cpu_pipeline, 3)
    finally:
        vlmtrace.uninstrument()
    (path,) = journal_files(journal)
    header = orjson.loads(Path(path).read_bytes().splitlines()[0])
    assert sc.RESOURCE_DETAIL_EVERY not in header["resource"]
    summary = analyze(read_inputs([str(path)])).summary
    assert summary.processes[0]["detail"] is None
    assert not any("Stage detail" in line for line in headline(summary))
    assert not any(skipped for skipped, _ in _recorded(exporter))
