"""The api_server layer: one SERVER span per HTTP request, the child of the caller's `traceparent`.

LMDeploy's OpenAI-compatible server is a FastAPI app built inside `serve()`; vlmtrace gets hold of it
where `serve()` hands it to `mount_metrics(app, ...)`, and puts an ASGI middleware outside every other
one (so the span covers authentication and the concurrency limit too). The middleware extracts the
incoming context with the global propagator (W3C `traceparent`/`tracestate` unless `OTEL_PROPAGATORS`
says otherwise) and makes the SERVER span current, so the request spans the handler starts are its
children. Where a SERVER span already exists, it steps aside: FastAPI's native telemetry (0.16x
starts one, from the traceparent, whenever an SDK tracer provider is installed, as vlmtrace's is)
and opentelemetry-instrumentation-fastapi/asgi; the request spans are then children of that one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind

from vlmtrace import semconv as sc
from vlmtrace.instrumentation.runtime import Telemetry, safe, warn_once

_log = logging.getLogger(__name__)


class _AsgiHeaders(Getter):
    """ASGI headers: a list of (lowercase name, value) byte pairs."""

    def get(self, carrier: list[tuple[bytes, bytes]], key: str) -> list[str] | None:
        name = key.lower().encode("latin-1")
        values = [value.decode("latin-1") for header, value in carrier if header == name]
        return values or None

    def keys(self, carrier: list[tuple[bytes, bytes]]) -> list[str]:
        return [header.decode("latin-1") for header, _ in carrier]


_HEADERS = _AsgiHeaders()


def _static_routes(app: Any) -> frozenset[str]:
    """Route templates without parameters: a request path found here is its own low-cardinality route."""
    return frozenset(
        path
        for path in (getattr(route, "path", None) for route in getattr(app, "routes", ()))
        if isinstance(path, str) and "{" not in path
    )


def _request_attributes(scope: dict, route: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        sc.HTTP_REQUEST_METHOD: scope.get("method", "GET"),
        sc.URL_PATH: scope.get("path", ""),
        sc.URL_SCHEME: scope.get("scheme", "http"),
    }
    if route is not None:
        attributes[sc.HTTP_ROUTE] = route
    server = scope.get("server")
    if server and server[0] is not None:
        attributes[sc.SERVER_ADDRESS] = server[0]
        if server[1] is not None:
            attributes[sc.SERVER_PORT] = server[1]
    client = scope.get("client")
    if client:
        attributes[sc.CLIENT_ADDRESS] = client[0]
    return attributes


class ServerSpans:
    """ASGI middleware; `current` returns the live Telemetry (None once uninstrumented: it passes through)."""

    def __init__(self, app: Any, current: Callable[[], Telemetry | None], routes: frozenset[str]) -> None:
        self.app = app
        self._current = current
        self._routes = routes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        telemetry = self._current() if scope.get("type") == "http" else None
        if telemetry is None or getattr(trace.get_current_span(), "kind", None) is SpanKind.SERVER:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in self._routes else None
        method = scope.get("method", "GET")
        handle = telemetry.start(
            f"{method} {route}" if route else method,
            sc.STAGE_HTTP_SERVER,
            safe(_request_attributes, scope, route),
            context=propagate.extract(scope.get("headers") or [], getter=_HEADERS),
            kind=SpanKind.SERVER,
        )
        status: list[int] = []

        async def noting_status(message: dict) -> None:
            if message.get("type") == "http.response.start":
                status.append(message.get("status", 0))
            await send(message)

        token = otel_context.attach(handle.context())
        try:
            await self.app(scope, receive, noting_status)
        except BaseException as error:
            handle.end({sc.HTTP_RESPONSE_STATUS_CODE: status[0]} if status else None, error=error)
            raise
        finally:
            otel_context.detach(token)
        code = status[0] if status else 0
        if code >= 500:
            handle.end({sc.HTTP_RESPONSE_STATUS_CODE: code, sc.ERROR_TYPE: str(code)}, failed=f"HTTP {code}")
        else:
            handle.end({sc.HTTP_RESPONSE_STATUS_CODE: code} if code else None)


def mount(current: Callable[[], Telemetry | None]) -> Callable[..., Any]:
    """`api_server.mount_metrics(app, backend_config)`: serve() has built the app; wrap its middleware stack."""

    def wrapper(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        app = args[0] if args else kwargs.get("app")
        build = getattr(app, "build_middleware_stack", None)
        if build is None or getattr(app, "_is_instrumented_by_opentelemetry", False):
            return result
        try:
            app.build_middleware_stack = lambda: ServerSpans(build(), current, _static_routes(app))
        except (AttributeError, TypeError) as error:
            warn_once("server:mount", "cannot trace the api_server's HTTP requests (%s)", error, logger=_log)
        return result

    return wrapper
