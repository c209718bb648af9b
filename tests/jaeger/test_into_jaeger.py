"""LMDeploy 0.18's real pipeline on the CPU, instrumented, exporting over OTLP (gRPC and HTTP) to a real
Jaeger; what Jaeger's own query APIs (v3 and v1) show is checked against the journal of the same run."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import orjson
import pytest

pytest.importorskip("lmdeploy", reason="the real LMDeploy Python code is needed (scripts/test installs it)")

from lmdeploy import GenerationConfig

import vlmtrace
from tests.instrumentation.conftest import cpu_pipeline, standin_engines  # noqa: F401 - fixtures
from tests.jaeger.conftest import ALL_TIME, v3_span_count
from tests.support.journal_replay import journal_spans
from tests.support.spans import image
from vlmtrace import semconv as sc
from vlmtrace.analysis.readers.otlp_json import attributes, hex_id

pytestmark = [pytest.mark.lmdeploy, pytest.mark.jaeger, pytest.mark.usefixtures("fresh_global_tracer_provider")]
GEN = GenerationConfig(max_new_tokens=4, top_k=1)


def _run_traced(cpu_pipeline, journal: Path, **options) -> None:  # noqa: F811
    vlmtrace.instrument(journal=str(journal), sample_interval_ms=0, metrics=False, **options)
    try:
        outputs = cpu_pipeline(
            [("describe this image", image(120, 100, 0)), ("and this one", image(64, 48, 1))], gen_config=GEN
        )
    finally:
        vlmtrace.uninstrument()  # flushes the OTLP exporter: Jaeger has been sent every span when this returns
    assert [o.generate_token_len for o in outputs] == [4, 4]


def _chain(span: dict, by_id: dict[str, dict]) -> tuple[str, ...]:
    """The names from the root down to `span`, following the parent ids as Jaeger returned them."""
    parent = by_id.get(hex_id(span.get("parentSpanId"), 8))
    return (*(_chain(parent, by_id) if parent else ()), span["name"])


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_pipeline_call_arrives_in_jaeger_as_the_journal_has_it(jaeger, cpu_pipeline, tmp_path: Path, protocol: str):  # noqa: F811
    service = f"into-jaeger-{protocol.split('/', maxsplit=1)[0]}"
    endpoint = jaeger.otlp_grpc_endpoint if protocol == "grpc" else jaeger.otlp_http_endpoint
    _run_traced(
        cpu_pipeline, tmp_path / "journal", otlp_endpoint=endpoint, otlp_protocol=protocol, service_name=service
    )
    (journal_file,) = (tmp_path / "journal").glob("*.jsonl")
    expected = {format(span.context.span_id, "016x"): span for span in journal_spans(journal_file)}
    assert len(expected) == 7  # pipeline; per prompt: chat, vision.preprocess, turbomind.stream

    v3 = jaeger.wait_for(
        "/api/v3/traces",
        lambda d: v3_span_count(d) == len(expected),
        {"query.service_name": service, "query.num_traces": 10, **ALL_TIME},
    )
    (resource_spans,) = v3["result"]["resourceSpans"]
    resource = attributes(resource_spans["resource"]["attributes"])
    assert resource["service.name"] == service and resource["host.name"] == socket.gethostname()
    assert resource["process.pid"] == os.getpid() and resource["service.instance.id"]
    assert resource[sc.RESOURCE_VLMTRACE_VERSION] == vlmtrace.__version__
    assert resource[sc.RESOURCE_LMDEPLOY_VERSION] == "0.18.0"
    (scope,) = resource_spans["scopeSpans"]
    assert scope["scope"]["name"] == sc.INSTRUMENTATION_SCOPE

    by_id = {hex_id(span["spanId"], 8): span for span in scope["spans"]}
    assert by_id.keys() == expected.keys()
    for span_id, span in by_id.items():
        journal_span = expected[span_id]
        assert span["name"] == journal_span.name
        assert hex_id(span.get("parentSpanId"), 8) == (
            format(journal_span.parent.span_id, "016x") if journal_span.parent else None
        )
        assert (int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])) == (
            journal_span.start_time,
            journal_span.end_time,
        )
        # Every attribute, the memory readings and their deltas included, with its type: ints stay ints.
        assert attributes(span["attributes"]) == {k: _plain(v) for k, v in journal_span.attributes.items()}

    assert {_chain(span, by_id) for span in by_id.values()} == {
        (sc.SPAN_PIPELINE_INFER,),
        (sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl"),
        (sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl", sc.SPAN_VISION_PREPROCESS),
        (sc.SPAN_PIPELINE_INFER, "chat tiny-qwen2vl", sc.SPAN_TURBOMIND_STREAM),
    }
    chat = next(attributes(s["attributes"]) for s in by_id.values() if s["name"] == "chat tiny-qwen2vl")
    assert (chat[sc.GEN_AI_OPERATION_NAME], chat[sc.GEN_AI_PROVIDER_NAME], chat[sc.GEN_AI_REQUEST_MODEL]) == (
        "chat",
        "lmdeploy",
        "tiny-qwen2vl",
    )
    assert chat[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4 and chat[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]
    assert chat[sc.MEM_HOST_RSS] > 10 << 20 and isinstance(chat[sc.MEM_HOST_RSS + sc.DELTA_SUFFIX], int)


def test_jaegers_v1_api_shows_the_same_spans_as_tags_and_references(jaeger, cpu_pipeline, tmp_path: Path):  # noqa: F811
    service = "into-jaeger-v1"
    _run_traced(cpu_pipeline, tmp_path / "journal", otlp_endpoint=jaeger.otlp_http_endpoint, service_name=service)
    (journal_file,) = (tmp_path / "journal").glob("*.jsonl")
    expected = {format(span.context.span_id, "016x"): span for span in journal_spans(journal_file)}

    v1 = jaeger.wait_for(
        "/api/traces",
        lambda d: sum(len(t["spans"]) for t in d["data"] or ()) == len(expected),
        {"service": service, "lookback": "1h", "limit": 10},
    )
    (trace,) = v1["data"]
    (process,) = trace["processes"].values()
    process_tags = {tag["key"]: tag for tag in process["tags"]}
    assert process["serviceName"] == service
    assert process_tags["process.pid"] == {"key": "process.pid", "type": "int64", "value": os.getpid()}
    for span in trace["spans"]:
        journal_span = expected[span["spanID"]]
        tags = {tag["key"]: tag for tag in span["tags"]}
        # Microseconds: both the start and the duration are cut (not rounded) from nanoseconds.
        assert (span["startTime"], span["duration"]) == (
            journal_span.start_time // 1000,
            (journal_span.end_time - journal_span.start_time) // 1000,
        )
        if journal_span.parent is not None:
            assert span["references"] == [
                {
                    "refType": "CHILD_OF",
                    "traceID": span["traceID"],
                    "spanID": format(journal_span.parent.span_id, "016x"),
                }
            ]
        else:
            assert "references" not in span or span["references"] == []
        for key, value in journal_span.attributes.items():  # each attribute, as a typed tag
            assert tags[key] == {"key": key, **_v1_tag(value)}, key
        assert tags["otel.scope.name"]["value"] == sc.INSTRUMENTATION_SCOPE


def _v1_tag(value) -> dict:
    """How Jaeger's v1 API shows an attribute: arrays become JSON text, and integers beyond 2**53 (a
    reading's time in ns) decimal text, as JSON numbers would lose their last digits."""
    if isinstance(value, (list, tuple)):
        return {"type": "string", "value": orjson.dumps(list(value)).decode()}
    kind = {bool: "bool", int: "int64", float: "float64", str: "string"}[type(value)]
    if kind == "int64" and abs(value) > 2**53:
        return {"type": kind, "value": str(value)}
    return {"type": kind, "value": value}


