"""The request's context across the PyTorch engine's process boundary, through the RPC's keyword arguments."""

from __future__ import annotations

import asyncio
import types

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext, TraceFlags

from vlmtrace import semconv as sc
from vlmtrace.instrumentation import mp_engine
from vlmtrace.instrumentation.runtime import RequestState
from tests.instrumentation.conftest import finished


def test_traceparent_round_trip_and_rejects():
    context = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(1))
    text = mp_engine.format_traceparent(context)
    assert text == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    parsed = mp_engine.parse_traceparent(text)
    assert (parsed.trace_id, parsed.span_id, parsed.trace_flags, parsed.is_remote) == (
        context.trace_id, context.span_id, 1, True)
    for bad in (None, 7, "", "00-abc-def-01", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-zzad6b7169203331-01"):
        assert mp_engine.parse_traceparent(bad) is None, bad


def test_the_server_side_adds_the_request_spans_traceparent(traced):
    telemetry = traced.telemetry
    request = telemetry.start("chat tiny", sc.STAGE_REQUEST)
    telemetry.requests.put(5, RequestState(request))
    seen = {}

    def rpc(session_id, **kwargs):
        seen.update(kwargs)
        return "the RPC's generator"

    send = mp_engine.send_context(telemetry)
    assert send(rpc, None, (5,), {"input_ids": [1, 2]}) == "the RPC's generator"
    assert seen[mp_engine.TRACEPARENT_KWARG] == mp_engine.format_traceparent(request.span_context)
    seen.clear()
    send(rpc, None, (6,), {})  # no request span, no current span: nothing to carry
    assert mp_engine.TRACEPARENT_KWARG not in seen
    request.end()


def test_the_engine_side_takes_it_off_and_links_steps_to_the_remote_request(traced, exporter):
    telemetry = traced.telemetry
    remote = TracerProvider().get_tracer("server").start_span("chat tiny")
    traceparent = mp_engine.format_traceparent(remote.get_span_context())
    during = {}

    async def engine_stream(*args, **kwargs):  # EngineWorkerBase.instance_async_stream_infer
        during["kwargs"] = dict(kwargs)
        during["request"] = telemetry.request_span_context(kwargs["session_id"])
        for tokens in ([11], [12, 13], []):
            yield types.SimpleNamespace(token_ids=tokens, status=types.SimpleNamespace(name="SUCCESS"))

    receive = mp_engine.receive_context(telemetry)

    async def consume(kwargs):
        return [output async for output in receive(engine_stream, None, (), kwargs)]

    outputs = asyncio.run(consume({"session_id": 9, "input_ids": [1, 2, 3], mp_engine.TRACEPARENT_KWARG: traceparent}))
    assert len(outputs) == 3
    assert mp_engine.TRACEPARENT_KWARG not in during["kwargs"]
    assert during["request"] == mp_engine.parse_traceparent(traceparent)  # steps scheduled meanwhile link to it
    assert telemetry.request_span_context(9) is None  # and only meanwhile
    (stream,) = finished(exporter)
    assert stream.name == sc.SPAN_PYTORCH_STREAM
    assert stream.context.trace_id == remote.get_span_context().trace_id
    assert stream.parent.span_id == remote.get_span_context().span_id
    a = stream.attributes
    assert a[sc.STAGE] == sc.STAGE_ENGINE_STREAM and a[sc.LMDEPLOY_SESSION_ID] == 9
    assert (a[sc.GEN_AI_USAGE_INPUT_TOKENS], a[sc.GEN_AI_USAGE_OUTPUT_TOKENS], a[sc.ENGINE_OUTPUT_CHUNKS]) == (3, 3, 3)
    assert a[sc.ENGINE_STATUS] == "SUCCESS"

    asyncio.run(consume({"session_id": 10, "input_ids": [1]}))  # from a server without vlmtrace: no span
    assert len(finished(exporter)) == 1
