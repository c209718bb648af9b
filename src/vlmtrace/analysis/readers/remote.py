"""Pull traces from Tempo or Jaeger over HTTP, where fleets keep them, with the standard library only.

Tempo: `/api/search?q=<TraceQL>` lists trace ids, `/api/traces/<id>` returns each (v1 JSON).
Jaeger: `/api/v3/traces?query.service_name=…` (API v3) returns the traces themselves; servers
without v3 answer 404 and are asked `/api/traces?service=…` (API v1). Responses are read exactly as
files with the same content would be.

A search reads every trace it matches within `lookback_s`, page by page (`paging`), unless `limit` asks
for a sample: the newest `limit` traces. Every pull is bounded: the bytes of all its responses
(`budget_bytes`) and of one (`max_bytes`), and the time one response may take (`timeout_s`, from the
request until its last byte). A server that refuses, never answers or answers too slowly becomes a
problem naming the URL, never a hang. Where a bound cut a search short, or `limit` made it a sample, a
warning (`pull_incomplete`, `pull_sample`) says how many traces were read of how many matched.
"""

from __future__ import annotations

import dataclasses
import datetime
import gzip
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection

import orjson

from vlmtrace.analysis.readers.detect import add_payload
from vlmtrace.analysis.readers.documents import add_document
from vlmtrace.analysis.readers.files import GZIP_MAGIC
from vlmtrace.analysis.readers.paging import Cut, Page, Paged, page_through
from vlmtrace.analysis.readers.search_pages import (
    tempo_starts,
    v1_only,
    v1_starts,
    v3_only,
    v3_starts,
)
from vlmtrace.analysis.trace_data import InputInfo, TraceData

TIMEOUT_S = 60.0
MAX_BYTES = 500_000_000
BUDGET_BYTES = 2_000_000_000
PAGE = 100  # traces a Jaeger search is asked for at a time
TEMPO_PAGE = 1000  # trace ids a Tempo search is asked for at a time
V3, V1 = "Jaeger API v3", "Jaeger API v1"
_CHUNK = 1024 * 1024
_ERROR_BODY_BYTES = 2000

Progress = Callable[[str], None]


@dataclasses.dataclass
class Query:
    base_url: str
    query: str | None = None  # TraceQL for Tempo, a service name for Jaeger
    trace_ids: tuple[str, ...] = ()
    limit: int | None = None  # a sample of the newest `limit` traces; None: every trace matched
    lookback_s: int = 3600
    timeout_s: float = TIMEOUT_S
    max_bytes: int = MAX_BYTES
    budget_bytes: int = BUDGET_BYTES
    page: int | None = None  # traces (Jaeger) or trace ids (Tempo) a search asks for at a time: PAGE, TEMPO_PAGE


class NotFound(Exception):
    def __init__(self, url: str, body: bytes) -> None:
        super().__init__(url)
        self.body = body


class PullError(Exception):
    """The server could not be asked or did not answer in bounds; the message says which and why."""

    bound = "error"


class _TooLarge(PullError):
    bound = "bytes"

    def __init__(self, limit: int, received: int) -> None:
        super().__init__(f"the response is larger than {limit / 1e6:g} MB")
        self.received = received


class _TooSlow(PullError):
    bound = "time"


def _get(url: str, query: Query, progress: Progress | None, max_bytes: int | None = None) -> bytes:
    max_bytes = query.max_bytes if max_bytes is None else max_bytes
    request = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "vlmtrace"})
    deadline = time.monotonic() + query.timeout_s
    try:
        # The socket timeout bounds each wait for bytes; the deadline bounds a server that trickles them.
        with urllib.request.urlopen(request, timeout=query.timeout_s) as response:
            chunks, received = [], 0
            while chunk := response.read1(_CHUNK):  # what has arrived: read() would wait for a whole chunk
                received += len(chunk)
                if received > max_bytes:
                    raise _TooLarge(max_bytes, received)
                if time.monotonic() > deadline:
                    raise _TooSlow(f"the response took longer than {query.timeout_s:g}s (--timeout)")
                chunks.append(chunk)
                if progress is not None:
                    progress(f"{url}: {received / 1e6:.1f} MB")
            if response.length:  # what Content-Length promised and the server did not send
                raise PullError(f"the connection closed after {received} of {received + response.length} bytes")
            return b"".join(chunks)
    except urllib.error.HTTPError as error:
        body = error.read(_ERROR_BODY_BYTES)
        if error.code == 404:
            raise NotFound(url, body) from None
        raise PullError(f"HTTP {error.code}: {body.decode('utf-8', 'replace').strip() or error.reason}") from None
    except TimeoutError:
        raise _TooSlow(f"no answer within {query.timeout_s:g}s (--timeout)") from None
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, TimeoutError):
            raise _TooSlow(f"no answer within {query.timeout_s:g}s (--timeout)") from None
        raise PullError(f"cannot connect: {getattr(reason, 'strerror', None) or reason}") from None
    except http.client.HTTPException as error:  # a status line that is not HTTP's
        raise PullError(f"not an HTTP answer ({type(error).__name__})") from None
    except (OSError, ValueError) as error:  # a connection reset mid-answer, a malformed URL
        raise PullError(str(error)) from None


