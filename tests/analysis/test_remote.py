"""Pulling traces from Tempo and Jaeger HTTP APIs, against a local server replaying recorded responses."""

from __future__ import annotations

import gzip
import http.server
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from synthetic import MiB, Scenario, journal_to_otlp

from conftest import DATA
from vlmtrace import semconv as sc
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.paging import Cut, Page, page_through
from vlmtrace.analysis.readers.remote import Query, pull_jaeger, pull_tempo
from vlmtrace.analysis.trace_data import TraceData


class Replay(http.server.ThreadingHTTPServer):
    """Answers each known path (query string ignored) with its recorded body; 404 otherwise."""

    def __init__(self, responses: dict[str, bytes]) -> None:
        self.responses = responses
        self.requests: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        body = self.server.responses.get(urllib.parse.urlsplit(self.path).path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def replay() -> Iterator[Callable[[dict[str, bytes]], Replay]]:
    servers = []

    def start(responses: dict[str, bytes]) -> Replay:
        server = Replay(responses)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _tempo_v1_from_journal(journal_path: Path, tmp_path: Path) -> bytes:
    otlp = tmp_path / "otlp.jsonl"
    journal_to_otlp(journal_path, otlp, spans_per_line=1_000_000)
    document = orjson.loads(otlp.read_bytes().splitlines()[0])
    return orjson.dumps({"batches": document["resourceSpans"]})


def test_tempo_search_then_each_trace(replay, journal, tmp_path: Path):
    path, _ = journal(Scenario(requests=80, rates={"cache": 8 * MiB}, stages={"cache": sc.STAGE_VISION_FORWARD}))
    server = replay(
        {
            "/api/search": orjson.dumps({"traces": [{"traceID": "aa11"}, {"traceID": "bb22"}]}),
            "/api/traces/aa11": _tempo_v1_from_journal(path, tmp_path),
            "/api/traces/bb22": gzip.decompress((DATA / "kiali__tracingtest__responseTrace.json.gz").read_bytes()),
        }
    )
    data = TraceData()
    pull_tempo(data, Query(server.url, query='{ resource.service.name = "lmdeploy" }', limit=5))
    search = urllib.parse.parse_qs(urllib.parse.urlsplit(server.requests[0]).query)
    assert search["q"] == ['{ resource.service.name = "lmdeploy" }'] and search["limit"] == ["1000"]
    assert [item.format for item in data.inputs] == ["Tempo trace-by-id v1"] * 2
    verdicts = analyze(data).summary.verdicts
    assert [(v.klass, v.stage) for v in verdicts if v.component == "cache"] == [
        ("cache_retention", sc.STAGE_VISION_FORWARD)
    ]


def test_jaeger_v3_by_trace_id(replay):
    server = replay(
        {
            "/api/v3/traces/2ea7": gzip.decompress(
                (DATA / "jaeger-ui__api-v3-fixtures__getTrace-response.json.gz").read_bytes()
            )
        }
    )
    data = TraceData()
    pull_jaeger(data, Query(server.url, trace_ids=("2ea7",)))
    assert data.spans.count == 40 and data.problems == []


def test_jaeger_without_v3_falls_back_to_v1_search(replay):
    server = replay({"/api/traces": (DATA / "jaeger-ui__2992f2a5b5d037a8aabffd08ef384237.json").read_bytes()})
    data = TraceData()
    pull_jaeger(data, Query(server.url, query="issue115", limit=3, lookback_s=600))
    assert data.spans.count == 2
    v1 = urllib.parse.parse_qs(urllib.parse.urlsplit(server.requests[-1]).query)
    assert v1.keys() == {"service", "start", "end", "limit"} and (v1["service"], v1["limit"]) == (["issue115"], ["3"])
    assert 600_000_000 <= int(v1["end"][0]) - int(v1["start"][0]) <= 602_000_000  # microseconds
    assert data.warnings == []  # fewer traces than the limit: every one was read


def test_unreachable_server_is_a_problem_not_a_crash():
    data = TraceData()
    pull_tempo(data, Query("http://127.0.0.1:9", trace_ids=("abc",)))
    (problem,) = data.problems
    assert problem.source == "http://127.0.0.1:9/api/traces/abc" and problem.severity == "error"


def test_missing_trace_is_named(replay):
    server = replay({})
    data = TraceData()
    pull_tempo(data, Query(server.url, trace_ids=("nope",)))
    assert [p.reason for p in data.problems] == ["not found (HTTP 404)"]


def test_diff_pulls_each_run_from_tempo_by_trace_id(replay, journal, tmp_path: Path):
    from typer.testing import CliRunner

    from vlmtrace.cli.main import app

    clean, _ = journal(Scenario(requests=80), name="clean.jsonl")
    leaking, _ = journal(
        Scenario(requests=80, rates={"cache": 8 * MiB}, stages={"cache": sc.STAGE_VISION_FORWARD}), name="leak.jsonl"
    )
    before_id, after_id = "a" * 32, "b" * 32
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    server = replay(
        {
            f"/api/traces/{before_id}": _tempo_v1_from_journal(clean, tmp_path / "a"),
            f"/api/traces/{after_id}": _tempo_v1_from_journal(leaking, tmp_path / "b"),
        }
    )
    result = CliRunner().invoke(
        app,
        [
            "diff",
            before_id,
            after_id,
            "--tempo",
            server.url,
            "--fail-on-regression",
            "-o",
            str(tmp_path / "d.html"),
            "--json",
            str(tmp_path / "d.json"),
        ],
    )
    assert result.exit_code == 1, result.output
    assert [urllib.parse.urlsplit(path).path for path in server.requests] == [
        f"/api/traces/{before_id}",
        f"/api/traces/{after_id}",
    ]
    changes = orjson.loads((tmp_path / "d.json").read_bytes())["changes"]
    assert [(c["component"], c["after"]["class"]) for c in changes if c["verdict"] == "regressed"] == [
        ("cache", "cache_retention")
    ]


class _Store:
    """A trace search as Jaeger's stores answer one: at most `count` of the traces with a span starting in
    [low, high] (both included), in the store's own order: "random" (no order at all) or "newest" (the last
    received first, as Jaeger v2's in-memory ring buffer). After `fail_after` answers, a bound cuts the pull."""

    def __init__(self, starts: dict[str, int], order: str, fail_after: int | None = None) -> None:
        self.starts, self.order, self.fail_after = starts, order, fail_after
        self.asked: list[tuple[int, int, int]] = []
        self._random = random.Random(7)

    def ask(self, low: int, high: int, count: int) -> Page:
        if self.fail_after is not None and len(self.asked) >= self.fail_after:
            raise Cut("bytes", "the pull reached its budget")
        self.asked.append((low, high, count))
        inside = [trace for trace, start in self.starts.items() if low <= start <= high]
        if self.order == "random":
            self._random.shuffle(inside)
        else:
            inside.sort(key=lambda trace: -self.starts[trace])
        return Page({trace: self.starts[trace] for trace in inside[:count]})


HOUR_NS = 3600 * 10**9
T0 = 1_796_000_000 * 10**9


def _run_of(traces: int, bursts: bool = False) -> dict[str, int]:
    """Trace starts over an hour: evenly, or in bursts of 40 within a millisecond (a batch of requests)."""
    rng = random.Random(traces)
    if bursts:
        return {f"{i:032x}": T0 + (i // 40) * 240 * 10**9 + rng.randrange(10**6) for i in range(traces)}
    return {f"{i:032x}": T0 + rng.randrange(HOUR_NS) for i in range(traces)}


def _kept(pages: list[tuple[Page, list[str]]]) -> list[str]:
    return [trace for _, traces in pages for trace in traces]


@pytest.mark.parametrize("order", ["random", "newest"])
@pytest.mark.parametrize("bursts", [False, True], ids=["even", "bursts"])
def test_a_search_pages_through_every_trace_once_whatever_order_the_store_answers_in(order: str, bursts: bool):
    starts = _run_of(500, bursts)
    store, kept = _Store(starts, order), []
    paged = page_through(
        store.ask,
        lambda page, traces: kept.append((page, list(traces))),
        T0,
        T0 + HOUR_NS,
        page=40,
        limit=None,
        resolution_ns=1000,
    )
    assert sorted(_kept(kept)) == sorted(starts)  # each trace read once, none missed
    assert (paged.complete, paged.matched, len(paged.read), paged.pages) == (True, 500, 500, len(store.asked))
    assert all(count == 40 for _, _, count in store.asked)
    # Windows were read newest first: what a pull stopped at any point had read is a stretch of the run.
    firsts = [min(page.starts[trace] for trace in traces) for page, traces in kept if traces]
    assert firsts == sorted(firsts, reverse=True)


@pytest.mark.parametrize("order", ["random", "newest"])
def test_a_run_in_the_last_minute_of_the_lookback_is_read_in_a_few_answers_whatever_the_order(order: str):
    """The page's own starts place the cuts: a full page splits where its traces are, not the empty hour."""
    rng = random.Random(121)
    starts = {f"{i:032x}": T0 + HOUR_NS - rng.randrange(60 * 10**9) for i in range(121)}
    store = _Store(starts, order)
    paged = page_through(
        store.ask, lambda page, traces: None, T0, T0 + HOUR_NS, page=100, limit=None, resolution_ns=1000
    )
    assert (len(paged.read), paged.complete) == (121, True) and paged.pages <= 4


@pytest.mark.parametrize("order", ["random", "newest"])
def test_a_pull_cut_short_has_read_every_trace_of_the_newest_stretch_and_says_how_many_matched(order: str):
    starts = _run_of(500)
    store = _Store(starts, order, fail_after=8)
    paged = page_through(
        store.ask, lambda page, traces: None, T0, T0 + HOUR_NS, page=40, limit=None, resolution_ns=1000
    )
    assert (paged.bound, paged.reason) == ("bytes", "the pull reached its budget")
    oldest_read = min(paged.read.values())
    assert 0 < len(paged.read) < 500
    assert paged.read == {trace: start for trace, start in starts.items() if start >= oldest_read}  # no gaps
    assert len(paged.read) <= paged.matched <= 500  # matched: every trace an answer named, read or not


def test_a_limit_reads_the_newest_traces_and_says_it_is_a_sample():
    starts = _run_of(121)
    newest = sorted(starts, key=lambda trace: -starts[trace])
    paged = page_through(
        _Store(starts, "random").ask, lambda page, traces: None, T0, T0 + HOUR_NS, page=20, limit=20, resolution_ns=1000
    )
    assert sorted(paged.read) == sorted(newest[:20])  # the newest 20, not 20 scattered over the run
    assert (paged.bound, paged.reason) == ("limit", "--limit 20") and 20 < paged.matched <= 121


def test_a_limit_above_what_matched_reads_everything_and_is_no_sample():
    starts = _run_of(30)
    paged = page_through(
        _Store(starts, "random").ask, lambda page, traces: None, T0, T0 + HOUR_NS, page=20, limit=30, resolution_ns=1000
    )
    assert (paged.complete, len(paged.read), paged.matched) == (True, 30, 30)


def test_more_traces_in_one_instant_than_a_page_holds_is_a_bound():
    starts = {f"{i:032x}": T0 for i in range(50)}
    paged = page_through(
        _Store(starts, "random").ask,
        lambda page, traces: None,
        T0,
        T0 + HOUR_NS,
        page=20,
        limit=None,
        resolution_ns=1000,
    )
    assert paged.bound == "count" and paged.read == {} and 20 <= paged.matched <= 50
    assert paged.reason == "more than 20 traces start within one window of 1000 ns"


class _TempoSearch(http.server.BaseHTTPRequestHandler):
    """Tempo's `/api/search` over the server's `starts` (start and end in seconds, `limit` ids, in no
    order), and `/api/traces/<id>` answering an empty trace of `size` bytes."""

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.server.requests.append(self.path)
        if url.path == "/api/search":
            params = {key: values[0] for key, values in urllib.parse.parse_qs(url.query).items()}
            low, high = int(params["start"]) * 10**9, (int(params["end"]) + 1) * 10**9
            inside = [trace for trace, start in self.server.starts.items() if low <= start < high]
            random.Random(len(self.server.requests)).shuffle(inside)
            body = orjson.dumps(
                {
                    "traces": [
                        {"traceID": trace, "startTimeUnixNano": str(self.server.starts[trace])}
                        for trace in inside[: int(params["limit"])]
                    ]
                }
            )
        else:
            body = b'{"batches": []}'.ljust(self.server.size)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tempo() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TempoSearch)
    now = time.time_ns()
    server.starts = {f"{i:032x}": now - (250 - i) * 7 * 10**9 for i in range(250)}  # one every 7 s, the last now
    server.requests, server.size = [], 1000
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _fetched(server) -> list[str]:
    return [path.rsplit("/", 1)[1] for path in server.requests if path.startswith("/api/traces/")]


def test_tempo_lists_every_trace_id_page_by_page_then_fetches_each_once(tempo):
    data = TraceData()
    pull_tempo(data, Query(f"http://127.0.0.1:{tempo.server_address[1]}", query="{}", page=40))
    assert sorted(_fetched(tempo)) == sorted(tempo.starts) and data.warnings == [] and data.problems == []
    assert sum(path.startswith("/api/search") for path in tempo.requests) > 250 / 40


def test_tempo_with_a_limit_fetches_the_newest_and_says_it_is_a_sample_of_all_it_matched(tempo):
    data = TraceData()
    pull_tempo(data, Query(f"http://127.0.0.1:{tempo.server_address[1]}", query="{}", page=40, limit=10))
    assert sorted(_fetched(tempo)) == sorted(tempo.starts)[-10:]
    (warning,) = data.warnings
    assert (warning["kind"], warning["traces_read"], warning["traces_matched"], warning["matched_exactly"]) == (
        "pull_sample",
        10,
        250,
        True,
    )
    assert warning["message"].startswith(
        "A sample: the newest 10 of 250 traces of the search '{}' (--limit 10), every trace from "
    )


def test_tempo_stops_at_its_byte_budget_and_says_how_many_it_read(tempo):
    data = TraceData()
    pull_tempo(data, Query(f"http://127.0.0.1:{tempo.server_address[1]}", query="{}", page=40, budget_bytes=60_000))
    (warning,) = data.warnings
    read = warning["traces_read"]
    assert _fetched(tempo)[:read] == sorted(tempo.starts, reverse=True)[:read]  # newest first
    assert (warning["kind"], warning["traces_matched"], warning["bound"]) == ("pull_incomplete", 250, "bytes")
    assert 0 < read < 60 and warning["message"].startswith(
        f"Incomplete pull: {read} of 250 traces of the search '{{}}' read"
    )
    assert "stopped: the pull reached its budget of 0.06 MB (--max-mb)" in warning["message"]
