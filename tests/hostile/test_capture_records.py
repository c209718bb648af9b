"""`vlmtrace report` on capture records and torch snapshots built to exhaust or mislead it: sites, stacks
and text are read up to their bounds, records of the wrong shape are named by their line, markup stays
text in the report, and a pickle beside the journal is never loaded with its classes."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import orjson
import pytest

from tests.analysis.synthetic import MiB, Scenario, write_journal
from tests.hostile.cli import changed, tree, vlmtrace
from vlmtrace import semconv as sc
from vlmtrace.analysis.readers.captures import (
    MAX_CAPTURES,
    MAX_SITES,
    STACK_FRAMES,
    TEXT_CHARS,
)

LEAK = Scenario(requests=60, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM})


def _site(index: int = 0, **fields) -> dict:
    return {
        "file": f"/srv/model_{index}.py",
        "line": 10 + index,
        "function": "preprocess",
        "stage": sc.STAGE_ENGINE_STREAM,
        "stack": ["model.py:10 in preprocess"],
        "count": 1,
        "bytes": 4 * MiB * 40 // (index + 1),
        **fields,
    }


def _capture(sites, **fields) -> dict:
    return {
        "k": "capture",
        "t": 1_760_000_100 * 10**9,
        "start": 1_760_000_000 * 10**9,
        "components": ["tensor"],
        "tool": "torch.cuda.memory._record_memory_history",
        "reason": "auto",
        "requests": 40,
        "seconds": 3.0,
        "stopped_by": "requests",
        "rate_at_start": None,
        "snapshot": None,
        "sites": sites,
        "sites_left_out": 0,
        "bytes_left_out": 0,
        **fields,
    }


def _journal_with(d: Path, *captures: dict) -> None:
    write_journal(LEAK, d / "run.jsonl")
    with open(d / "run.jsonl", "ab") as journal:
        journal.writelines(orjson.dumps(capture) + b"\n" for capture in captures)


def _tensor_verdict(d: Path) -> dict:
    (verdict,) = [v for v in orjson.loads((d / "s.json").read_bytes())["verdicts"] if v["component"] == "tensor"]
    return verdict


def test_a_million_sites_are_read_as_the_first_few(tmp_path: Path, record_property):
    small = {"file": "b.py", "line": 1, "bytes": 1}
    _journal_with(tmp_path, _capture([_site(index) for index in range(MAX_SITES)] + [small] * 1_000_000))
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    sites = _tensor_verdict(tmp_path)["allocation_sites"]
    assert len(sites) == MAX_SITES and sites[0]["file"] == "/srv/model_0.py"


def test_thousands_of_capture_records_are_read_up_to_a_bound(tmp_path: Path, record_property):
    _journal_with(tmp_path, *[_capture([_site(index) for index in range(MAX_SITES)])] * 5000)
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    problems = orjson.loads((tmp_path / "s.json").read_bytes())["problems"]
    assert any(f"more than {MAX_CAPTURES} capture records in this file" in problem["reason"] for problem in problems)
    assert len(_tensor_verdict(tmp_path)["allocation_sites"]) == MAX_SITES


def test_long_text_and_deep_stacks_are_cut_and_markup_stays_text(tmp_path: Path, record_property):
    markup = "<img src=x onerror=alert(1)>"
    _journal_with(
        tmp_path, _capture([_site(0, file="/" + "a" * 4 * MiB + ".py", function=markup, stack=[markup] * 100_000)])
    )
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    (site,) = _tensor_verdict(tmp_path)["allocation_sites"]
    assert len(site["file"]) == TEXT_CHARS and len(site["stack"]) == STACK_FRAMES
    html = (tmp_path / "r.html").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and markup not in html


WRONG = {
    "sites as an object": (_capture({"file": "a.py"}), "a capture record without its components, requests or sites"),
    "components as text": (_capture([_site()], components="tensor"), "a capture record without its components"),
    "requests negative": (_capture([_site()], requests=-1), "a capture record without its components, requests"),
    "line as text and bytes as a float": (
        _capture([_site(0, line="10"), _site(1, bytes=1.5), _site(2, file=["a"])]),
        "3 allocation site(s) of a capture record without file, line or bytes",
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_capture_record_of_the_wrong_shape_is_named_by_its_line(tmp_path: Path, case: str, record_property):
    record, message = WRONG[case]
    _journal_with(tmp_path, record)
    before = tree(tmp_path)
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 2, run.output
    assert message in run.output, run.output
    assert _tensor_verdict(tmp_path)["allocation_sites"] == []
    assert changed(before, tree(tmp_path)) == {"r.html", "s.json"}


class _Touch:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_pickle_beside_the_journal_is_never_loaded_with_its_classes(tmp_path: Path, record_property):
    runs = tmp_path / "runs"
    runs.mkdir()
    _journal_with(runs, _capture([_site()], snapshot="capture-7-1.pickle"))
    (runs / "capture-7-1.pickle").write_bytes(pickle.dumps({"segments": [], "x": _Touch()}))
    run = vlmtrace("report", "runs", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
    assert run.code == 2, run.output
    assert "capture-7-1.pickle" in run.output and "refusing to load posix.system" in run.output, run.output
    assert not (tmp_path / "pwned").exists() and not (runs / "pwned").exists()
    assert _tensor_verdict(tmp_path)["allocation_sites"][0]["file"] == "/srv/model_0.py"
