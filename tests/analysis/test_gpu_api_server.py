"""The api_server under `vlmtrace run` on an H200 (data/gpu/api-server/, docs/gpu.md): one trace per HTTP request.

`benchmarks/gpu_api_server.py --backend pytorch` served four chat requests (one image each, a W3C
`traceparent` each, streaming and not) from LMDeploy 0.18's api_server, whose PyTorch engine runs in a
process of its own, and kept each process's journal and what a file-sink OTLP receiver got. The files are
read here with the script's own readers (`read_journals`, `summarize`; `otlp_file_sink`'s), so the checks
it printed on the GPU are re-run on every CI run, and then looked at more closely than the script does.
"""

from __future__ import annotations

import functools
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import analyse
from vlmtrace import semconv as sc

pytest.importorskip("google.protobuf", reason="benchmarks/otlp_file_sink.py reads OTLP's protobuf JSON mapping")
pytest.importorskip("opentelemetry.proto")

REPO = Path(__file__).resolve().parents[2]
RUN = Path(__file__).parent / "data" / "gpu" / "api-server"
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_api_server as script
import otlp_file_sink as sink

# These traces were recorded when prompt processing had a span of its own (docs/schema.md, "Earlier
# recordings"); it is part of the request span now.
PREPROCESS_AS_RECORDED = "lmdeploy.preprocess"
# and when host memory was the metric vlmtrace.memory.host.rss (process.memory.usage now).
HOST_MEMORY_AS_RECORDED = "vlmtrace.memory.host.rss"

REQUEST = "chat tiny-qwen2vl"
HTTP = "POST /v1/chat/completions"
COMMITTED = json.loads((RUN / "summary.json").read_text())
SERVER, ENGINE, OTHER = (
    next(p["pid"] for p in COMMITTED["processes"] if p["role"] == role) for role in ("server", "engine", "other")
)
GENAI_HISTOGRAMS = {sc.METRIC_REQUEST_DURATION, sc.METRIC_TIME_TO_FIRST_TOKEN, sc.METRIC_TIME_PER_OUTPUT_TOKEN}
MEMORY = {
    sc.METRIC_GPU_MEMORY_USAGE,
    sc.METRIC_GPU_MEMORY_LIMIT,
    sc.METRIC_PROCESS_GPU_MEMORY_USAGE,
    sc.METRIC_TORCH_ALLOCATED,
    sc.METRIC_TORCH_RESERVED,
    sc.METRIC_TORCH_INACTIVE_SPLIT,
    sc.METRIC_NATIVE,
    HOST_MEMORY_AS_RECORDED,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The run's folder as the script left it (journal/, otlp/), the committed gzipped files unpacked."""
    out = tmp_path_factory.mktemp("api-server")
    for path in RUN.rglob("*.gz"):
        target = out / path.relative_to(RUN).with_suffix("")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.decompress(path.read_bytes()))
    return out


@pytest.fixture(scope="module")
def processes(run: Path) -> dict[int, dict]:
    return {process["pid"]: process for process in script.read_journals(run / "journal")}


def test_the_scripts_checks_pass_again_on_the_committed_files(run: Path, processes: dict[int, dict]):
    summary = script.summarize(
        list(processes.values()), COMMITTED["requests"], SERVER, "pytorch", run / "otlp", COMMITTED["stopped"]
    )
    checks = {name: passed for name, passed in COMMITTED["checks"].items() if name != "server_answered"}  # main's own
    assert summary["ok"] and summary["checks"] == checks and all(checks.values()) and len(checks) == 11
    for key in ("processes", "requests", "otlp"):
        assert summary[key] == COMMITTED[key], key
    assert len(COMMITTED["requests"]) == 4 and {r["stream"] for r in COMMITTED["requests"]} == {True, False}


