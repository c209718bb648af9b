"""`vlmtrace report` on values nested as deep as a JSON parser accepts (orjson: 1024 levels): every
value the report keeps is cut at the documented depth (8 levels) and the cut counted, and the
good records around it are read, in every format that carries such a value."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.analysis.synthetic import write_journal
from tests.hostile.cli import changed, tree, vlmtrace
from tests.hostile.test_reading import HEADER, LEAK, T0, _lines, _samples
from vlmtrace import semconv as sc

CUT = "nested deeper than 8 levels"


def nested(levels: int, leaf: str = "x") -> bytes:
    """JSON text of lists nested `levels` deep around `leaf`."""
    return b"[" * levels + orjson.dumps(leaf) + b"]" * levels


def nested_object(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


def _good_journal(directory: Path, compress: bool = False) -> tuple[Path, list[bytes]]:
    path = directory / ("run.jsonl.gz" if compress else "run.jsonl")
    write_journal(LEAK, directory / "run.jsonl")
    return path, (directory / "run.jsonl").read_bytes().splitlines(keepends=True)


def _write(path: Path, lines: list[bytes]) -> None:
    content = b"".join(lines)
    path.write_bytes(gzip.compress(content, compresslevel=1) if path.suffix == ".gz" else content)


def _with_header_field(key: str, value: bytes) -> Callable[[list[bytes]], list[bytes]]:
    def change(lines: list[bytes]) -> list[bytes]:
        header = orjson.loads(lines[0])
        header.pop(key, None)
        return [orjson.dumps(header)[:-1] + b',"' + key.encode() + b'":' + value + b"}\n", *lines[1:]]

    return change


def _inserted(record: bytes) -> Callable[[list[bytes]], list[bytes]]:
    return lambda lines: [lines[0], record + b"\n", *lines[1:]]


def _in_flight(levels: int) -> bytes:
    return (
        b'{"k":"start","t":%d,"trace_id":"%s","span_id":"%s","name":"deep","attrs":{"a":' % (T0, b"c" * 32, b"d" * 16)
        + nested(levels)
        + b'},"links":['
        + nested_object(levels - 2)
        + b"]}"
    )


def _heap_sample(levels: int) -> bytes:
    return (
        b'{"k":"sample","t":%d,"attrs":{"%s":{"site":' % (T0 + 1, sc.MEM_HOST_HEAP_SURVIVORS.encode())
        + nested(levels)
        + b"}}}"
    )


# name: (how the good journal's lines are changed, whether the cut is a problem the report names)
JOURNAL_CASES: dict[str, tuple[Callable[[list[bytes]], list[bytes]], bool]] = {
    "header resource 1000 deep": (
        _with_header_field("resource", b'{"service.name":"lmdeploy","x":' + nested(1000) + b"}"),
        True,
    ),
    "header argv 1000 deep": (_with_header_field("argv", nested(1000)), True),
    "header versions 300 deep": (_with_header_field("versions", b'{"torch":' + nested_object(300) + b"}"), True),
    "header argv 9 deep, one level past the bound": (_with_header_field("argv", nested(9)), True),
    "header argv 8 deep, at the bound": (_with_header_field("argv", nested(8)), False),
    "warning message 1000 deep": (
        _inserted(b'{"k":"warning","t":%d,"source":"probe","message":' % T0 + nested(1000) + b"}"),
        False,
    ),
    "warning source 1000 deep": (
        _inserted(b'{"k":"warning","t":%d,"message":"m","source":' % T0 + nested_object(1000) + b"}"),
        False,
    ),
    "record kind 1000 deep": (_inserted(b'{"k":' + nested(1000) + b"}"), False),
    "heap reading 1000 deep": (_inserted(_heap_sample(1000)), True),
}


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("case", sorted(JOURNAL_CASES))
def test_a_deep_value_in_a_journal_is_cut_and_its_records_are_read(
    tmp_path: Path, case: str, compress: bool, record_property
):
    change, named = JOURNAL_CASES[case]
    path, lines = _good_journal(tmp_path, compress)
    _write(path, change(lines))
    if compress:
        (tmp_path / "run.jsonl").unlink()
    before = tree(tmp_path)
    run = vlmtrace("report", path.name, "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    summary = orjson.loads((tmp_path / "s.json").read_bytes())
    assert summary["leak_found"] and summary["requests_completed"] == LEAK.requests, run.output
    assert (CUT in run.output) == named and run.code == (2 if named else 0), run.output
    assert changed(before, tree(tmp_path)) == {"r.html", "s.json"}


@pytest.mark.parametrize("levels", [300, 600, 1000])
def test_an_in_flight_span_nested_deep_is_listed_with_its_attributes_cut(tmp_path: Path, levels: int, record_property):
    (tmp_path / "crash.jsonl").write_bytes(_lines(HEADER, *_samples(30)) + _in_flight(levels) + b"\n")
    run = vlmtrace("report", "crash.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 2 and CUT in run.output, run.output
    text = (tmp_path / "s.json").read_text()
    assert [span["name"] for span in orjson.loads(text)["in_flight"]] == ["deep"]
    assert "(nested deeper than 8 levels: cut)" in text and text.count("[") < 200


def _otlp_resource(value: bytes) -> bytes:
    """An OTLP export of 20 spans whose resource has an attribute of this AnyValue's JSON text."""
    spans = [
        {
            "traceId": f"{i:032x}",
            "spanId": f"{i + 1:016x}",
            "name": "request",
            "startTimeUnixNano": str(T0 + i),
            "endTimeUnixNano": str(T0 + i + 5),
        }
        for i in range(20)
    ]
    return (
        b'{"resourceSpans":[{"resource":{"attributes":[{"key":"deep","value":'
        + value
        + b'}]},"scopeSpans":[{"spans":'
        + orjson.dumps(spans)
        + b"}]}]}"
    )


