"""`vlmtrace report` on format 3 journals whose compact end records name a start record that is missing,
malformed or of the wrong types, or whose readings, declared keys, attribute names or attribute indices
or links are hostile: the report is written, the ends that cannot be completed and the attributes whose index is
not declared are skipped and counted, and the command never fails with exit code 3."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.analysis.synthetic import MiB, Scenario, write_journal
from tests.hostile.cli import vlmtrace
from vlmtrace import semconv as sc

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from journal_bytes import reencoded  # the writer's own encoder, over a synthetic journal

LEAK = Scenario(requests=60, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM})
Lines = list[bytes]


def _records(lines: Lines) -> list[dict]:
    return [orjson.loads(line) for line in lines]


def _starts_removed(lines: Lines) -> Lines:
    """Every third start record is gone: its end names a start that is not in the journal."""
    starts = [i for i, line in enumerate(lines) if line.startswith(b'{"k":"start"')]
    gone = set(starts[::3])
    return [line for i, line in enumerate(lines) if i not in gone]


def _starts_malformed(lines: Lines) -> Lines:
    """Start records with the right span id and every other field of a wrong type."""
    out = []
    for record in _records(lines):
        written = record
        if record["k"] == "start" and int(record["span_id"], 16) % 2:
            written = {"k": "start", "span_id": record["span_id"], "t": "soon", "name": [1], "attrs": [2], "mem": "x"}
        out.append(orjson.dumps(written) + b"\n")
    return out


def _starts_cut(lines: Lines) -> Lines:
    """Start records cut in the middle of the line (not JSON): their ends have no start to complete them."""
    return [line[: len(line) // 2] + b"\n" if line.startswith(b'{"k":"start"') else line for line in lines]


def _ends_hostile(lines: Lines) -> Lines:
    """Compact ends whose fields are of every wrong type: attributes a list, readings text or arrays of
    text, a span id that is a list, a status that is an object."""
    out = []
    for index, record in enumerate(_records(lines)):
        written = record
        if record["k"] == "end" and "trace_id" not in record:
            written = {
                **record,
                **[
                    {"attrs": [1, 2]},
                    {"mem": "reading", "mem0": ["a", {"b": 1}, None]},
                    {"span_id": [record["span_id"]]},
                    {"status": {"code": 2}, "mem": [2**63 - 1, -(2**63)]},
                ][index % 4],
            }
        out.append(orjson.dumps(written) + b"\n")
    return out


def _keys_hostile(lines: Lines) -> Lines:
    """A header that declares its reading keys as numbers, and another's as a very long list."""
    header = orjson.loads(lines[0])
    first = {**header, "mem_keys": list(range(40))}
    return [orjson.dumps(first) + b"\n", *lines[1:]]


def _attr_keys_hostile(lines: Lines) -> Lines:
    """A header whose attribute names are numbers, objects and a name twice: no index names anything."""
    header = orjson.loads(lines[0])
    hostile = {**header, "attr_keys": [0, {"a": 1}, sc.STAGE, sc.STAGE]}
    return [orjson.dumps(hostile) + b"\n", *lines[1:]]


def _attr_keys_long(lines: Lines) -> Lines:
    """A header whose list of attribute names is longer than any writer declares."""
    header = orjson.loads(lines[0])
    return [orjson.dumps({**header, "attr_keys": [sc.STAGE] * 100_000}) + b"\n", *lines[1:]]


def _indices_hostile(lines: Lines) -> Lines:
    """Attribute keys that look like an index the header does not declare: past its end, with leading
    zeros, huge, negative, or digits of another script."""
    keys = ["999", "00", "9" * 40, "-1", "\u0663"]
    out = []
    for index, record in enumerate(_records(lines)):
        if record["k"] in ("start", "end") and type(record.get("attrs")) is dict:
            record["attrs"] = {keys[index % len(keys)]: "request", **record["attrs"]}
        out.append(orjson.dumps(record) + b"\n")
    return out


def _links_hostile(lines: Lines) -> Lines:
    """Start records whose links name a span by an id no start in the file has, by a number, a list or
    an object of wrong types, and whose ends never come: in flight, their links as they can be read."""
    out = []
    for record in _records(lines):
        if record["k"] == "start":
            record["links"] = ["00000000000000ff", 7, [record["span_id"]], {"span_id": 3}, record["span_id"]]
        if record["k"] != "end" or int(record["span_id"], 16) % 3:
            out.append(orjson.dumps(record) + b"\n")
    return out


CASES: dict[str, Callable[[Lines], Lines]] = {
    "starts removed": _starts_removed,
    "starts malformed": _starts_malformed,
    "starts cut": _starts_cut,
    "ends hostile": _ends_hostile,
    "keys hostile": _keys_hostile,
    "attribute names hostile": _attr_keys_hostile,
    "attribute names too many": _attr_keys_long,
    "attribute indices hostile": _indices_hostile,
    "links hostile": _links_hostile,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compact_ends_without_a_usable_start_are_skipped_never_fatal(tmp_path: Path, case: str, record_property):
    write_journal(LEAK, tmp_path / "v1.jsonl")
    compact = reencoded((tmp_path / "v1.jsonl").read_bytes().splitlines(keepends=True))
    assert orjson.loads(compact[0])["v"] == 3
    assert sum(line.startswith(b'{"k":"end"') and b'"trace_id"' not in line for line in compact) > 100
    (tmp_path / "run.jsonl").write_bytes(b"".join(CASES[case](compact)))
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code in (0, 2), run.output
    assert (tmp_path / "r.html").exists() and (tmp_path / "s.json").exists()
    summary = orjson.loads((tmp_path / "s.json").read_bytes())
    if case == "starts removed":
        assert "an end whose start is not in its journal" in run.output
        assert summary["requests"] > 0  # the ends whose start is there are read
    if case.startswith("attribute"):
        assert "is not in the header's attr_keys" in run.output
    if case == "attribute indices hostile":
        assert summary["requests"] == LEAK.requests  # the declared indices are read
