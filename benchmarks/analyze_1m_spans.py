"""Analyzer benchmark: a journal of 1 000 000 spans → HTML report + JSON summary.

Simulates a service with the synthetic generator (tests/analysis/synthetic.py) and writes its
records through the journal's real writer (export/journal: rotation at its default size, so a directory of
rotated files, as a service leaves them), then runs, each in a fresh process that reports its own
peak RSS (its readers' too):
  1. parse only: every line of every file through orjson.loads in one process, nothing kept;
  2. parse only, one rotated file per process, one process per core;
  3. parse only with DuckDB's NDJSON reader into the analyzer's columns (readers/journal_columns.py),
     one rotated file per process: the floor of the report's reading;
  4. the full `vlmtrace report` command on the directory (HTML + JSON).
Prints wall and CPU times, peak RSS and the ratios. Target: the report in at most 20 s and
1 GB of peak RSS on the 2-core development machine.
The machine's load average is printed with each step: on a shared machine, read the numbers with it.

    PYTHONPATH=src python benchmarks/analyze_1m_spans.py [--spans 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "analysis"))

from synthetic import MiB, Scenario, _Simulation

from vlmtrace import semconv as sc
from vlmtrace.config import Options
from vlmtrace.export.journal import JournalWriter, records

SPANS_PER_REQUEST = 7  # pipeline, chat, vision preprocess, 2 vision infer (one with a forward), engine stream
MEASURE = """
import atexit, resource, sys, time
started = time.perf_counter()
def report():
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    sys.stderr.write(f"MEASURED {time.perf_counter() - started} {me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime} "
                     f"{me.ru_maxrss / 1024} {children.ru_maxrss / 1024}\\n")
atexit.register(report)
"""
PARSE_ONLY = (
    MEASURE
    + """
import glob, os, orjson
loads = orjson.loads
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    with open(path, "rb") as handle:
        for line in handle:
            loads(line)
"""
)
PARSE_PARALLEL = (
    MEASURE
    + """
import glob, os, orjson, concurrent.futures, multiprocessing
def parse(path):
    with open(path, "rb") as handle:
        for line in handle:
            orjson.loads(line)
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl")))
with concurrent.futures.ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("fork")) as pool:
    list(pool.map(parse, files))
"""
)
PARSE_DUCKDB = (
    MEASURE
    + """
import glob, os, concurrent.futures, multiprocessing, orjson
from vlmtrace.analysis.readers.compact_records import declared
from vlmtrace.analysis.readers.journal_columns import parse_to_table
def rows(path):
    with open(path, "rb") as journal:
        keys = declared(orjson.loads(journal.readline()))  # format 3: the header's reading keys and attribute names
    return parse_to_table(path, keys).num_rows
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl")))
with concurrent.futures.ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("fork")) as pool:
    list(pool.map(rows, files))
"""
)
REPORT = MEASURE + "from vlmtrace.cli.main import app; app()"
TARGET_S, TARGET_MIB = 20, 1024


READINGS = frozenset(sc.JOURNAL_MEM_KEYS)
DERIVED = frozenset(key + sc.DELTA_SUFFIX for key in sc.MEM_DELTA_KEYS)  # the reader works these out again


def _apart(attrs: dict) -> tuple[dict, dict]:
    """A simulated span's attributes as the recorder keeps them: its own attributes, and its memory reading."""
    reading = {key: value for key, value in attrs.items() if key in READINGS}
    own = {key: value for key, value in attrs.items() if key not in READINGS and key not in DERIVED}
    return own, reading


