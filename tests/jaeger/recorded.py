"""What a real Jaeger answers for vlmtrace's spans, recorded for the Jaeger reader's tests.

    python -m tests.jaeger.recorded      (needs build/jaeger: scripts/build-jaeger)

sends `spans()` (one request of the GPU-recorded PyTorch journal, the first engine steps that link to
it, one span carrying the extremes of our attribute types, and one that met the SDK's attribute limit) to a fresh Jaeger over OTLP/HTTP, then
writes its API v3 and v1 search responses to tests/jaeger/data/. test_recorded.py reads those files
without Jaeger, and checks against a live one that they are still what it answers.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Status, StatusCode

from tests.jaeger.conftest import JAEGER_BINARY, JaegerServer, v3_span_count
from tests.support.journal_replay import journal_spans, replay, span_context
from vlmtrace import semconv as sc

DATA = Path(__file__).with_name("data")
SERVICE = "vlmtrace-recorded"
END_NS = 1_796_000_000_000_000_000  # a fixed time (2026-11-30), so a later recording is comparable byte for byte
WINDOW = {
    "v3": {"query.start_time_min": "2026-11-29T00:00:00Z", "query.start_time_max": "2026-12-01T00:00:00Z"},
    "v1": {"start": (END_NS // 1000) - 86_400_000_000, "end": (END_NS // 1000) + 86_400_000_000},
}
EXTREMES = {
    sc.STAGE: sc.STAGE_ENGINE_FORWARD,
    sc.MEM_GPU_TOTAL: 150_754_820_096,
    sc.MEM_TORCH_ALLOCATED + sc.DELTA_SUFFIX: -(1 << 20),
    sc.MEM_NATIVE: 2**63 - 1,
    sc.MEM_HOST_RSS: 2**53 + 1,  # not a float64: a JSON reader that goes through doubles gets 2**53
    sc.MEM_DEVICES: (0, 1),
    sc.MEM_GPU_PROCESS + sc.PER_DEVICE_SUFFIX: (3 << 30, 5 << 30),
    sc.STEP_SESSION_IDS: (7, -(2**63)),
    sc.GEN_AI_RESPONSE_FINISH_REASONS: ("length", "stop"),
    sc.REQUEST_TTFT: 0.0125,
    "vlmtrace.test.flag": True,
    "vlmtrace.test.empty": (),
}
EXTREMES_IDS = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
LIMITED_IDS = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
LIMITED_ATTRIBUTES = 8


def spans() -> list[ReadableSpan]:
    journal = Path(__file__).resolve().parents[1] / "analysis" / "data" / "gpu" / "pytorch-tensor.jsonl.gz"
    recorded = journal_spans(journal, service_name=SERVICE, end_at_ns=END_NS)
    first_trace = next(s.context.trace_id for s in recorded if s.name == sc.SPAN_PIPELINE_INFER)
    request = [s for s in recorded if s.context.trace_id == first_trace]
    chat = next(s.context.span_id for s in request if s.name.startswith("chat "))
    steps = [s for s in recorded if any(link.context.span_id == chat for link in s.links)][:2]
    start = request[0].start_time
    extremes = ReadableSpan(
        name=sc.SPAN_PYTORCH_FORWARD,
        context=span_context(*EXTREMES_IDS),
        resource=Resource({"service.name": SERVICE}),
        attributes=EXTREMES,
        links=steps[0].links,
        kind=steps[0].kind,
        start_time=start,
        end_time=start + 1_234_567,
        events=(Event("exception", {"exception.type": "OutOfMemoryError"}, start + 1000),),
        status=Status(StatusCode.ERROR, "CUDA out of memory"),
        instrumentation_scope=steps[0].instrumentation_scope,
    )
    chat_span = next(s for s in request if s.name.startswith("chat "))
    limited = ReadableSpan(  # a span that met the SDK's attribute limit (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT) at its sender
        name=chat_span.name,
        context=span_context(*LIMITED_IDS),
        resource=chat_span.resource,
        kind=chat_span.kind,
        attributes=BoundedAttributes(LIMITED_ATTRIBUTES, dict(chat_span.attributes)),
        start_time=chat_span.start_time,
        end_time=chat_span.end_time,
        instrumentation_scope=chat_span.instrumentation_scope,
    )
    return request + steps + [extremes, limited]


def record(jaeger: JaegerServer) -> dict[str, bytes]:
    """Send `spans()` and return the two search responses, as the server wrote them."""
    sent = spans()
    replay(sent, OTLPSpanExporter(endpoint=f"{jaeger.otlp_http_endpoint}/v1/traces"))
    traces = len({s.context.trace_id for s in sent})
    v3 = jaeger.wait_for(
        "/api/v3/traces",
        lambda d: v3_span_count(d) == len(sent),
        {"query.service_name": SERVICE, "query.num_traces": traces, **WINDOW["v3"]},
    )
    v1 = jaeger.wait_for(
        "/api/traces",
        lambda d: sum(len(t["spans"]) for t in d["data"] or ()) == len(sent),
        {"service": SERVICE, "limit": traces, **WINDOW["v1"]},
    )
    return {
        "api-v3-search.json": orjson.dumps(v3, option=orjson.OPT_INDENT_2),
        "api-v1-search.json": orjson.dumps(v1, option=orjson.OPT_INDENT_2),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as workdir:
        jaeger = JaegerServer(JAEGER_BINARY, Path(workdir))
        jaeger.start()
        try:
            responses = record(jaeger)
        finally:
            jaeger.stop()
    DATA.mkdir(exist_ok=True)
    for name, body in responses.items():
        (DATA / name).write_bytes(body + b"\n")
        print(f"{DATA / name}: {len(body)} bytes")


if __name__ == "__main__":
    main()
