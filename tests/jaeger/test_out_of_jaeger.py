"""GPU-recorded journals replayed into a real Jaeger over OTLP, then `vlmtrace report --jaeger` reads them
back: the verdicts must be the journal's, and what Jaeger cannot hold (memory samples, spans in flight,
the crash) must be exactly what differs. A Jaeger that is down or does not answer gives exit 2 at once."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from pathlib import Path

import orjson
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from typer.testing import CliRunner

from tests.jaeger.conftest import ALL_TIME, v3_span_count
from tests.support.journal_replay import journal_spans, replay
from vlmtrace.analysis.readers.remote import Query, pull_jaeger
from vlmtrace.analysis.registry import is_leak
from vlmtrace.analysis.trace_data import TraceData
from vlmtrace.cli.main import app

GPU = Path(__file__).resolve().parents[1] / "analysis" / "data" / "gpu"
runner = CliRunner()


def _report(tmp_path: Path, *arguments: str) -> tuple[int, str, dict | None]:
    tmp_path.mkdir(exist_ok=True)
    summary = tmp_path / "summary.json"
    result = runner.invoke(app, ["report", *arguments, "-o", str(tmp_path / "report.html"), "--json", str(summary)])
    return result.exit_code, result.output, orjson.loads(summary.read_bytes()) if summary.exists() else None


def _verdicts(summary: dict) -> list[tuple]:
    """Class and slope of every component, and the stage of what grows. Where a component is flat, which
    stage its noise went to depends on the readings: OTLP carries no memory samples."""
    return sorted(
        (v["component"], v["class"], v["stage"] if is_leak(v["class"]) else None, v["slope_bytes_per_request"])
        for v in summary["verdicts"]
    )


def _replayed(jaeger, name: str, exporter) -> tuple[str, int]:
    """Replay the journal under a service name of its own (the session's Jaeger is shared), ending now."""
    service = f"replay-{name}"
    spans = journal_spans(GPU / f"{name}.jsonl.gz", service_name=service, end_at_ns=time.time_ns())
    replay(spans, exporter)
    traces = len({span.context.trace_id for span in spans})
    jaeger.wait_for(
        "/api/v3/traces",
        lambda d: v3_span_count(d) == len(spans),
        {"query.service_name": service, "query.num_traces": traces, **ALL_TIME},
    )
    return service, traces


def _without_samples(name: str, directory: Path) -> Path:
    """The journal less its memory samples: the records OTLP (and so Jaeger) can carry."""
    path = directory / f"{name}-spans-only.jsonl"
    with gzip.open(GPU / f"{name}.jsonl.gz", "rb") as journal:
        path.write_bytes(b"".join(line for line in journal if not line.startswith(b'{"k":"sample"')))
    return path


@pytest.mark.jaeger
def test_a_tensor_leak_read_back_from_jaeger_has_the_journals_verdict(jaeger, tmp_path: Path):
    service, traces = _replayed(
        jaeger, "turbomind-tensor", GrpcExporter(endpoint=jaeger.otlp_grpc_endpoint, insecure=True)
    )
    status, output, from_jaeger = _report(
        tmp_path / "jaeger",
        "--jaeger",
        jaeger.query_url,
        "--query",
        service,
        "--limit",
        str(traces),
        "--lookback",
        "1h",
    )
    assert status == 0, output
    _, _, from_journal = _report(tmp_path / "journal", str(GPU / "turbomind-tensor.jsonl.gz"))
    _, _, from_spans = _report(tmp_path / "spans", str(_without_samples("turbomind-tensor", tmp_path)))

    # Jaeger loses nothing of the spans: the analysis is the journal's less its samples, to the byte.
    assert _verdicts(from_jaeger) == _verdicts(from_spans)
    assert (from_jaeger["spans"], from_jaeger["requests"]) == (from_journal["spans"], from_journal["requests"])
    # The samples (the sampler's readings between spans: 23 here) only refine the noise estimate of
    # components that do not grow; every verdict, stage and the leak's slope stay the journal's.
    assert [v[:3] for v in _verdicts(from_jaeger)] == [v[:3] for v in _verdicts(from_journal)]
    (tensor,) = [v for v in from_jaeger["verdicts"] if v["component"] == "tensor"]
    (in_journal,) = [v for v in from_journal["verdicts"] if v["component"] == "tensor"]
    assert (tensor["class"], tensor["stage"], tensor["slope_bytes_per_request"]) == (
        "tensor_leak",
        "vision.preprocess",
        4 << 20,
    )
    assert tensor["slope_bytes_per_request"] == in_journal["slope_bytes_per_request"]
    assert [i["samples"] for i in from_journal["inputs"]] == [23]
    assert [(i["format"], i["samples"]) for i in from_jaeger["inputs"]] == [("Jaeger API v3", 0)]
    (process,) = from_jaeger["processes"]
    assert (process["service"], process["journal"], process["versions"]) == (service, False, {})


@pytest.mark.jaeger
def test_a_crash_read_back_from_jaeger_loses_the_crash_and_keeps_the_verdict(jaeger, tmp_path: Path):
    service, traces = _replayed(
        jaeger, "turbomind-crash", HttpExporter(endpoint=f"{jaeger.otlp_http_endpoint}/v1/traces")
    )
    status, output, from_jaeger = _report(
        tmp_path / "jaeger", "--jaeger", jaeger.query_url, "--query", service, "--limit", str(traces)
    )
    assert status == 0, output
    _, _, from_journal = _report(tmp_path / "journal", str(GPU / "turbomind-crash.jsonl.gz"))

    assert _verdicts(from_jaeger) == _verdicts(from_journal)
    assert from_jaeger["spans"] == from_journal["spans_ended"] == from_jaeger["spans_ended"]
    # OTLP carries ended spans only: the abort, its stack and the spans it cut short stay in the journal.
    assert from_journal["crashed"] and len(from_journal["in_flight"]) == 53
    assert not from_jaeger["crashed"] and from_jaeger["in_flight"] == [] and from_jaeger["crash"] is None
    assert from_jaeger["requests_completed"] == from_journal["requests_completed"]


@pytest.mark.jaeger
def test_a_search_reads_every_trace_page_by_page_and_a_limit_is_a_sample(jaeger, tmp_path: Path):
    service, traces = _replayed(
        jaeger, "turbomind-none", GrpcExporter(endpoint=jaeger.otlp_grpc_endpoint, insecure=True)
    )
    status, output, summary = _report(tmp_path / "all", "--jaeger", jaeger.query_url, "--query", service)
    assert status == 0, output
    assert summary["warnings"] == [] and "sample" not in output

    progress: list[str] = []
    whole, paged = TraceData(), TraceData()
    pull_jaeger(whole, Query(jaeger.query_url, service))
    pull_jaeger(paged, Query(jaeger.query_url, service, page=3), progress=progress.append)
    assert traces > 3 * 4
    assert sorted(paged.spans.finish()["trace_id"]) == sorted(whole.spans.finish()["trace_id"])
    assert paged.spans.count == whole.spans.count == summary["spans"]
    assert paged.problems == paged.warnings == [] and [i.format for i in paged.inputs] == ["Jaeger API v3"]
    pages = {line.rsplit(": ", 1)[0] for line in progress}
    assert len(pages) > traces / 3 and all("/api/v3/traces?" in page for page in pages)

    status, output, summary = _report(
        tmp_path / "sample", "--jaeger", jaeger.query_url, "--query", service, "--limit", "5"
    )
    assert status == 0, output
    (warning,) = summary["warnings"]
    assert (warning["kind"], warning["traces_read"]) == ("pull_sample", 5) and 5 < warning["traces_matched"] <= traces
    assert 0 < summary["requests"] <= 5 * 4  # 1-4 prompts per pipeline call, one trace per call


@pytest.mark.jaeger
def test_a_response_over_its_bound_stops_the_pull_and_says_so(jaeger, tmp_path: Path):
    service, _ = _replayed(jaeger, "turbomind-host", GrpcExporter(endpoint=jaeger.otlp_grpc_endpoint, insecure=True))
    small = TraceData()
    pull_jaeger(small, Query(jaeger.query_url, service, max_bytes=100_000))
    assert small.spans.count == 0 and small.problems == []
    assert [(w["kind"], w["message"]) for w in small.warnings] == [
        (
            "pull_incomplete",
            (f"Incomplete pull: no trace of service '{service}' read; stopped: one response is larger than 0.1 MB"),
        )
    ]
    status, output, _ = _report(tmp_path, "--jaeger", jaeger.query_url, "--query", service, "--max-mb", "0.1")
    assert status == 2
    assert (
        f"Incomplete pull: no trace of service '{service}' read; stopped: the pull reached its budget of 0.1 MB "
        "(--max-mb) (exit 2; --limit N asks for a sample)"
    ) in " ".join(output.split())


@pytest.mark.jaeger
def test_an_empty_search_says_what_was_searched(jaeger, tmp_path: Path):
    status, output, _ = _report(
        tmp_path, "--jaeger", jaeger.query_url, "--query", "no-such-service", "--lookback", "5m"
    )
    assert status == 2
    assert "Jaeger found no traces of service 'no-such-service' between" in " ".join(output.split())


def test_a_closed_port_exits_2_with_the_reason(tmp_path: Path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"  # bound, never listening: refused
        status, output, _ = _report(tmp_path, "--jaeger", url, "--query", "lmdeploy")
    assert status == 2
    assert "cannot be fetched: cannot connect: Connection refused" in " ".join(output.split())


class _BadServer:
    """Accepts connections and sends each `answer`, then (`then`) holds the connection open in silence,
    trickles a byte every 0.2 s (never silent long enough for a socket timeout), or closes it."""

    def __init__(self, answer: bytes, then: str) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._answer = answer
        self._then = then
        self._closed = threading.Event()
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed by close()
                return
            self._connections.append(connection)
            connection.sendall(self._answer)
            if self._then == "trickle":
                threading.Thread(target=self._drip, args=(connection,), daemon=True).start()
            elif self._then == "close":
                connection.shutdown(socket.SHUT_RDWR)

    def _drip(self, connection: socket.socket) -> None:
        while not self._closed.wait(0.2):
            try:
                connection.sendall(b" ")
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._socket.close()
        for connection in self._connections:
            connection.close()


HEADERS = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n{"


@pytest.mark.parametrize(
    ("answer", "then", "message"),
    [
        (b"", "hold", "no answer within 1s (--timeout)"),
        (HEADERS, "hold", "no answer within 1s (--timeout)"),
        (HEADERS, "trickle", "the response took longer than 1s (--timeout)"),
        (HEADERS, "close", "the connection closed after 1 of 1000000 bytes"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "hold", "not an HTTP answer (BadStatusLine)"),
    ],
    ids=["silent", "stops-mid-body", "trickles", "closes-mid-body", "not-http"],
)
def test_a_server_that_does_not_answer_in_time_or_in_full_exits_2_at_once(
    tmp_path: Path, answer: bytes, then: str, message: str
):
    server = _BadServer(answer, then)
    started = time.monotonic()
    try:
        status, output, _ = _report(tmp_path, "--jaeger", server.url, "--query", "lmdeploy", "--timeout", "1")
    finally:
        server.close()
    assert status == 2, output
    assert message in " ".join(output.split())
    assert time.monotonic() - started < 10