def test_pytorch_engine_steps_arrive_linked_to_their_requests(jaeger, tmp_path: Path, monkeypatch):
    """LMDeploy's real step scheduling (`InputsMakerAsync`, `BaseModelAgent`) around the stand-in engine of
    tests/support/pytorch_engine_standin.py; the request spans are started as the server's side would."""
    from lmdeploy.messages import ResponseType
    from lmdeploy.pytorch.engine.model_agent.agent import BaseModelAgent

    from tests.support.pytorch_engine_standin import (
        StandinEngine,
        use_forward_without_gpu,
    )
    from vlmtrace.instrumentation.runtime import RequestState

    # The stand-in swaps the GPU forward in under vlmtrace's wrapper; this puts LMDeploy's back afterwards.
    monkeypatch.setattr(BaseModelAgent, "_async_step", BaseModelAgent.__dict__["_async_step"])
    service = "into-jaeger-steps"
    session = vlmtrace.instrument(
        otlp_endpoint=jaeger.otlp_grpc_endpoint,
        otlp_protocol="grpc",
        service_name=service,
        journal=str(tmp_path / "journal"),
        sample_interval_ms=0,
        metrics=False,
    )
    try:
        use_forward_without_gpu()
        telemetry = session.telemetry
        requests = {sid: telemetry.start(f"chat {sid}", sc.STAGE_REQUEST) for sid in (7, 8)}
        for sid, handle in requests.items():
            telemetry.requests.put(sid, RequestState(handle))

        async def serve() -> None:
            engine = StandinEngine(None)
            engine.start_loop()
            for sequence in [engine.add(sid, prompt_len=12, max_new_tokens=3) for sid in requests]:
                while (await sequence.outputs.get()).status == ResponseType.SUCCESS:
                    pass
            engine.close()
            await engine.wait_tasks()

        asyncio.run(serve())
        for sid, handle in requests.items():
            telemetry.requests.pop(sid)
            handle.end()
        request_ids = {format(handle.span_context.span_id, "016x"): sid for sid, handle in requests.items()}
    finally:
        vlmtrace.uninstrument()

    (journal_file,) = (tmp_path / "journal").glob("*.jsonl")
    sent = journal_spans(journal_file)
    v3 = jaeger.wait_for(
        "/api/v3/traces",
        lambda d: v3_span_count(d) == len(sent),
        {"query.service_name": service, "query.num_traces": len(sent), **ALL_TIME},
    )
    steps = [
        s
        for r in v3["result"]["resourceSpans"]
        for scope in r["scopeSpans"]
        for s in scope["spans"]
        if s["name"] == sc.SPAN_PYTORCH_FORWARD
    ]
    linked = [{request_ids[hex_id(link["spanId"], 8)] for link in step.get("links", ())} for step in steps]
    sessions = [set(attributes(step["attributes"])[sc.STEP_SESSION_IDS]) for step in steps]
    assert linked == sessions and {7, 8} in linked  # a step links to each request it ran, in their own traces
    assert all(not step.get("parentSpanId") for step in steps)
    kinds = sorted(attributes(step["attributes"])[sc.STEP_KIND] for step in steps)
    assert kinds.count("prefill") >= 1 and kinds.count("decode") >= 1
    # The decode steps after the prefill (3 tokens each, the first from the prefill), in runs of them.
    runs = [
        attributes(step["attributes"]) for step in steps if attributes(step["attributes"])[sc.STEP_KIND] == "decode"
    ]
    assert sum(run[sc.STEP_COUNT] for run in runs) == 2
    assert len(steps) == len([s for s in sent if s.name == sc.SPAN_PYTORCH_FORWARD])
