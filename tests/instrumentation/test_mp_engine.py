"""The request's context across the PyTorch engine's process boundary, through the RPC's keyword arguments."""

from __future__ import annotations

import asyncio
import types

from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from tests.instrumentation.conftest import finished
from vlmtrace import semconv as sc
from vlmtrace.instrumentation import mp_engine
from vlmtrace.instrumentation.runtime import RequestState

CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C


def test_the_server_side_adds_the_request_spans_context_with_the_callers_tracestate_and_baggage(traced):
    telemetry = traced.telemetry
    caller = SpanContext(CALLER_TRACE, 0xB7AD6B7169203331, True, TraceFlags(1), TraceState([("vendor", "v1")]))
    handling = baggage.set_baggage("tenant", "t-7", trace.set_span_in_context(NonRecordingSpan(caller)))
    token = otel_context.attach(handling)  # as the api_server's handler runs, its caller's context extracted
    try:
        request = telemetry.start("chat tiny", sc.STAGE_REQUEST)
        telemetry.requests.put(5, RequestState(request))
        seen = {}

        def rpc(session_id, **kwargs):
            seen.update(kwargs)
            return "the RPC's generator"

        send = mp_engine.send_context(telemetry)
        assert send(rpc, None, (5,), {"input_ids": [1, 2]}) == "the RPC's generator"
    finally:
        otel_context.detach(token)
    carrier = seen[mp_engine.CONTEXT_KWARG]
    assert carrier["traceparent"] == f"00-{CALLER_TRACE:032x}-{request.span_context.span_id:016x}-01"
    assert carrier["tracestate"] == "vendor=v1" and carrier["baggage"] == "tenant=t-7"
    seen.clear()
    send(rpc, None, (6,), {})  # no request span, no current span: nothing to carry
    assert mp_engine.CONTEXT_KWARG not in seen
    request.end()


def test_the_engine_side_takes_it_off_and_links_steps_to_the_remote_request(traced, exporter):
    telemetry = traced.telemetry
    remote = TracerProvider().get_tracer("server").start_span("chat tiny").get_span_context()
    sent = {
        "traceparent": f"00-{remote.trace_id:032x}-{remote.span_id:016x}-01",
        "tracestate": "vendor=v1",
        "baggage": "tenant=t-7",
    }
    during = {}

    async def engine_stream(*args, **kwargs):  # EngineWorkerBase.instance_async_stream_infer
        during["kwargs"] = dict(kwargs)
        during["request"] = telemetry.request_span_context(kwargs["session_id"])
        during["baggage"] = baggage.get_baggage("tenant")
        during["current span"] = trace.get_current_span().get_span_context()
        for tokens in ([11], [12, 13], []):
            yield types.SimpleNamespace(token_ids=tokens, status=types.SimpleNamespace(name="SUCCESS"))

    receive = mp_engine.receive_context(telemetry)

    async def consume(kwargs):
        return [output async for output in receive(engine_stream, None, (), kwargs)]

    outputs = asyncio.run(consume({"session_id": 9, "input_ids": [1, 2, 3], mp_engine.CONTEXT_KWARG: sent}))
    assert len(outputs) == 3
    assert mp_engine.CONTEXT_KWARG not in during["kwargs"]
    assert (during["request"].trace_id, during["request"].span_id) == (remote.trace_id, remote.span_id)
    assert telemetry.request_span_context(9) is None  # steps scheduled meanwhile link to it, and only meanwhile
    (stream,) = finished(exporter)
    assert stream.name == sc.SPAN_PYTORCH_STREAM
    assert stream.context.trace_id == remote.trace_id and stream.parent.span_id == remote.span_id
    assert stream.context.trace_state.to_header() == "vendor=v1"
    assert during["baggage"] == "t-7" and during["current span"].span_id == stream.context.span_id
    a = stream.attributes
    assert a[sc.STAGE] == sc.STAGE_ENGINE_STREAM and a[sc.LMDEPLOY_SESSION_ID] == 9
    assert (a[sc.GEN_AI_USAGE_INPUT_TOKENS], a[sc.GEN_AI_USAGE_OUTPUT_TOKENS], a[sc.ENGINE_OUTPUT_CHUNKS]) == (3, 3, 3)
    assert a[sc.ENGINE_STATUS] == "SUCCESS"

    asyncio.run(consume({"session_id": 10, "input_ids": [1]}))  # from a server without vlmtrace: no span
    assert len(finished(exporter)) == 1
