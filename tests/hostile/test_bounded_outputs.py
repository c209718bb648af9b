"""What `report` copies from its input into the HTML page and the JSON summary is bounded, and says how
much it left out: spans in flight, their attributes and names, fatal-signal stacks many and wide, and
stages without number (docs/configuration.md, "What a report copies")."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.analysis.synthetic import MiB, Scenario, write_journal
from tests.hostile.cli import changed, tree, vlmtrace
from vlmtrace import semconv as sc

NS = 10**9
T0 = 1_760_000_000 * NS
PAGE_BYTES = 12 * MiB  # plotly's script alone is ~4.7 MB of the page
SUMMARY_BYTES = 4 * MiB


def _write(path: Path, records: list[dict], tail: bytes = b"") -> None:
    with open(path, "wb") as handle:
        handle.writelines(orjson.dumps(record) + b"\n" for record in records)
        handle.write(tail)


def _header(pid: int) -> dict:
    return {"k": "header", "v": 2, "t": T0, "pid": pid, "host": "h", "resource": {"service.name": "lmdeploy"}}


def _report(directory: Path, target: str, record) -> tuple[dict, str]:
    before = tree(directory)
    run = vlmtrace("report", target, "-o", "r.html", "--json", "r.json", cwd=directory, record=record)
    assert run.code == 0, run.output
    assert changed(before, tree(directory)) == {"r.html", "r.json"}
    page, summary = directory / "r.html", directory / "r.json"
    assert page.stat().st_size < PAGE_BYTES and summary.stat().st_size < SUMMARY_BYTES, (
        page.stat().st_size,
        summary.stat().st_size,
    )
    result = orjson.loads(summary.read_bytes()), page.read_text()
    for path in directory.rglob("*"):  # the inputs are tens of megabytes: not kept with pytest's last runs
        if path.is_file():
            path.unlink()
    return result


def test_two_hundred_thousand_spans_in_flight_keep_the_newest_and_list_the_oldest_thousand(
    tmp_path: Path, record_property
):
    starts = [
        {
            "k": "start",
            "t": T0 + (200_000 - i) * 1000,
            "trace_id": "a" * 32,
            "span_id": f"{i:016x}",
            "name": "lmdeploy.request",
            "attrs": {sc.STAGE: "engine.stream", "note": "x" * 50},
        }
        for i in range(200_000)
    ]
    _write(tmp_path / "vlmtrace-h-1-1.jsonl", [_header(1), *starts])
    summary, page = _report(tmp_path, "vlmtrace-h-1-1.jsonl", record_property)
    # the reader keeps the newest 20,000 starts waiting for their end and counts the rest let go; the
    # summary lists the oldest 1000 of those kept and counts the others
    assert summary["spans"] == 20_000 and len(summary["in_flight"]) == 1000 and summary["in_flight_left_out"] == 19_000
    assert summary["in_flight"][0]["span_id"] == f"{199_999:016x}"  # the oldest first
    assert "180,000 start records let go" in " ".join(str(p) for p in summary["problems"]) + page


def test_attributes_many_long_and_nested_are_cut_and_counted(tmp_path: Path, record_property):
    attributes = {f"key.{i}": i for i in range(50_000)}
    attributes.update(
        {"a.long": "v" * (5 * MiB), "a.list": list(range(200_000)), "a.map": {f"k{i}": "x" * 50 for i in range(20_000)}}
    )
    wide = {
        "a.long": "v" * (5 * MiB),
        "a.list": list(range(200_000)),
        "a.map": {f"k{i}": "x" * 50 for i in range(20_000)},
        sc.STAGE: "s" * MiB,
    }
    records = [
        _header(2),
        {"k": "start", "t": T0 + 1, "trace_id": "b" * 32, "span_id": "1" * 16, "name": "n" * (2 * MiB), "attrs": wide},
        {
            "k": "start",
            "t": T0 + 2,
            "trace_id": "b" * 32,
            "span_id": "2" * 16,
            "parent_id": "1" * 16,
            "name": "child",
            "attrs": attributes,
            "links": [{"trace_id": "c" * 32, "span_id": f"{i:016x}"} for i in range(5000)],
        },
    ]
    _write(tmp_path / "vlmtrace-h-2-1.jsonl", records)
    summary, page = _report(tmp_path, "vlmtrace-h-2-1.jsonl", record_property)
    first, second = summary["in_flight"]
    assert len(first["name"]) < 1100  # cut where it is read, or where it is copied
    assert first["attributes_cut"] == 4 and first["attributes"]["a.list"].startswith("[0,1,2")
    assert len(second["attributes"]) == 64 and second["attributes_cut"] == len(attributes) - 64
    (chain,) = summary["crash"][0]["chains"]
    assert [len(span["name"]) < 1100 for span in chain] == [True, True]
    assert "attributes left out or cut" in page and "n" * 2000 not in page
    assert len(summary["crash"][0]["linked_requests"]["2" * 16]) == 21  # 20 names and how many more


def test_a_header_with_versions_without_number_lists_some_of_them_cut(tmp_path: Path, record_property):
    header = {
        **_header(4),
        "versions": {f"package-{i}": "1." + "0" * 100 for i in range(100_000)} | {"vlmtrace": "v" * MiB},
    }
    _write(
        tmp_path / "vlmtrace-h-4-1.jsonl",
        [header, {"k": "sample", "t": T0 + 1, "attrs": {sc.MEM_TORCH_ALLOCATED: MiB}}],
    )
    summary, _ = _report(tmp_path, "vlmtrace-h-4-1.jsonl", record_property)
    (process,) = summary["processes"]
    assert 0 < len(process["versions"]) <= 64 and all(len(value) < 1100 for value in process["versions"].values())


def test_twenty_crashes_with_stacks_two_thousand_lines_deep_and_a_thousand_wide(tmp_path: Path, record_property):
    journal = tmp_path / "journal"
    journal.mkdir()
    for pid in range(100, 120):
        frames = b"".join(b'  File "/' + b"w" * 1000 + b'.py", line %d in f\n' % line for line in range(2000))
        text = (
            b"Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f3a9c1f4740 (most recent call first):\n"
            + frames
        )
        _write(
            journal / f"vlmtrace-h-{pid}-1.jsonl",
            [_header(pid), {"k": "sample", "t": T0 + 1, "attrs": {sc.MEM_TORCH_ALLOCATED: MiB}}],
            tail=text,
        )
    summary, page = _report(tmp_path, "journal", record_property)
    assert len(summary["crash"]) == 20
    for crash in summary["crash"]:
        (fatal,) = crash["fatal"]
        assert crash["fatal_left_out"] == 0 and fatal["lines_left_out"] > 1700  # of what the reader kept of 2,001 lines
        (thread,) = fatal["threads"]
        assert len(thread["frames"]) == 199 and all(len(frame) < 560 for frame in thread["frames"])
    assert page.count("more lines of this report") == 20


def test_every_span_its_own_stage_lists_the_hundred_that_retained_most(tmp_path: Path, record_property):
    write_journal(
        Scenario(requests=240, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM}),
        tmp_path / "run.jsonl",
    )
    records = [orjson.loads(line) for line in (tmp_path / "run.jsonl").read_bytes().splitlines()]
    for record in records:
        if record.get("attrs", {}).get(sc.STAGE) == sc.STAGE_ENGINE_STREAM:  # where the memory is kept
            record["attrs"][sc.STAGE] += f"-{record['span_id']}"
    _write(tmp_path / "run.jsonl", records)
    summary, _ = _report(tmp_path, "run.jsonl", record_property)
    per_component: dict[str, int] = {}
    for row in summary["stages"]:
        per_component[row["component"]] = per_component.get(row["component"], 0) + 1
    assert per_component and max(per_component.values()) <= 100, per_component
    assert summary["stages_left_out"] > 0


def test_top_shows_a_few_stages_and_short_names_of_thousands_in_flight(tmp_path: Path, record_property):
    """Every span in flight its own stage, each name 5,000 characters: the frame stays a screenful."""
    journal = tmp_path / "journal"
    journal.mkdir()
    starts = [
        {
            "k": "start",
            "t": T0 + i,
            "trace_id": "d" * 32,
            "span_id": f"{i:016x}",
            "name": f"{i}" + "n" * 5000,
            "attrs": {sc.STAGE: f"stage-{i}-" + "s" * 5000},
        }
        for i in range(3000)
    ]
    samples = [{"k": "sample", "t": T0 + i * NS, "attrs": {sc.MEM_TORCH_ALLOCATED: MiB}} for i in range(5)]
    _write(journal / "vlmtrace-h-3-1.jsonl", [_header(3), *starts, *samples])
    before = tree(tmp_path)
    run = vlmtrace("top", "journal", "--once", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    assert changed(before, tree(tmp_path)) == set()
    assert "more stages" in run.stdout and len(run.stdout) < 64 * 1024, len(run.stdout)
    assert max(len(line) for line in run.stdout.splitlines()) < 8 * 1024


def test_a_directory_of_files_left_out_on_purpose_is_twenty_notes_and_a_count(tmp_path: Path, record_property):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    write_journal(Scenario(requests=10), inputs / "run.jsonl")
    for index in range(60):
        (inputs / f"metrics-{index}.json").write_bytes(b'{"resourceMetrics": []}')
    run = vlmtrace("report", "inputs", "-o", "r.html", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    assert run.stderr.count("note: ") == 20 and "… and 40 more notes" in run.stderr, run.stderr