class Budget:
    """The requests of one pull, within its byte budget: a request that fails becomes a problem naming its
    URL and a `Cut` that stops the pull."""

    def __init__(self, data: TraceData, query: Query, progress: Progress | None) -> None:
        self.data, self.query, self.progress = data, query, progress
        self.spent = 0

    def get(self, url: str) -> bytes:
        """The body (gunzipped); a 404 raises NotFound for the caller to judge."""
        left = self.query.budget_bytes - self.spent
        try:
            body = _get(url, self.query, self.progress, min(self.query.max_bytes, left))
        except _TooLarge as error:
            self.spent += error.received
            if left < self.query.max_bytes:
                raise Cut(
                    "bytes", f"the pull reached its budget of {self.query.budget_bytes / 1e6:g} MB (--max-mb)"
                ) from None
            raise Cut("bytes", f"one response is larger than {self.query.max_bytes / 1e6:g} MB") from None
        except NotFound:
            raise
        except PullError as error:
            self.data.problem(url, None, f"cannot be fetched: {error}")
            raise Cut(error.bound, str(error)) from None
        self.spent += len(body)
        if body[:2] == GZIP_MAGIC:
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError) as error:
                self.data.problem(url, None, f"compressed response cannot be read: {error}")
                raise Cut("error", f"{url}: compressed response cannot be read") from None
        return body

    def document(self, url: str) -> dict:
        """The body as a JSON object; anything else is a problem and a `Cut`."""
        try:
            document = orjson.loads(self.get(url))
        except orjson.JSONDecodeError as error:
            self.data.problem(url, None, f"not valid JSON ({error.msg})")
            raise Cut("error", f"{url}: not valid JSON") from None
        if not isinstance(document, dict):
            self.data.problem(url, None, "not a JSON object")
            raise Cut("error", f"{url}: not a JSON object")
        return document


def url_of(base: str, path: str, params: dict | None = None) -> str:
    url = base.rstrip("/") + path
    return url + ("?" + urllib.parse.urlencode(params) if params else "")


def fetch_into(data: TraceData, url: str, query: Query, progress: Progress | None) -> None:
    try:
        add_payload(data, _get(url, query, progress), url)
    except NotFound:
        data.problem(url, None, "not found (HTTP 404)")
    except PullError as error:
        data.problem(url, None, f"cannot be fetched: {error}")


def rfc3339(ns: int, timespec: str = "microseconds") -> str:
    moment = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=ns // 1000)
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")


def tell(data: TraceData, query: Query, paged: Paged, what: str, source: str, exact: bool) -> None:
    """A warning where the search read less than it matched: a sample (the user's --limit) or a pull a
    bound cut short; the rates of what was read are those of the stretch it covers. `exact`: whether
    `paged.matched` counts every trace matched, or only those seen before the pull stopped."""
    if paged.complete:
        return
    sample = paged.bound == "limit"
    read, matched = len(paged.read), paged.matched
    stretch = (
        f", every trace from {rfc3339(min(paged.read.values()), 'seconds')} to "
        f"{rfc3339(max(paged.read.values()), 'seconds')}"
        if paged.read
        else ""
    )
    more = "" if exact else "at least "
    if not read:
        text = f"Incomplete pull: no trace of {what} read; stopped: {paged.reason}"
    elif sample:
        text = (
            f"A sample: the newest {read} of {more}{matched} traces of {what} (--limit {query.limit}){stretch}; "
            "rates are this stretch's, not the whole run's"
        )
    else:
        text = (
            f"Incomplete pull: {read} of {more}{matched} traces of {what} read{stretch}; stopped: "
            f"{paged.reason}; rates are this stretch's, not the whole run's"
        )
    data.warnings.append(
        {
            "source": source,
            "kind": "pull_sample" if sample else "pull_incomplete",
            "message": text,
            "traces_read": read,
            "traces_matched": matched,
            "matched_exactly": not more,
            "bound": paged.bound,
            "t": None,
        }
    )


