"""The JSON summary's keys are a contract other tools read."""

from __future__ import annotations

import orjson
from synthetic import MiB, Scenario

from conftest import analyse
from vlmtrace import semconv as sc
from vlmtrace.analysis.summary import CLASSES


def test_summary_has_the_contracted_keys(journal):
    path, truth = journal(
        Scenario(requests=40, crash_at_request=35, rates={"cache": 8 * MiB}, stages={"cache": sc.STAGE_VISION_FORWARD})
    )
    summary = orjson.loads(analyse(path).summary.to_json())
    assert summary["spans"] == truth.spans + len(truth.in_flight)
    assert summary["requests"] == truth.requests
    assert summary["crashed"] is True
    for span in summary["in_flight"]:
        assert {"name", "trace_id", "span_id", "attributes"} <= set(span)
    assert len(summary["verdicts"]) == 4
    for verdict in summary["verdicts"]:
        assert {"component", "class", "slope_bytes_per_request", "stage", "evidence"} <= set(verdict)
        assert verdict["class"] in CLASSES
    assert {"devices", "requests_to_oom", "recommendations", "leak_found", "problems"} <= set(summary)
    cache = next(v for v in summary["verdicts"] if v["component"] == "cache")
    assert cache["class"] == "cache_retention" and cache["stage"] == sc.STAGE_VISION_FORWARD


def test_summary_of_foreign_traces_has_no_verdicts():
    from conftest import DATA

    summary = analyse(DATA / "kiali__tracingtest__responseTrace.json.gz").summary.to_dict()
    assert summary["spans"] == 8 and summary["requests"] == 0 and summary["verdicts"] == []
    assert summary["crashed"] is False and summary["leak_found"] is False
