"""Analyzer benchmark: a journal of 1 000 000 spans → HTML report + JSON summary.

Writes the journal with the synthetic generator (tests/analysis/synthetic.py) into a temporary
directory, then runs, each in a fresh process that reports its own peak RSS (its readers' too):
  1. parse only: every line through orjson.loads in one process, nothing kept;
  2. parse only, the file split in one line-aligned range per core, one process each;
  3. the full `vlmtrace report` command (HTML + JSON).
Prints wall and CPU times, peak RSS and the ratios. Targets: report < 60 s, < 4 GB, < 3× parse.
The machine's load average is printed with each step: on a shared machine, read the numbers with it.

    PYTHONPATH=src python benchmarks/analyze_1m_spans.py [--spans 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "analysis"))

from synthetic import MiB, Scenario, write_journal  # noqa: E402

SPANS_PER_REQUEST = 8  # pipeline, chat, preprocess, vision preprocess, 2 vision infer (one with a forward), engine stream
MEASURE = """
import atexit, resource, sys, time
started = time.perf_counter()
def report():
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    sys.stderr.write(f"MEASURED {time.perf_counter() - started} {me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime} "
                     f"{me.ru_maxrss / 1024} {children.ru_maxrss / 1024}\\n")
atexit.register(report)
"""
PARSE_ONLY = MEASURE + """
import orjson
loads = orjson.loads
with open(sys.argv[1], "rb") as handle:
    for line in handle:
        loads(line)
"""
PARSE_PARALLEL = MEASURE + """
import io, os, orjson, concurrent.futures, multiprocessing
from vlmtrace.analysis.readers.parallel import ranges, _Window
def parse(bounds):
    with io.BufferedReader(_Window(sys.argv[1], *bounds), 1 << 20) as handle:
        for line in handle:
            orjson.loads(line)
parts = ranges(sys.argv[1], os.cpu_count())
with concurrent.futures.ProcessPoolExecutor(len(parts), mp_context=multiprocessing.get_context("fork")) as pool:
    list(pool.map(parse, parts))
"""
REPORT = MEASURE + "from vlmtrace.cli.main import app; app()"


def run(label: str, code: str, arguments: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (its child processes' included) and peak RSS (MiB) of a fresh
    interpreter running `code`; the RSS of its largest child process is printed beside it."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code, *arguments], env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = next(line for line in done.stderr.splitlines() if line.startswith("MEASURED "))
    wall, cpu, rss, child_rss = (float(value) for value in line.split()[1:])
    children = f" + {child_rss:,.0f} MiB in its largest child" if child_rss else ""
    print(f"{label}: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {rss:,.0f} MiB{children} (load average {os.getloadavg()[0]:.2f})")
    return wall, cpu, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="keep the journal and outputs here (a journal already there is reused)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = options.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        journal = folder / f"bench-{options.spans}.jsonl"
        started = time.perf_counter()
        if journal.exists():
            print(f"journal: reusing {journal} ({journal.stat().st_size / MiB:,.0f} MiB)")
        else:
            truth = write_journal(
                Scenario(requests=options.spans // SPANS_PER_REQUEST, rates={"cache": 64 * 1024}, stages={"cache": "vision.forward"}, seed=7),
                journal,
            )
            print(f"journal: {truth.spans:,} spans, {truth.requests:,} requests, {journal.stat().st_size / MiB:,.0f} MiB, "
                  f"written in {time.perf_counter() - started:.0f} s")
        parse_wall, parse_cpu, _ = run("parse only, 1 process", PARSE_ONLY, [str(journal)])
        split_wall, _, _ = run(f"parse only, {os.cpu_count()} processes", PARSE_PARALLEL, [str(journal)])
        report_wall, report_cpu, _ = run(
            "vlmtrace report", REPORT, ["report", str(journal), "-o", str(folder / "report.html"), "--json", str(folder / "summary.json")]
        )
        print(f"report / parse (1 process): {report_wall / parse_wall:.2f} wall, {report_cpu / parse_cpu:.2f} CPU")
        print(f"report / parse ({os.cpu_count()} processes): {report_wall / split_wall:.2f} wall")
        print(f"HTML report: {(folder / 'report.html').stat().st_size / MiB:.1f} MiB")


if __name__ == "__main__":
    main()
