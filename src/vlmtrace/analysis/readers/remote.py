"""Pull traces from Tempo or Jaeger over HTTP, where fleets keep them, with the standard library only.

Tempo: `/api/search?q=<TraceQL>` lists trace ids, `/api/traces/<id>` returns each (v1 JSON).
Jaeger: `/api/v3/traces?query.service_name=…` (API v3) returns the traces themselves; servers
without v3 answer 404 and are asked `/api/traces?service=…` (API v1). Responses are read exactly as
files with the same content would be.

Every pull is bounded: a time range (`lookback_s`), a trace count (`limit`), the bytes of one
response (`max_bytes`) and the time one response may take (`timeout_s`, from the request until its
last byte). A server that refuses, never answers or answers too slowly becomes a problem naming the
URL, never a hang.
"""

from __future__ import annotations

import dataclasses
import datetime
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

import orjson

from vlmtrace.analysis.readers.detect import add_payload
from vlmtrace.analysis.readers.tempo import search_trace_ids
from vlmtrace.analysis.trace_data import TraceData

TIMEOUT_S = 60.0
MAX_BYTES = 500_000_000
_CHUNK = 1024 * 1024
_ERROR_BODY_BYTES = 2000

Progress = Callable[[str], None]


@dataclasses.dataclass
class Query:
    base_url: str
    query: str | None = None  # TraceQL for Tempo, a service name for Jaeger
    trace_ids: tuple[str, ...] = ()
    limit: int = 20
    lookback_s: int = 3600
    timeout_s: float = TIMEOUT_S
    max_bytes: int = MAX_BYTES


class _NotFound(Exception):
    def __init__(self, url: str, body: bytes) -> None:
        super().__init__(url)
        self.body = body


class PullError(Exception):
    """The server could not be asked or did not answer in bounds; the message says which and why."""


def _get(url: str, query: Query, progress: Progress | None) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "vlmtrace"})
    deadline = time.monotonic() + query.timeout_s
    try:
        # The socket timeout bounds each wait for bytes; the deadline bounds a server that trickles them.
        with urllib.request.urlopen(request, timeout=query.timeout_s) as response:  # noqa: S310 (the user's own URL)
            chunks, received = [], 0
            while chunk := response.read1(_CHUNK):  # what has arrived: read() would wait for a whole chunk
                received += len(chunk)
                if received > query.max_bytes:
                    raise PullError(f"the response is larger than {query.max_bytes / 1e6:g} MB: "
                                    "ask for fewer traces (--limit) or a shorter time (--lookback)")
                if time.monotonic() > deadline:
                    raise PullError(f"the response took longer than {query.timeout_s:g}s (--timeout)")
                chunks.append(chunk)
                if progress is not None:
                    progress(f"{url}: {received / 1e6:.1f} MB")
            if response.length:  # what Content-Length promised and the server did not send
                raise PullError(f"the connection closed after {received} of {received + response.length} bytes")
            return b"".join(chunks)
    except urllib.error.HTTPError as error:
        body = error.read(_ERROR_BODY_BYTES)
        if error.code == 404:
            raise _NotFound(url, body) from None
        raise PullError(f"HTTP {error.code}: {body.decode('utf-8', 'replace').strip() or error.reason}") from None
    except TimeoutError:
        raise PullError(f"no answer within {query.timeout_s:g}s (--timeout)") from None
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, TimeoutError):
            raise PullError(f"no answer within {query.timeout_s:g}s (--timeout)") from None
        raise PullError(f"cannot connect: {getattr(reason, 'strerror', None) or reason}") from None
    except http.client.HTTPException as error:  # a status line that is not HTTP's
        raise PullError(f"not an HTTP answer ({type(error).__name__})") from None
    except (OSError, ValueError) as error:  # a connection reset mid-answer, a malformed URL
        raise PullError(str(error)) from None


def _url(base: str, path: str, params: dict | None = None) -> str:
    url = base.rstrip("/") + path
    return url + ("?" + urllib.parse.urlencode(params) if params else "")


