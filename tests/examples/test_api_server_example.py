"""examples/api_server: the compose setup hangs together, and send_request.py sends what the server expects."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from PIL import Image

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "api_server"


def _yaml(name: str) -> dict:
    return yaml.safe_load((EXAMPLE / name).read_text())


def test_every_mounted_file_exists_and_grafana_gets_the_dashboard():
    compose = _yaml("docker-compose.yaml")
    services = compose["services"]
    assert set(services) == {"otel-collector", "tempo", "jaeger", "prometheus", "grafana"}
    for name, service in services.items():
        assert ":" in service["image"] and not service["image"].endswith(":latest"), name
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            assert (EXAMPLE / host).exists(), (name, host)
        for dependency in service.get("depends_on", []):
            assert dependency in services
    assert {"4317:4317", "4318:4318"} <= set(services["otel-collector"]["ports"])
    assert "--web.enable-otlp-receiver" in services["prometheus"]["command"]
    dashboards = next(v for v in services["grafana"]["volumes"] if v.split(":")[1] == "/var/lib/grafana/dashboards")
    assert (EXAMPLE / dashboards.split(":")[0] / "vlmtrace-lmdeploy.json").is_file()
    provider = _yaml("grafana/provisioning/dashboards/dashboards.yaml")["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_the_collector_sends_traces_to_tempo_and_jaeger_and_metrics_to_prometheus():
    config = _yaml("otel-collector.yaml")
    services = _yaml("docker-compose.yaml")["services"]
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    assert config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    pipelines = config["service"]["pipelines"]
    for pipeline in pipelines.values():
        assert set(pipeline["receivers"]) <= set(config["receivers"])
        assert set(pipeline["processors"]) <= set(config["processors"])
        assert set(pipeline["exporters"]) <= set(config["exporters"])
    hosts = {}
    for name, exporter in config["exporters"].items():
        endpoint = exporter.get("endpoint") or exporter["metrics_endpoint"]
        host = urlparse(endpoint if "://" in endpoint else f"//{endpoint}").hostname
        assert host in services, name
        hosts[name] = host
    assert {hosts[e] for e in pipelines["traces"]["exporters"]} == {"tempo", "jaeger"}
    assert {hosts[e] for e in pipelines["metrics"]["exporters"]} == {"prometheus"}
    assert config["exporters"]["otlphttp/prometheus"]["metrics_endpoint"].endswith("/api/v1/otlp/v1/metrics")
    tempo = _yaml("tempo.yaml")
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    assert _yaml("prometheus.yaml")["otlp"]["translation_strategy"] == "UnderscoreEscapingWithSuffixes"


def test_grafana_datasources_point_at_the_services():
    sources = {s["type"]: s for s in _yaml("grafana/provisioning/datasources/datasources.yaml")["datasources"]}
    assert set(sources) == {"prometheus", "tempo", "jaeger"}
    assert sources["prometheus"]["isDefault"]
    services = _yaml("docker-compose.yaml")["services"]
    assert all(urlparse(s["url"]).hostname in services for s in sources.values())
    assert urlparse(sources["tempo"]["url"]).port == _yaml("tempo.yaml")["server"]["http_listen_port"]


@pytest.mark.parametrize("stream", [False, True])
def test_send_request_sends_an_image_and_a_traceparent(stream, capsys):
    received = {}

    class Server(BaseHTTPRequestHandler):
        def do_GET(self):
            self._answer({"data": [{"id": "tiny"}]})

        def do_POST(self):
            received["traceparent"] = self.headers["traceparent"]
            received["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if received["body"]["stream"]:
                chunk = {"choices": [{"delta": {"content": "a cat"}}]}
                self._answer(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n")
            else:
                self._answer({"choices": [{"message": {"content": "a cat"}}]})

        def _answer(self, payload):
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    spec = importlib.util.spec_from_file_location("send_request_example", EXAMPLE / "send_request.py")
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    try:
        args = ["--base-url", f"http://127.0.0.1:{server.server_address[1]}", "--max-tokens", "8"]
        assert client.main(args + (["--stream"] if stream else [])) == 0
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    version, trace_id, span_id, flags = received["traceparent"].split("-")
    assert (version, flags, len(trace_id), len(span_id)) == ("00", "01", 32, 16)
    assert f"trace id: {trace_id}" in out and "answer: 'a cat'" in out
    body = received["body"]
    assert body["model"] == "tiny" and body["max_tokens"] == 8 and body["stream"] is stream
    content = body["messages"][0]["content"]
    url = next(part["image_url"]["url"] for part in content if part["type"] == "image_url")
    assert url.startswith("data:image/png;base64,")
    assert Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size == (320, 240)
