"""dashboards/vlmtrace-lmdeploy.json: importable as it is, and every metric, label and span attribute it
queries is one vlmtrace really emits.

What vlmtrace emits is collected here, not listed: LMDeploy's real pipeline runs instrumented on the CPU
(two stand-in GPUs behind NVML and torch's allocator counters) into an in-memory metric reader and span
exporter. Metric names are then translated as OTLP metrics become Prometheus series by default
(Prometheus' OTLP receiver, the collector's Prometheus exporters): dots to underscores, the unit as a
suffix (`By` -> `_bytes`, `s` -> `_seconds`), `_total` on counters, `_bucket`/`_sum`/`_count` on
histograms; `service.name` becomes `job` and `service.instance.id` `instance`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from lmdeploy import GenerationConfig
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Histogram, InMemoryMetricReader, Sum
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import vlmtrace
from tests.instrumentation.conftest import cpu_pipeline, image, standin_engines  # noqa: F401 - fixtures
from tests.support import fake_gpu
from vlmtrace import semconv as sc

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "vlmtrace-lmdeploy.json"
UNIT_SUFFIXES = {"By": "_bytes", "s": "_seconds"}
PROMETHEUS_LABELS = {"job", "instance", "le"}
BUILTIN_VARIABLES = {"__rate_interval", "__interval"}


def _panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _targets(dashboard: dict, kind: str) -> list[dict]:
    return [t for p in _panels(dashboard) for t in p.get("targets", []) if t["datasource"]["type"] == kind]


def promql_metrics_and_labels(expr: str) -> tuple[set[str], set[str]]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    metrics = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", without_strings))
    metrics |= set(re.findall(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", without_strings))
    labels = set()
    for matchers in re.findall(r"\{([^}]*)\}", without_strings):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", without_strings):
        labels |= {label.strip() for label in grouping.split(",") if label.strip()}
    return metrics, labels


def traceql_attributes(query: str) -> tuple[set[str], set[str]]:
    return set(re.findall(r"\bspan\.([a-zA-Z0-9_.]+)", query)), set(re.findall(r"\bresource\.([a-zA-Z0-9_.]+)", query))


def prometheus_names(metric) -> set[str]:
    base = metric.name.replace(".", "_") + UNIT_SUFFIXES.get(metric.unit, "")
    if isinstance(metric.data, Histogram):
        return {base + suffix for suffix in ("_bucket", "_sum", "_count")}
    if isinstance(metric.data, Sum) and metric.data.is_monotonic:
        return {base + "_total"}
    return {base}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def emitted(cpu_pipeline):  # noqa: F811 - the fixture
    """(Prometheus metric names, Prometheus labels, span attribute keys, resource keys, stages) of a real run."""
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    with fake_gpu.two_gpus():
        vlmtrace.instrument(
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(metric_readers=[reader]),
            journal=None,
            sample_interval_ms=0,
        )
        try:
            cpu_pipeline(
                [("describe this image", image(96, 64)), ("and these", [image(32, 32, 1), image(40, 48, 2)])],
                gen_config=GenerationConfig(max_new_tokens=6, top_k=1),
            )
            vlmtrace.flush()
            data = reader.get_metrics_data()
        finally:
            vlmtrace.uninstrument()
    names: set[str] = set()
    labels: set[str] = set(PROMETHEUS_LABELS)
    units = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                names |= prometheus_names(metric)
                units[metric.name] = metric.unit
                for point in metric.data.data_points:
                    labels |= {key.replace(".", "_") for key in point.attributes}
    finished = spans.get_finished_spans()
    attributes = {key for span in finished for key in span.attributes}
    resource = {key for span in finished for key in span.resource.attributes}
    stages = {span.attributes[sc.STAGE] for span in finished}
    return {
        "metrics": names,
        "labels": labels,
        "units": units,
        "span_attributes": attributes,
        "resource": resource | {"service.name"},
        "stages": stages,
    }


def test_it_imports_with_templated_datasources(dashboard):
    inputs = {i["name"]: i["pluginId"] for i in dashboard["__inputs"]}
    assert inputs == {"DS_PROMETHEUS": "prometheus", "DS_TEMPO": "tempo"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["tempo"]["type"] == "datasource" and variables["tempo"]["query"] == "tempo"
    assert variables["datasource"]["current"]["value"] == "${DS_PROMETHEUS}"
    assert variables["tempo"]["current"]["value"] == "${DS_TEMPO}"
    assert {r["id"] for r in dashboard["__requires"] if r["type"] == "panel"} == {p["type"] for p in _panels(dashboard)}
    text = DASHBOARD.read_text()
    assert set(re.findall(r'"uid": "([^"]*)"', text)) == {"${datasource}", "${tempo}", dashboard["uid"]}


def test_panels_are_laid_out_and_bound_to_their_datasource(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    expected = {"timeseries": "prometheus", "stat": "prometheus", "table": "tempo"}
    occupied = set()
    for panel in _panels(dashboard):
        kind = expected[panel["type"]]
        assert panel["datasource"] == {"type": kind, "uid": "${datasource}" if kind == "prometheus" else "${tempo}"}
        assert panel["targets"] and panel["title"] and panel["description"]
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        cells = {(grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])}
        assert not cells & occupied, panel["title"]
        occupied |= cells


def test_the_issue_s_panels_are_there(dashboard):
    titles = " | ".join(p["title"] for p in _panels(dashboard))
    for expected in (
        "by component",
        "growth per request",
        "Time to first token",
        "Time per output token",
        "largest",
        "grew torch allocated",
        "grew native",
    ):
        assert expected.lower() in titles.lower() + " | " + " | ".join(
            r["title"].lower() for r in dashboard["panels"] if r["type"] == "row"
        ), expected


def test_every_variable_used_is_defined(dashboard):
    defined = {v["name"] for v in dashboard["templating"]["list"]} | BUILTIN_VARIABLES
    used = set(re.findall(r"\$\{?(\w+)", json.dumps([dashboard["panels"], dashboard["templating"]])))
    assert used - {"DS_PROMETHEUS", "DS_TEMPO"} <= defined


def test_every_promql_metric_and_label_is_emitted(dashboard, emitted):
    queries = [t["expr"] for t in _targets(dashboard, "prometheus")]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(queries) > 20
    used_metrics, used_labels = set(), set()
    for query in queries:
        metrics, labels = promql_metrics_and_labels(query)
        assert metrics, query
        used_metrics |= metrics
        used_labels |= labels
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            used_labels.add(re.search(r",\s*(\w+)\)\s*$", variable["definition"]).group(1))
    for target in _targets(dashboard, "prometheus"):
        used_labels |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
    assert used_metrics - emitted["metrics"] == set()
    assert used_labels - emitted["labels"] == set()
    # every instrument vlmtrace has is on the dashboard somewhere
    assert {
        name.rsplit("_", 1)[0] if name.endswith(("_bucket", "_sum", "_count")) else name for name in emitted["metrics"]
    } <= {m.rsplit("_", 1)[0] if m.endswith(("_bucket", "_sum", "_count")) else m for m in used_metrics}
    assert emitted["units"][sc.METRIC_GPU_MEMORY_USAGE] == "By" and emitted["units"][sc.METRIC_REQUEST_DURATION] == "s"


def test_every_traceql_attribute_is_emitted(dashboard, emitted):
    queries = [t["query"] for t in _targets(dashboard, "tempo")]
    assert len(queries) >= 4
    for query in queries:
        span_keys, resource_keys = traceql_attributes(query)
        assert span_keys - emitted["span_attributes"] == set(), query
        assert resource_keys - emitted["resource"] == set(), query
        for stage in re.findall(r'span\.vlmtrace\.stage\s*=\s*"([^"]+)"', query):
            assert stage in emitted["stages"]