def _kvlist(levels: int) -> bytes:
    return b'{"kvlistValue":{"values":[{"key":"k","value":' * levels + b'{"stringValue":"leaf"}' + b"}]}}" * levels


def _array(levels: int) -> bytes:
    return b'{"arrayValue":{"values":[' * levels + b'{"intValue":"1"}' + b"]}}" * levels


def _jaeger(tag_value: bytes, errors: bytes = b"null") -> bytes:
    spans = b",".join(
        b'{"traceID":"a","spanID":"%x","processID":"p1","operationName":"request","startTime":%d,"duration":5}'
        % (i + 1, T0 // 1000 + i)
        for i in range(20)
    )
    return (
        b'{"data":[{"traceID":"a","processes":{"p1":{"serviceName":"s","tags":[{"key":"deep","type":"string","value":'
        + tag_value
        + b'}]}},"spans":['
        + spans
        + b']}],"errors":'
        + errors
        + b"}"
    )


DOCUMENTS = {
    "OTLP resource kvlist 250 deep": (_otlp_resource(_kvlist(250)), 2, CUT),
    "OTLP resource array 330 deep": (_otlp_resource(_array(330)), 2, CUT),
    "Jaeger process tag 1000 deep": (_jaeger(nested(1000)), 2, CUT),
    "Jaeger errors 1000 deep": (_jaeger(b'"v"', nested(1000)), 2, "Jaeger reported errors"),
    "server error 1000 deep": (b'{"error":' + nested(1000) + b"}", 2, "the server answered with an error"),
    "summary schema 1000 deep": (b'{"schema":' + nested(1000) + b"}", 2, "top-level keys: 'schema'"),
}


@pytest.mark.parametrize("case", sorted(DOCUMENTS))
def test_a_deep_value_in_an_export_is_cut_or_named(tmp_path: Path, case: str, record_property):
    content, code, message = DOCUMENTS[case]
    (tmp_path / "t.json").write_bytes(content)
    before = tree(tmp_path)
    run = vlmtrace("report", "t.json", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == code and message in run.output, run.output
    assert changed(before, tree(tmp_path)) <= {"r.html", "s.json"}