def write_through_the_writer(scenario: Scenario, directory: Path) -> tuple[object, int]:
    """Simulate `scenario` and hand its records to a real JournalWriter as the recorder would (attributes
    and readings apart: the journal's compact format); returns the simulation's truth and the number of
    files written. The simulated header's resource and versions open the writer (which writes its own
    headers, one per rotated file)."""
    writer: JournalWriter | None = None
    at_start: dict[str, dict] = {}  # span id -> its reading at start, until its end

    def emit(record: dict) -> None:
        nonlocal writer
        kind = record["k"]
        if kind == "header":
            writer = JournalWriter.open(
                str(directory),
                max_bytes=Options.journal_max_bytes,  # the writer's default rotation
                max_files=1 << 20,
                resource=record.get("resource", {}),
                versions=record.get("versions", {}),
            )
        elif kind == "start":
            own, reading = _apart(record["attrs"])
            at_start[record["span_id"]] = reading
            fields = (record["t"], record["trace_id"], record["span_id"], record["parent_id"], record["name"])
            writer.write_span_start(
                records.start_record(*fields, record["kind"], record["thread"], own, reading, record["links"])
            )
        elif kind == "end":
            own, reading = _apart(record["attrs"])
            start_reading = at_start.pop(record["span_id"])
            writer.write_span_end(
                records.end_record(
                    record["t"],
                    record["start"],
                    record["trace_id"],
                    record["span_id"],
                    record["parent_id"],
                    record["name"],
                    record["kind"],
                    record["status"],
                    record["status_message"],
                    own,
                    reading,
                    start_reading if start_reading != reading else None,
                    record["events"],
                    record["links"],
                )
            )
        elif kind == "sample":
            writer.write_sample(record["t"], record["attrs"])
        elif kind == "warning":
            writer.warn(record["source"], record["message"])
        elif kind == "dropped":
            writer.note_dropped(record["otlp_spans"])
        elif kind == "end_marker":
            writer.close()

    truth = _Simulation(scenario, emit).run()
    writer.close()
    return truth, len(list(directory.glob("*.jsonl")))


def run(label: str, code: str, arguments: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (its child processes' included) and peak RSS (MiB) of a fresh
    interpreter running `code`; the RSS of its largest child process is printed beside it."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-c", code, *arguments],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"{label}: exit {done.returncode}\n{done.stderr[-3000:]}")
    line = next(line for line in done.stderr.splitlines() if line.startswith("MEASURED "))
    wall, cpu, rss, child_rss = (float(value) for value in line.split()[1:])
    children = f" + {child_rss:,.0f} MiB in its largest child" if child_rss else ""
    print(
        f"{label}: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {rss:,.0f} MiB{children} (load average {os.getloadavg()[0]:.2f})"
    )
    return wall, cpu, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument(
        "--keep", type=Path, help="keep the journal and outputs here (a journal already there is reused)"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = options.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        journal = folder / f"bench-{options.spans}"
        started = time.perf_counter()
        truth = None
        if journal.exists():
            size = sum(path.stat().st_size for path in journal.glob("*.jsonl"))
            print(f"journal: reusing {journal} ({size / MiB:,.0f} MiB)")
        else:
            truth, files = write_through_the_writer(
                Scenario(
                    requests=options.spans // SPANS_PER_REQUEST,
                    rates={"cache": 64 * 1024},
                    stages={"cache": "vision.forward"},
                    seed=7,
                ),
                journal,
            )
            size = sum(path.stat().st_size for path in journal.glob("*.jsonl"))
            print(
                f"journal: {truth.spans:,} spans, {truth.requests:,} requests, {size / MiB:,.0f} MiB in {files} files, "
                f"written in {time.perf_counter() - started:.0f} s"
            )
        parse_wall, parse_cpu, _ = run("parse only, 1 process", PARSE_ONLY, [str(journal)])
        split_wall, _, _ = run(
            f"parse only, a file per process, {os.cpu_count()} processes", PARSE_PARALLEL, [str(journal)]
        )
        run(f"DuckDB into columns only, a file per process, {os.cpu_count()} processes", PARSE_DUCKDB, [str(journal)])
        report_wall, report_cpu, report_rss = run(
            "vlmtrace report",
            REPORT,
            ["report", str(journal), "-o", str(folder / "report.html"), "--json", str(folder / "summary.json")],
        )
        read = json.loads((folder / "summary.json").read_bytes())
        print(f"spans in the report: {read['spans']:,}" + (f" of {truth.spans:,} written" if truth is not None else ""))
        print(f"report / parse (1 process): {report_wall / parse_wall:.2f} wall, {report_cpu / parse_cpu:.2f} CPU")
        print(f"report / parse ({os.cpu_count()} processes): {report_wall / split_wall:.2f} wall")
        print(f"HTML report: {(folder / 'report.html').stat().st_size / MiB:.1f} MiB")
        print(
            f"target: at most {TARGET_S} s and {TARGET_MIB:,} MiB: time {'met' if report_wall <= TARGET_S else 'missed'}, "
            f"memory {'met' if report_rss <= TARGET_MIB else 'missed'}"
        )
        if truth is not None and read["spans"] != truth.spans:
            sys.exit("the report did not read every span written: the figures above measure less than the journal")


if __name__ == "__main__":
    main()