def pull_tempo(data: TraceData, query: Query, progress: Progress | None = None) -> None:
    if query.trace_ids:
        for trace_id in query.trace_ids:
            fetch_into(data, url_of(query.base_url, f"/api/traces/{urllib.parse.quote(trace_id)}"), query, progress)
        return
    budget = Budget(data, query, progress)
    end_ns = time.time_ns() + 10**9
    start_ns = end_ns - (query.lookback_s + 1) * 10**9
    search = url_of(query.base_url, "/api/search", {"q": query.query} if query.query else None)

    def ask(low: int, high: int, count: int) -> Page:
        params = {
            "limit": count,
            "start": low // 10**9,
            "end": high // 10**9,
            **({"q": query.query} if query.query else {}),
        }
        url = url_of(query.base_url, "/api/search", params)
        try:
            return Page(tempo_starts(budget.document(url)))
        except NotFound:
            data.problem(url, None, "Tempo search failed: not found (HTTP 404)")
            raise Cut("error", f"{url}: not found (HTTP 404)") from None

    # Trace ids are small: every one the search matches is listed, then the traces are fetched, newest first.
    found = page_through(ask, lambda page, traces: None, start_ns, end_ns, query.page or TEMPO_PAGE, None, 10**9)
    newest = sorted(found.read, key=lambda trace: -found.read[trace])
    fetched = Paged({}, found.matched, found.pages, found.bound, found.reason)
    if query.limit is not None and len(newest) > query.limit and found.complete:
        fetched.bound, fetched.reason = "limit", f"--limit {query.limit}"
    for trace in newest[: query.limit]:
        url = url_of(query.base_url, f"/api/traces/{urllib.parse.quote(trace)}")
        try:
            add_payload(data, budget.get(url), url)
        except NotFound:
            data.problem(url, None, "not found (HTTP 404)")
            continue
        except Cut as cut:
            fetched.bound, fetched.reason = cut.bound, cut.reason
            break
        fetched.read[trace] = found.read[trace]
    if not found.matched and found.complete:
        data.problem(search, None, "Tempo search found no traces", "note")
    tell(data, query, fetched, f"the search {query.query!r}" if query.query else "the search", search, found.complete)


def _v3_not_found(error: NotFound) -> str | None:
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
            v3 = url_of(query.base_url, f"/api/v3/traces/{quoted}")
            try:
                add_payload(data, _get(v3, query, progress), v3)
            except NotFound as error:
                if (message := _v3_not_found(error)) is not None:
                    data.problem(v3, None, f"not found (HTTP 404: {message})")
                else:
                    fetch_into(data, url_of(query.base_url, f"/api/traces/{quoted}"), query, progress)
            except PullError as error:
                data.problem(v3, None, f"cannot be fetched: {error}")
        return
    if not query.query:
        data.problem(query.base_url, None, "a Jaeger search needs a service name (--query SERVICE) or --trace-id")
        return
    _search_jaeger(data, query, progress)


def _search_jaeger(data: TraceData, query: Query, progress: Progress | None) -> None:
    """Every trace of the service within the lookback (or the newest `limit`), by API v3, else v1."""
    budget = Budget(data, query, progress)
    end_ns = time.time_ns() + 10**9  # the end rounded up
    start_ns = end_ns - (query.lookback_s + 1) * 10**9
    api = V3

    def ask(low: int, high: int, count: int) -> Page:
        nonlocal api
        if api == V3:
            url = url_of(
                query.base_url,
                "/api/v3/traces",
                {
                    "query.service_name": query.query,
                    "query.start_time_min": rfc3339(low),
                    "query.start_time_max": rfc3339(high),
                    # The trace count: Jaeger v2's HTTP gateway reads `num_traces` (without it the in-memory store
                    # refuses the search); `search_depth`, the field's name in the API v3 proto, is for gateways
                    # that map parameters onto the proto (grpc-gateway).
                    "query.num_traces": count,
                    "query.search_depth": count,
                },
            )
            try:
                document = budget.document(url)
                return Page(v3_starts(document), (url, document))
            except NotFound as error:
                if _v3_not_found(error) is not None:
                    return Page({})  # none in this window
                api = V1
        url = url_of(
            query.base_url,
            "/api/traces",
            {"service": query.query, "start": low // 1000, "end": high // 1000, "limit": count},
        )
        try:
            document = budget.document(url)
        except NotFound:
            data.problem(url, None, "not found (HTTP 404): this server answers neither Jaeger's API v3 nor v1")
            raise Cut("error", f"{url}: not found (HTTP 404)") from None
        return Page(v1_starts(document), (url, document))

    def keep(page: Page, traces: Collection[str]) -> None:
        url, document = page.body
        add_document(data, (v3_only if api == V3 else v1_only)(document, traces), url, 1)

    spans_before = data.spans.count
    page = min(query.page or PAGE, query.limit or PAGE)
    paged = page_through(ask, keep, start_ns, end_ns, page, query.limit, 1000)
    search = (
        url_of(query.base_url, "/api/v3/traces", {"query.service_name": query.query})
        if api == V3
        else url_of(query.base_url, "/api/traces", {"service": query.query})
    )
    if paged.read:
        data.inputs.append(InputInfo(search, api, data.spans.count - spans_before, 0))
    elif paged.complete:
        data.problem(
            search,
            None,
            f"Jaeger found no traces of service {query.query!r} between "
            f"{rfc3339(start_ns, 'seconds')} and {rfc3339(end_ns, 'seconds')}",
        )
    tell(data, query, paged, f"service {query.query!r}", search, exact=False)