def _fetch_into(data: TraceData, url: str, query: Query, progress: Progress | None) -> None:
    try:
        add_payload(data, _get(url, query, progress), url)
    except _NotFound:
        data.problem(url, None, "not found (HTTP 404)")
    except PullError as error:
        data.problem(url, None, f"cannot be fetched: {error}")


def pull_tempo(data: TraceData, query: Query, progress: Progress | None = None) -> None:
    trace_ids = list(query.trace_ids)
    if not trace_ids:
        now = int(time.time())
        params = {"limit": query.limit, "start": now - query.lookback_s, "end": now}
        if query.query:
            params["q"] = query.query
        url = _url(query.base_url, "/api/search", params)
        try:
            document = orjson.loads(_get(url, query, progress))
        except (_NotFound, PullError, orjson.JSONDecodeError) as error:
            data.problem(url, None, f"Tempo search failed: {'not found (HTTP 404)' if isinstance(error, _NotFound) else error}")
            return
        trace_ids = search_trace_ids(document) if isinstance(document, dict) else []
        if not trace_ids:
            data.problem(url, None, "Tempo search found no traces", "note")
    for trace_id in trace_ids:
        _fetch_into(data, _url(query.base_url, f"/api/traces/{urllib.parse.quote(trace_id)}"), query, progress)


def _rfc3339(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _v3_not_found(error: _NotFound) -> str | None:
    """Jaeger v3's own 404 (`{"error": {"message": …}}`: no such trace, or a search that found none);
    None for a 404 without it, from a server that has no API v3."""
    try:
        document = orjson.loads(error.body)
    except orjson.JSONDecodeError:
        return None
    details = document.get("error") if isinstance(document, dict) else None
    return str(details.get("message")) if isinstance(details, dict) and details.get("message") else None


def pull_jaeger(data: TraceData, query: Query, progress: Progress | None = None) -> None:
    if query.trace_ids:
        for trace_id in query.trace_ids:
            quoted = urllib.parse.quote(trace_id)
            v3 = _url(query.base_url, f"/api/v3/traces/{quoted}")
            try:
                add_payload(data, _get(v3, query, progress), v3)
            except _NotFound as error:
                if (message := _v3_not_found(error)) is not None:
                    data.problem(v3, None, f"not found (HTTP 404: {message})")
                else:
                    _fetch_into(data, _url(query.base_url, f"/api/traces/{quoted}"), query, progress)
            except PullError as error:
                data.problem(v3, None, f"cannot be fetched: {error}")
        return
    if not query.query:
        data.problem(query.base_url, None, "a Jaeger search needs a service name (--query SERVICE) or --trace-id")
        return
    now = time.time()
    start, end = _rfc3339(now - query.lookback_s), _rfc3339(now + 1)  # whole seconds: the end rounded up
    v3 = _url(
        query.base_url,
        "/api/v3/traces",
        {
            "query.service_name": query.query,
            "query.start_time_min": start,
            "query.start_time_max": end,
            # The trace count: Jaeger v2's HTTP gateway reads `num_traces` (without it the in-memory store
            # refuses the search); `search_depth`, the field's name in the API v3 proto, is for gateways
            # that map parameters onto the proto (grpc-gateway).
            "query.num_traces": query.limit,
            "query.search_depth": query.limit,
        },
    )
    try:
        add_payload(data, _get(v3, query, progress), v3)
    except _NotFound as error:
        if _v3_not_found(error) is not None:
            data.problem(v3, None, f"Jaeger found no traces of service {query.query!r} between {start} and {end}")
            return
        v1 = _url(query.base_url, "/api/traces", {"service": query.query, "limit": query.limit,
                                                  "lookback": f"{query.lookback_s}s"})
        _fetch_into(data, v1, query, progress)
    except PullError as error:
        data.problem(v3, None, f"cannot be fetched: {error}")
