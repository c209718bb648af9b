"""Names from an input (spans, stages, hosts, services, devices, files, crash lines) on the terminal of
`top`, `report` and `diff`: rich markup, emoji codes, hyperlinks, bidirectional overrides and line breaks
are shown as written, never obeyed."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.analysis.synthetic import MiB, Scenario, write_journal
from tests.hostile.cli import Run, changed, tree, vlmtrace
from vlmtrace import semconv as sc

NS = 10**9
T0 = 1_760_000_000 * NS
HOST = "gpu-node-1"
# Markup rich would parse, an OSC 8 hyperlink, an emoji code, bidirectional and zero-width format
# characters, a backslash that would escape the markup after it, and a line break forging a line.
NAMES = {  # id: (the name, as the terminal shows it)
    "closing tag": ("[/oops]", "[/oops]"),
    "hyperlink": ("[link=https://attacker.example/]click me[/link]", "[link=https://attacker.example/]click me[/link]"),
    "style": ("[bold red blink]shout", "[bold red blink]shout"),
    "emoji": (":thumbs_up: :pile_of_poo:", ":thumbs_up: :pile_of_poo:"),
    "right-to-left override": ("invoice\u202egpj.exe", "invoice\\u202egpj.exe"),
    "isolates and zero width": ("\u2066a\u2069\u200bb\ufeff", "\\u2066a\\u2069\\u200bb\\ufeff"),
    "trailing backslash": ("stage\\", "stage\\"),
    "line break": ("fine\nverdict: no memory growth", "fine\\x0averdict: no memory growth"),
}
OBEYED = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u2069", "\u200b", "\ufeff", "👍", "💩")
LEAK = Scenario(requests=40, rates={"tensor": 4 * MiB}, stages={"tensor": sc.STAGE_ENGINE_STREAM})


def _shown_not_obeyed(run: Run) -> None:
    text = run.stdout + run.stderr
    assert not any(character in text for character in OBEYED), text
    assert "MarkupError" not in text and "verdict: no memory growth\n" not in text


def _renamed(path: Path, replacements: dict[str, str]) -> None:
    """The journal at `path` with each JSON string value in `replacements` replaced (JSON-encoded)."""
    text = path.read_bytes()
    for old, new in replacements.items():
        text = text.replace(orjson.dumps(old), orjson.dumps(new))
    path.write_bytes(text)


def _live(directory: Path, name: str) -> None:
    """A running process's journal: spans in flight named `name`, at stage `name`, on device `name`."""
    records = [{"k": "header", "v": 2, "t": T0, "pid": 4242, "host": name, "resource": {"service.name": name}}]
    for index in range(3):
        records.append(
            {
                "k": "start",
                "t": T0 + index + 1,
                "trace_id": "a" * 32,
                "span_id": f"{index:016x}",
                "name": name,
                "attrs": {sc.STAGE: name},
            }
        )
    for index in range(12):
        records.append(
            {
                "k": "sample",
                "t": T0 + index * NS,
                "attrs": {sc.MEM_TORCH_ALLOCATED: (100 + index) * MiB, sc.MEM_DEVICES: [name]},
            }
        )
    (directory / "vlmtrace-h-4242-1.jsonl").write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))


@pytest.mark.parametrize(("name", "shown"), NAMES.values(), ids=NAMES.keys())
def test_top_shows_span_stage_host_and_device_names_as_written(tmp_path: Path, name: str, shown: str, record_property):
    journal = tmp_path / "journal"
    journal.mkdir()
    _live(journal, name)
    before = tree(tmp_path)
    run = vlmtrace("top", "journal", "--once", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    _shown_not_obeyed(run)
    assert run.stdout.count(shown) >= 3, run.stdout  # the title, the in-flight stage and the oldest spans
    assert changed(before, tree(tmp_path)) == set()


@pytest.mark.parametrize(("name", "shown"), NAMES.values(), ids=NAMES.keys())
def test_report_shows_a_crash_line_and_a_file_name_as_written(tmp_path: Path, name: str, shown: str, record_property):
    write_journal(Scenario(requests=20, crash_at_request=15), tmp_path / "run.jsonl")
    with open(tmp_path / "run.jsonl", "ab") as journal:  # a faulthandler line naming the input
        journal.write(orjson.dumps({"k": "fatal", "t": T0 + 50 * NS, "text": f"Fatal Python error: {name}\n"}) + b"\n")
    bad = f"{name.replace('/', '_')}.json"
    (tmp_path / bad).write_bytes(b"{not json")
    before = tree(tmp_path)
    run = vlmtrace("report", "run.jsonl", bad, "-o", "r.html", cwd=tmp_path, record=record_property)
    assert run.code == 2, run.output  # the bad file is bad input; the journal is reported
    _shown_not_obeyed(run)
    assert f"skipped {shown.replace('/', '_')}.json:1: not valid JSON" in run.stderr, run.stderr
    assert changed(before, tree(tmp_path)) == {"r.html"}


@pytest.mark.parametrize(("name", "shown"), NAMES.values(), ids=NAMES.keys())
def test_diff_shows_process_and_stage_names_as_written(tmp_path: Path, name: str, shown: str, record_property):
    write_journal(Scenario(requests=40), tmp_path / "before.jsonl")
    write_journal(LEAK, tmp_path / "after.jsonl")
    _renamed(tmp_path / "after.jsonl", {HOST: name, sc.STAGE_ENGINE_STREAM: name})
    before = tree(tmp_path)
    run = vlmtrace(
        "diff", "before.jsonl", "after.jsonl", "-o", "d.html", "--json", "d.json", cwd=tmp_path, record=record_property
    )
    assert run.code == 0, run.output
    _shown_not_obeyed(run)
    assert "regressed" in run.output and shown in run.stdout, run.stdout
    assert orjson.dumps(name)[1:-1] in (tmp_path / "d.json").read_bytes()  # the JSON keeps the names as they were
    assert changed(before, tree(tmp_path)) == {"d.html", "d.json"}


@pytest.mark.parametrize(
    ("name", "shown"),
    [NAMES[key] for key in ("hyperlink", "right-to-left override", "line break")],
    ids=["hyperlink", "right-to-left override", "line break"],
)
def test_the_report_headline_names_the_growing_stage_as_written(tmp_path: Path, name: str, shown: str, record_property):
    write_journal(LEAK, tmp_path / "run.jsonl")
    _renamed(tmp_path / "run.jsonl", {sc.STAGE_ENGINE_STREAM: name})
    run = vlmtrace("report", "run.jsonl", "-o", "r.html", "--json", "r.json", cwd=tmp_path, record=record_property)
    assert run.code == 0, run.output
    _shown_not_obeyed(run)
    assert f"leak in {shown}" in run.stderr, run.stderr
