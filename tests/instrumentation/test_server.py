"""The api_server's HTTP layer: a SERVER span per request, child of the caller's traceparent, driven over ASGI."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

from tests.instrumentation.conftest import finished, spans_by_name
from vlmtrace import semconv as sc
from vlmtrace.instrumentation import server

fastapi = pytest.importorskip("fastapi", reason="the api_server's FastAPI is needed")

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


def _app(telemetry):
    """A FastAPI app without FastAPI's own telemetry, mounted the way api_server.serve() mounts its metrics."""
    app = fastapi.FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        if body.get("fail") == "raise":
            raise RuntimeError("engine gone")
        handle = telemetry.start("chat tiny", sc.STAGE_REQUEST)  # what AsyncEngine.preprocess's wrapper does
        handle.end()
        if body.get("fail") == "503":
            return fastapi.responses.JSONResponse({"error": "busy"}, status_code=503)
        return {"ok": True}

    @app.get("/v1/items/{item}")
    async def item(item: str):
        return {"item": item}

    server.mount(lambda: telemetry)(lambda app, backend_config: None, None, (app, None), {})
    return app


def _call(app, method: str, path: str, body: bytes = b"{}", traceparent: str | None = None) -> list[dict]:
    headers = [(b"content-type", b"application/json")]
    if traceparent:
        headers.append((b"traceparent", traceparent.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "server": ("127.0.0.1", 23333),
        "client": ("10.0.0.7", 50123),
    }
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    async def run():
        # an unhandled error leaves the app after its 500 answer, as under uvicorn
        with contextlib.suppress(RuntimeError):
            await app(scope, receive, send)

    asyncio.run(run())
    return sent


def test_the_server_span_is_the_callers_child_and_the_request_span_its_child(traced, exporter):
    app = _app(traced.telemetry)
    sent = _call(app, "POST", "/v1/chat/completions", traceparent=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01")
    assert sent[0]["status"] == 200
    spans = spans_by_name(exporter)
    (http,) = spans["POST /v1/chat/completions"]
    assert http.kind is SpanKind.SERVER
    assert f"{http.context.trace_id:032x}" == CALLER_TRACE and f"{http.parent.span_id:016x}" == CALLER_SPAN
    assert http.parent.is_remote
    a = http.attributes
    assert a[sc.STAGE] == sc.STAGE_HTTP_SERVER
    assert (a[sc.HTTP_REQUEST_METHOD], a[sc.HTTP_ROUTE], a[sc.URL_PATH]) == (
        "POST",
        "/v1/chat/completions",
        "/v1/chat/completions",
    )
    assert a[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert (a[sc.SERVER_ADDRESS], a[sc.SERVER_PORT], a[sc.CLIENT_ADDRESS]) == ("127.0.0.1", 23333, "10.0.0.7")
    assert http.status.status_code is StatusCode.UNSET
    (request,) = spans["chat tiny"]
    assert request.parent.span_id == http.context.span_id and request.context.trace_id == http.context.trace_id


def test_without_a_traceparent_the_server_span_starts_a_trace_and_parameters_stay_out_of_the_name(traced, exporter):
    app = _app(traced.telemetry)
    assert _call(app, "GET", "/v1/items/42")[0]["status"] == 200
    (http,) = finished(exporter)
    assert http.name == "GET" and http.parent is None
    assert sc.HTTP_ROUTE not in http.attributes and http.attributes[sc.URL_PATH] == "/v1/items/42"


def test_a_5xx_answer_and_an_exception_mark_the_server_span_failed(traced, exporter):
    app = _app(traced.telemetry)
    assert _call(app, "POST", "/v1/chat/completions", b'{"fail": "503"}')[0]["status"] == 503
    assert _call(app, "POST", "/v1/chat/completions", b'{"fail": "raise"}')[0]["status"] == 500
    busy, raised = sorted(spans_by_name(exporter)["POST /v1/chat/completions"], key=lambda s: s.start_time)
    assert busy.status.status_code is StatusCode.ERROR and busy.attributes[sc.ERROR_TYPE] == "503"
    assert raised.status.status_code is StatusCode.ERROR
    assert raised.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 500
    assert [e.name for e in raised.events] == ["exception"]


def test_an_existing_server_span_is_left_alone(traced, exporter):
    app = _app(traced.telemetry)
    outer = TracerProvider().get_tracer("fastapi-native").start_span("POST /v1/chat/completions", kind=SpanKind.SERVER)
    token = trace.context_api.attach(trace.set_span_in_context(outer))
    try:
        _call(app, "POST", "/v1/chat/completions")
    finally:
        trace.context_api.detach(token)
    (request,) = finished(exporter)  # no second SERVER span: the request span is the outer one's child
    assert request.name == "chat tiny" and request.parent.span_id == outer.get_span_context().span_id


def test_once_uninstrumented_requests_pass_through(traced, exporter):
    live = [traced.telemetry]
    app = fastapi.FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})
    app.get("/v1/models")(lambda: {"data": []})
    server.mount(lambda: live[0])(lambda app, backend_config: None, None, (app, None), {})
    live[0] = None
    assert _call(app, "GET", "/v1/models")[0]["status"] == 200
    assert finished(exporter) == ()
