"""The Jaeger reader on what a real Jaeger answered (tests/jaeger/data/, written by `python -m
tests.jaeger.recorded`), and a check against the live server that the recording is still its answer."""

from __future__ import annotations

import orjson
import pytest

from tests.jaeger.recorded import (
    DATA,
    EXTREMES,
    EXTREMES_IDS,
    LIMITED_ATTRIBUTES,
    LIMITED_IDS,
    record,
    spans,
)
from vlmtrace.analysis.readers.detect import add_payload
from vlmtrace.analysis.readers.jaeger import _ARRAY_KEYS, _parent, _tags
from vlmtrace.analysis.readers.otlp_json import attributes, hex_id
from vlmtrace.analysis.trace_data import TraceData


def _recorded(name: str) -> dict:
    return orjson.loads((DATA / name).read_bytes())


def _v3_spans() -> dict[str, dict]:
    document = _recorded("api-v3-search.json")
    return {
        hex_id(span["spanId"], 8): span
        for resource in document["result"]["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    }


def _v1_spans() -> dict[str, dict]:
    return {span["spanID"]: span for trace in _recorded("api-v1-search.json")["data"] for span in trace["spans"]}


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def test_both_apis_hold_every_span_sent_and_are_read_whole():
    sent = {format(span.context.span_id, "016x") for span in spans()}
    assert _v3_spans().keys() == _v1_spans().keys() == sent
    for name, source_format in (("api-v3-search.json", "Jaeger API v3"), ("api-v1-search.json", "Jaeger API v1")):
        data = _read(name)
        errors = [p for p in data.problems if p.severity == "error"]
        assert (data.spans.count, errors, [i.format for i in data.inputs]) == (len(sent), [], [source_format])


def _read(name: str) -> TraceData:
    data = TraceData()
    add_payload(data, (DATA / name).read_bytes(), name)
    return data


def test_what_the_senders_span_limits_dropped_is_told_from_v3_and_lost_by_v1():
    limited = next(s for s in spans() if format(s.context.span_id, "016x") == LIMITED_IDS[1])
    dropped = limited.dropped_attributes
    assert dropped > 0 and _v3_spans()[LIMITED_IDS[1]]["droppedAttributesCount"] == dropped
    assert len(attributes(_v3_spans()[LIMITED_IDS[1]]["attributes"])) == LIMITED_ATTRIBUTES
    assert [(p.reason, p.severity) for p in _read("api-v3-search.json").problems] == [
        (
            (
                f"1 span(s) arrived with {dropped} attributes dropped by the sender's span limits "
                "(OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT); a dropped attribute may be a memory reading"
            ),
            "note",
        )
    ]
    v1 = _v1_spans()[LIMITED_IDS[1]]
    assert v1["warnings"] is None and not any("dropped" in tag["key"] for tag in v1["tags"])
    assert _read("api-v1-search.json").problems == []


def test_api_v3_keeps_every_attribute_with_its_type():
    extremes = attributes(_v3_spans()[EXTREMES_IDS[1]]["attributes"])
    assert extremes == {key: _plain(value) for key, value in EXTREMES.items()}
    assert extremes["vlmtrace.mem.native"] == 2**63 - 1 and extremes["vlmtrace.mem.host.rss"] == 2**53 + 1


def test_api_v1_gives_large_integers_as_strings_and_arrays_as_json_text():
    raw = {tag["key"]: tag for tag in _v1_spans()[EXTREMES_IDS[1]]["tags"]}
    assert raw["vlmtrace.mem.native"] == {"key": "vlmtrace.mem.native", "type": "int64", "value": "9223372036854775807"}
    assert raw["vlmtrace.mem.gpu.total"]["value"] == 150_754_820_096  # below 2**53: a JSON number
    assert raw["vlmtrace.mem.devices"] == {"key": "vlmtrace.mem.devices", "type": "string", "value": "[0,1]"}
    assert raw["vlmtrace.test.empty"]["value"] == "[]"
    assert (raw["otel.status_code"]["value"], raw["error"]["value"]) == ("ERROR", True)

    tags = _tags(_v1_spans()[EXTREMES_IDS[1]]["tags"])
    for key, value in EXTREMES.items():  # the reader turns back what the analysis reads; other arrays stay text
        expected = (
            _plain(value) if key in _ARRAY_KEYS or not isinstance(value, tuple) else orjson.dumps(list(value)).decode()
        )
        assert tags[key] == expected, key


def test_api_v1_agrees_with_v3_on_every_span_but_array_types():
    v1 = _v1_spans()
    for span_id, span in _v3_spans().items():
        tags = _tags(v1[span_id]["tags"])
        for key, value in attributes(span["attributes"]).items():
            assert tags[key] == (
                orjson.dumps(value).decode() if isinstance(value, list) and key not in _ARRAY_KEYS else value
            ), (span["name"], key)
        assert _parent(v1[span_id]) == hex_id(span.get("parentSpanId"), 8)


def test_an_engine_steps_links_are_follows_from_references_not_parents():
    sent = {format(s.context.span_id, "016x"): s for s in spans()}
    steps = [span_id for span_id, s in sent.items() if s.links]
    assert len(steps) == 3  # two recorded steps and the extremes span
    for span_id in steps:
        (link,) = sent[span_id].links
        target = format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")
        assert [(hex_id(ref["traceId"], 16), hex_id(ref["spanId"], 8)) for ref in _v3_spans()[span_id]["links"]] == [
            target
        ]
        assert _v1_spans()[span_id]["references"] == [
            {"refType": "FOLLOWS_FROM", "traceID": target[0], "spanID": target[1]}
        ]
        assert _parent(_v1_spans()[span_id]) is None


def _canonical(value, key: str = ""):
    """Order-free form of a response: lists sorted, except attribute arrays, whose order is data."""
    if isinstance(value, dict):
        return {k: _canonical(v, k) for k, v in value.items()}
    if isinstance(value, list):
        items = [_canonical(item) for item in value]
        return (
            items
            if key == "values"
            else sorted(items, key=lambda item: orjson.dumps(item, option=orjson.OPT_SORT_KEYS))
        )
    return value


def _v1_canonical(document: dict) -> dict:
    """v1 with each span's processID replaced by its process (the `p1`… names are per response)."""
    for trace in document["data"]:
        processes = trace.pop("processes")
        for span in trace["spans"]:
            span["process"] = processes[span.pop("processID")]
    return _canonical(document)


@pytest.mark.jaeger
def test_the_recording_is_still_what_jaeger_answers(jaeger):
    live = {name: orjson.loads(body) for name, body in record(jaeger).items()}
    assert _canonical(live["api-v3-search.json"]) == _canonical(_recorded("api-v3-search.json"))
    assert _v1_canonical(live["api-v1-search.json"]) == _v1_canonical(_recorded("api-v1-search.json"))
