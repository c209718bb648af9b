"""The HTML report is one self-contained file, and strings from a trace cannot become markup."""

from __future__ import annotations

import re

import pytest
from synthetic import HOSTILE, MiB, Scenario

from conftest import analyse
from vlmtrace import semconv as sc
from vlmtrace.report.html import render_report


@pytest.fixture
def hostile_report(journal) -> str:
    scenario = Scenario(
        requests=60,
        crash_at_request=50,
        hostile=True,
        host=HOSTILE,
        rates={"cache": 8 * MiB},
        stages={"cache": sc.STAGE_VISION_FORWARD},
    )
    path, _ = journal(scenario)
    return render_report(analyse(path))


def test_hostile_strings_are_escaped(hostile_report: str):
    assert "window.__pwned" in hostile_report  # the strings are shown ...
    assert "<script>window.__pwned" not in hostile_report  # ... as text, never as markup
    assert '<img src=x onerror="window.__pwned' not in hostile_report
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in hostile_report


def test_only_the_reports_own_scripts_exist(hostile_report: str):
    nonce = re.search(r"script-src 'nonce-([^']+)'", hostile_report).group(1)
    tags = re.findall(r"<script\b[^>]*>", hostile_report)
    assert tags, "the report has scripts"
    for tag in tags:
        assert f'nonce="{nonce}"' in tag or 'type="application/json"' in tag


def test_nothing_is_loaded_from_elsewhere(hostile_report: str):
    markup = re.sub(r"<script nonce[^>]*>.*?</script>", "", hostile_report, flags=re.S)  # plotly.js's own text aside
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", markup)
    assert "default-src 'none'" in hostile_report
    assert "plotly.js v" in hostile_report  # inlined, not fetched


def test_the_verdict_then_where_the_process_stopped_and_what_to_do_lead_the_report(hostile_report: str):
    body = hostile_report[hostile_report.index("<main>") :]
    order = [
        'id="verdict"',
        'id="crash"',
        'id="recommendations"',
        'id="components"',
        'id="growth-section"',
        'id="timeline-section"',
    ]
    assert [body.index(section) for section in order] == sorted(body.index(section) for section in order)


@pytest.mark.parametrize(
    "name", ["kiali__tracingtest__responseTrace.json.gz", "silmont2000-assignment2-systems__mem_snapshot.pickle.gz"]
)
def test_report_of_traces_without_vlmtrace_readings(name: str):
    from conftest import DATA

    page = render_report(analyse(DATA / name))
    assert "No requests to judge growth by" in page


def test_header_span_count_agrees_with_the_inputs_table(journal):
    path, _ = journal(Scenario(requests=40, batch=4, crash_at_request=30))
    analysis = analyse(path)
    page = render_report(analysis)
    facts = {
        label: int(value.replace(",", ""))
        for value, label in re.findall(r"<span><b>([\d,]+)</b>(spans ended|spans? in flight)</span>", page)
    }
    table = sum(
        int(count.replace(",", ""))
        for count in re.findall(r'<td class="num">([\d,]+)</td><td class="num">[\d,]+</td></tr>', page)
    )
    assert facts["spans ended"] == table == analysis.summary.spans_ended
    assert facts["spans in flight"] == len(analysis.summary.in_flight) > 1


def test_each_component_says_in_one_sentence_what_decided_its_verdict_and_what_came_second(journal):
    path, _ = journal(
        Scenario(requests=160, batch=4, rates={"cache": 2 * MiB}, stages={"cache": sc.STAGE_VISION_FORWARD})
    )
    analysis = analyse(path)
    sentences = re.findall(r'<tr class="decision"><td colspan="\d">(.*?)</td></tr>', render_report(analysis))
    assert len(sentences) == len(analysis.summary.verdicts)
    ((cache, verdict),) = [(s, v) for s, v in zip(sentences, analysis.summary.verdicts) if v.component == "cache"]
    assert cache.startswith("Decided by: it rose by more than its noise and kept rising at about the same rate")
    assert "; next best explanation: " in cache and "; rate: " in cache
    assert not re.search(r"\b[A-Z]+(_[A-Z]+)+\b", " ".join(sentences)), "rules.py's names belong in the JSON only"
    assert "MIN_GROWTH_BYTES" in verdict.evidence["decision"]["class"]  # the JSON summary keeps the names


def test_the_timeline_names_its_process_by_pid_and_host(journal):
    path, _ = journal(Scenario(requests=40, batch=4))
    analysis = analyse(path)
    info = analysis.data.processes[0]
    title = re.search(
        r"Memory over time, with the stages that ran <span class=\"muted\">— (.*?)</span>", render_report(analysis)
    )
    assert title.group(1) == f"process {info.pid} on host {info.host}"


def test_a_process_is_named_by_pid_and_host_where_the_trace_has_them():
    from vlmtrace.analysis import ProcessInfo
    from vlmtrace.report.figures import process_in_words

    assert process_in_words(ProcessInfo(label="vm:804", host="vm", pid=804)) == "process 804 on host vm"
    assert process_in_words(ProcessInfo(label="804", pid=804)) == "process 804"
    assert process_in_words(ProcessInfo(label="vl-serving")) == "vl-serving"  # a trace without a pid: its label
