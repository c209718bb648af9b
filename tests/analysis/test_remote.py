"""Pulling traces from Tempo and Jaeger HTTP APIs, against a local server replaying recorded responses."""

from __future__ import annotations

import gzip
import http.server
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from conftest import DATA
from synthetic import MiB, Scenario, journal_to_otlp

from vlmtrace import semconv as sc
from vlmtrace.analysis.pipeline import analyze
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
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
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
    assert search["q"] == ['{ resource.service.name = "lmdeploy" }'] and search["limit"] == ["5"]
    assert [item.format for item in data.inputs] == ["Tempo trace-by-id v1"] * 2
    verdicts = analyze(data).summary.verdicts
    assert [(v.klass, v.stage) for v in verdicts if v.component == "cache"] == [("cache_retention", sc.STAGE_VISION_FORWARD)]


def test_jaeger_v3_by_trace_id(replay):
    server = replay({"/api/v3/traces/2ea7": gzip.decompress((DATA / "jaeger-ui__api-v3-fixtures__getTrace-response.json.gz").read_bytes())})
    data = TraceData()
    pull_jaeger(data, Query(server.url, trace_ids=("2ea7",)))
    assert data.spans.count == 40 and data.problems == []


def test_jaeger_without_v3_falls_back_to_v1_search(replay):
    server = replay({"/api/traces": (DATA / "jaeger-ui__2992f2a5b5d037a8aabffd08ef384237.json").read_bytes()})
    data = TraceData()
    pull_jaeger(data, Query(server.url, query="issue115", limit=3, lookback_s=600))
    assert data.spans.count == 2
    v1 = urllib.parse.parse_qs(urllib.parse.urlsplit(server.requests[-1]).query)
    assert v1 == {"service": ["issue115"], "limit": ["3"], "lookback": ["600s"]}


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
    leaking, _ = journal(Scenario(requests=80, rates={"cache": 8 * MiB}, stages={"cache": sc.STAGE_VISION_FORWARD}), name="leak.jsonl")
    before_id, after_id = "a" * 32, "b" * 32
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    server = replay({f"/api/traces/{before_id}": _tempo_v1_from_journal(clean, tmp_path / "a"),
                     f"/api/traces/{after_id}": _tempo_v1_from_journal(leaking, tmp_path / "b")})
    result = CliRunner().invoke(app, ["diff", before_id, after_id, "--tempo", server.url, "--fail-on-regression",
                                      "-o", str(tmp_path / "d.html"), "--json", str(tmp_path / "d.json")])
    assert result.exit_code == 1, result.output
    assert [urllib.parse.urlsplit(path).path for path in server.requests] == [f"/api/traces/{before_id}", f"/api/traces/{after_id}"]
    changes = orjson.loads((tmp_path / "d.json").read_bytes())["changes"]
    assert [(c["component"], c["after"]["class"]) for c in changes if c["verdict"] == "regressed"] == [("cache", "cache_retention")]
