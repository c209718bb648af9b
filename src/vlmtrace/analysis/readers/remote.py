"""Pull traces from Tempo or Jaeger over HTTP, where fleets keep them, with the standard library only.

Tempo: `/api/search?q=<TraceQL>` lists trace ids, `/api/traces/<id>` returns each (v1 JSON).
Jaeger: `/api/v3/traces?query.service_name=…` (API v3) returns the traces themselves; servers
without v3 answer 404 and are asked `/api/traces?service=…` (API v1). Responses are read exactly as
files with the same content would be.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
import urllib.error
import urllib.parse
import urllib.request

import orjson

from vlmtrace.analysis.readers.detect import add_payload
from vlmtrace.analysis.readers.tempo import search_trace_ids
from vlmtrace.analysis.trace_data import TraceData

TIMEOUT_S = 30


@dataclasses.dataclass
class Query:
    base_url: str
    query: str | None = None  # TraceQL for Tempo, a service name for Jaeger
    trace_ids: tuple[str, ...] = ()
    limit: int = 20
    lookback_s: int = 3600


class _NotFound(Exception):
    pass


def _get(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "vlmtrace"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 (the user's own URL)
            return response.read()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise _NotFound(url) from None
        raise


def _url(base: str, path: str, params: dict | None = None) -> str:
    url = base.rstrip("/") + path
    return url + ("?" + urllib.parse.urlencode(params) if params else "")


def _fetch_into(data: TraceData, url: str) -> None:
    try:
        add_payload(data, _get(url), url)
    except _NotFound:
        data.problem(url, None, "not found (HTTP 404)")
    except (urllib.error.URLError, OSError, ValueError) as error:
        data.problem(url, None, f"cannot be fetched: {getattr(error, 'reason', error)}")


def pull_tempo(data: TraceData, query: Query) -> None:
    trace_ids = list(query.trace_ids)
    if not trace_ids:
        now = int(time.time())
        params = {"limit": query.limit, "start": now - query.lookback_s, "end": now}
        if query.query:
            params["q"] = query.query
        url = _url(query.base_url, "/api/search", params)
        try:
            document = orjson.loads(_get(url))
        except (_NotFound, urllib.error.URLError, OSError, ValueError) as error:
            data.problem(url, None, f"Tempo search failed: {getattr(error, 'reason', error)}")
            return
        trace_ids = search_trace_ids(document) if isinstance(document, dict) else []
        if not trace_ids:
            data.problem(url, None, "Tempo search found no traces", "note")
    for trace_id in trace_ids:
        _fetch_into(data, _url(query.base_url, f"/api/traces/{urllib.parse.quote(trace_id)}"))


def _rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def pull_jaeger(data: TraceData, query: Query) -> None:
    if query.trace_ids:
        for trace_id in query.trace_ids:
            quoted = urllib.parse.quote(trace_id)
            v3 = _url(query.base_url, f"/api/v3/traces/{quoted}")
            try:
                add_payload(data, _get(v3), v3)
            except _NotFound:
                _fetch_into(data, _url(query.base_url, f"/api/traces/{quoted}"))
            except (urllib.error.URLError, OSError, ValueError) as error:
                data.problem(v3, None, f"cannot be fetched: {getattr(error, 'reason', error)}")
        return
    if not query.query:
        data.problem(query.base_url, None, "a Jaeger search needs a service name (--query SERVICE) or --trace-id")
        return
    now = time.time()
    v3 = _url(
        query.base_url,
        "/api/v3/traces",
        {
            "query.service_name": query.query,
            "query.start_time_min": _rfc3339(now - query.lookback_s),
            "query.start_time_max": _rfc3339(now),
            "query.search_depth": query.limit,
        },
    )
    try:
        add_payload(data, _get(v3), v3)
    except _NotFound:
        _fetch_into(
            data,
            _url(query.base_url, "/api/traces", {"service": query.query, "limit": query.limit, "lookback": f"{query.lookback_s}s"}),
        )
    except (urllib.error.URLError, OSError, ValueError) as error:
        data.problem(v3, None, f"cannot be fetched: {getattr(error, 'reason', error)}")