def test_three_processes_each_ended_its_journal_cleanly(processes: dict[int, dict]):
    assert {pid: processes[pid]["ppid"] for pid in processes} == {
        SERVER: COMMITTED["processes"][0]["ppid"],
        ENGINE: SERVER,
        OTHER: ENGINE,
    }
    assert all(process["clean"] for process in processes.values())
    names = {pid: Counter(span["name"] for span in process["spans"].values()) for pid, process in processes.items()}
    assert names[SERVER] == {
        HTTP: 4,
        "GET /v1/models": 1,
        "fastapi.dependencies": 5,
        "fastapi.endpoint": 5,
        "fastapi.serialization": 3,
        REQUEST: 4,
        PREPROCESS_AS_RECORDED: 4,
        sc.SPAN_VISION_PREPROCESS: 4,
        sc.SPAN_EMPTY_CACHE: 1,
    }
    assert names[ENGINE] == {
        sc.SPAN_PYTORCH_STREAM: 4,
        sc.SPAN_PYTORCH_FORWARD: 36,
        sc.SPAN_VISION_FORWARD: 4,
        sc.SPAN_EMPTY_CACHE: 14,
    }
    assert names[OTHER] == {}  # a short-lived child of the engine at start-up: samples only


@pytest.mark.parametrize("index", range(4))
def test_one_trace_per_http_request_across_the_server_and_the_engine(processes: dict[int, dict], index: int):
    sent = COMMITTED["requests"][index]
    trace = {
        pid: [span for span in process["spans"].values() if span["trace_id"] == sent["trace_id"]]
        for pid, process in processes.items()
    }
    by_id = {span["span_id"]: span for spans in trace.values() for span in spans}
    names = {pid: Counter(span["name"] for span in spans) for pid, spans in trace.items()}
    server_names = {
        HTTP: 1,
        "fastapi.dependencies": 1,
        "fastapi.endpoint": 1,
        REQUEST: 1,
        PREPROCESS_AS_RECORDED: 1,
        sc.SPAN_VISION_PREPROCESS: 1,
    }
    if not sent["stream"]:
        server_names["fastapi.serialization"] = 1
    assert names == {SERVER: server_names, ENGINE: {sc.SPAN_PYTORCH_STREAM: 1}, OTHER: {}}
    assert all(span["ended"] for span in by_id.values())

    def parent(span: dict) -> dict:
        return by_id[span["parent_id"]]

    (http,) = [span for span in trace[SERVER] if span["kind"] == "SERVER"]
    assert http["name"] == HTTP and http["parent_id"] == sent["caller_span_id"]  # the caller's traceparent
    assert http["attrs"][sc.HTTP_RESPONSE_STATUS_CODE] == 200
    (request,) = [span for span in trace[SERVER] if span["name"] == REQUEST]
    assert [parent(request)["name"], parent(parent(request))["name"]] == ["fastapi.endpoint", HTTP]
    assert request["attrs"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 8
    assert request["attrs"][sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]
    (vision,) = [span for span in trace[SERVER] if span["name"] == sc.SPAN_VISION_PREPROCESS]
    assert [parent(vision)["name"], parent(parent(vision))["name"]] == [PREPROCESS_AS_RECORDED, REQUEST]
    assert (vision["attrs"]["vlmtrace.vision.image_widths"], vision["attrs"]["vlmtrace.vision.image_heights"]) == (
        [sent["image"][0]],
        [sent["image"][1]],
    )
    # the engine's side, from the engine process: its stream span continues the request span
    (stream,) = trace[ENGINE]
    assert stream["parent_id"] == request["span_id"] and stream["attrs"][sc.STAGE] == sc.STAGE_ENGINE_STREAM
    assert stream["attrs"][sc.LMDEPLOY_SESSION_ID] == request["attrs"][sc.LMDEPLOY_SESSION_ID]
    # the engine steps: traces of their own, each linked to the request span (one request at a time here)
    steps = [
        span
        for span in processes[ENGINE]["spans"].values()
        if span["name"] == sc.SPAN_PYTORCH_FORWARD
        and {"trace_id": sent["trace_id"], "span_id": request["span_id"]} in span["links"]
    ]
    assert len(steps) == sent["engine_steps_linked"] == 9
    assert all(step["parent_id"] is None and step["trace_id"] != sent["trace_id"] for step in steps)
    assert Counter(step["attrs"][sc.STEP_KIND] for step in steps) == {"prefill": 1, "decode": 8}
    assert {tuple(step["attrs"][sc.STEP_SESSION_IDS]) for step in steps} == {
        (request["attrs"][sc.LMDEPLOY_SESSION_ID],)
    }
    (prefill,) = [step for step in steps if step["attrs"][sc.STEP_KIND] == "prefill"]
    assert prefill["attrs"][sc.STEP_TOKENS] == request["attrs"][sc.GEN_AI_USAGE_INPUT_TOKENS]
    vit = [span for span in processes[ENGINE]["spans"].values() if span["name"] == sc.SPAN_VISION_FORWARD]
    assert [span["parent_id"] for span in vit].count(prefill["span_id"]) == 1  # the ViT ran inside the prefill step


@functools.cache
def _received(run: Path) -> list[dict]:
    return sink.received_spans(run / "otlp")


def test_otlp_received_the_journals_spans_from_both_processes(run: Path, processes: dict[int, dict]):
    received = {span["span_id"]: span for span in _received(run)}
    journal = {span["span_id"]: (pid, span) for pid, process in processes.items() for span in process["spans"].values()}
    # all but the engine's last span, an empty_cache at shutdown (the journal has it)
    (missing,) = set(journal) - set(received)
    pid, span = journal[missing]
    assert (pid, span["name"]) == (ENGINE, sc.SPAN_EMPTY_CACHE) and span["start"] == max(
        s["start"] for s in processes[ENGINE]["spans"].values()
    )
    assert set(received) <= set(journal)
    for span_id, span in received.items():
        pid, recorded = journal[span_id]
        assert span["resource"]["process.pid"] == str(pid)
        assert (span["name"], span["trace_id"], span["parent_id"]) == (
            recorded["name"],
            recorded["trace_id"],
            recorded["parent_id"],
        )
        assert span["links"] == [(link["trace_id"], link["span_id"]) for link in recorded["links"]]


def _points(run: Path) -> dict[str, dict]:
    """Per metric: its data kind and the last data points each process sent ({pid: [point]})."""
    metrics: dict[str, dict] = {}
    for request in sink.read_lines(run / "otlp" / "metrics.jsonl"):
        for resource_metrics in request["resourceMetrics"]:
            pid = int(sink.attribute_dict(resource_metrics["resource"]["attributes"])["process.pid"])
            for scope_metrics in resource_metrics["scopeMetrics"]:
                for metric in scope_metrics["metrics"]:
                    kind = next(k for k in ("sum", "gauge", "histogram") if k in metric)
                    entry = metrics.setdefault(metric["name"], {"kind": kind, "unit": metric.get("unit"), "last": {}})
                    entry["last"][pid] = metric[kind]["dataPoints"]
    return metrics


def test_otlp_metrics_hold_the_genai_histograms_and_every_processs_memory(run: Path):
    metrics = _points(run)
    names = dict(sink.received_metric_names(run / "otlp").items())
    assert names[str(SERVER)] >= GENAI_HISTOGRAMS | MEMORY | {sc.METRIC_REQUESTS, sc.METRIC_TOKENS, sc.METRIC_IMAGES}
    assert names[str(ENGINE)] == names[str(OTHER)] == MEMORY | {sc.METRIC_SELF_TIME}
    for name in GENAI_HISTOGRAMS:  # the four requests, counted where the request spans are: the server
        assert (metrics[name]["kind"], metrics[name]["unit"], set(metrics[name]["last"])) == (
            "histogram",
            "s",
            {SERVER},
        )
        (point,) = metrics[name]["last"][SERVER]
        assert int(point["count"]) == 4
    (requests,) = metrics[sc.METRIC_REQUESTS]["last"][SERVER]
    assert int(requests["asInt"]) == 4
    tokens = {
        sink.attribute_dict(p["attributes"])["gen_ai.token.type"]: int(p["asInt"])
        for p in metrics[sc.METRIC_TOKENS]["last"][SERVER]
    }
    assert tokens == {"output": 32, "input": 182}
    for name in MEMORY:
        assert (metrics[name]["kind"], metrics[name]["unit"], set(metrics[name]["last"])) == (
            "sum",
            "By",
            {SERVER, ENGINE, OTHER},
        )


def test_the_analyzer_reads_the_three_journals_together():
    summary = analyse(*sorted((RUN / "journal").glob("*.jsonl.gz"))).summary
    assert (summary.requests, summary.requests_completed, summary.spans) == (4, 4, 89)
    assert len(summary.processes) == 3 and all(process["clean_end"] for process in summary.processes)
    assert not summary.crashed and summary.problems == []
    # in the engine process, something native replaced the fatal-signal handlers during start-up; taken back
    assert [w["source"] for w in summary.warnings] == ["faulthandler", "faulthandler"]
