"""LMDeploy's real api_server under `vlmtrace run`, driven by benchmarks/gpu_api_server.py exactly as on the GPU.

The engines are CPU stand-ins (tests/support/cpu_api_server.py); the server, its FastAPI app, the PyTorch
engine's spawned process and LMDeploy's RPC to it are the real ones.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the api_server needs fastapi and uvicorn (scripts/setup installs them)")
pytest.importorskip("uvicorn")

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve(tmp_path: Path, backend: str, requests: int) -> tuple[dict, subprocess.CompletedProcess]:
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "VLMTRACE_JOURNAL"):
        env.pop(name, None)
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_api_server.py"),
            str(out),
            "--backend",
            backend,
            "--model",
            str(REPO / "tests" / "data" / "tiny-qwen2vl"),
            "--port",
            str(_free_port()),
            "--requests",
            str(requests),
            "--startup-timeout",
            "240",
            "--launcher",
            "tests.support.cpu_api_server",
            "--",
            "--max-batch-size",
            "4",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary_path = out / "summary.json"
    log = out / "server.log"
    done.stdout += "\n--- server.log ---\n" + (log.read_text(errors="replace")[-4000:] if log.exists() else "(none)")
    assert summary_path.exists(), done.stdout[-6000:] + done.stderr[-3000:]
    return json.loads(summary_path.read_text()), done


@pytest.mark.lmdeploy
def test_pytorch_engine_process_joins_the_http_requests_trace(tmp_path):
    summary, done = _serve(tmp_path, "pytorch", requests=3)
    assert done.returncode == 0 and summary["ok"], done.stdout[-8000:]
    roles = {p["role"] for p in summary["processes"]}
    assert {"server", "engine"} <= roles
    engine = next(p for p in summary["processes"] if p["role"] == "engine")
    server = next(p for p in summary["processes"] if p["role"] == "server")
    assert engine["ppid"] == server["pid"] and engine["clean"] and server["clean"]
    sent = {r["trace_id"] for r in summary["requests"]}
    assert set(server["trace_ids"]) == sent == set(engine["trace_ids"])
    for request in summary["requests"]:
        assert request["engine_pids"] == [engine["pid"]]
        assert request["engine_steps_linked"] >= 2  # its prefill step and the run(s) of its decode steps
    assert {r["stream"] for r in summary["requests"]} == {True, False}
    metrics = summary["otlp"]["metrics_by_pid"]
    assert "gen_ai.server.time_to_first_token" in metrics[str(server["pid"])]
    assert "process.memory.usage" in metrics[str(engine["pid"])]
    assert set(summary["otlp"]["span_pids"]) == {str(server["pid"]), str(engine["pid"])}
    # Each request span carries the reading at its last output (the PyTorch engine opens no stream span
    # in the request's process): its work after the response gets a stage of its own in the analysis.
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_api_server import read_journals

    from vlmtrace import semconv as sc

    ends = [
        span
        for process in read_journals(tmp_path / "out" / "journal")
        for span in process["spans"].values()
        if span["ended"] and span["attrs"].get(sc.STAGE) == sc.STAGE_REQUEST
    ]
    assert len(ends) == 3
    for record in ends:
        response_end = record["attrs"][sc.RESPONSE_END_KEYS[sc.MEM_READ_TIME]]
        assert record["start"] < response_end <= record["t"]
        assert record["attrs"][sc.RESPONSE_END_KEYS[sc.MEM_HOST_RSS]] > 0


@pytest.mark.lmdeploy
def test_turbomind_in_process_traces_each_http_request(tmp_path):
    summary, done = _serve(tmp_path, "turbomind", requests=2)
    assert done.returncode == 0 and summary["ok"], done.stdout[-8000:]
    assert [p["role"] for p in summary["processes"]] == ["server"]
    assert all(r["engine_stream_spans"] == 1 for r in summary["requests"])
