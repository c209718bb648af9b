"""Journal bytes a request on the GPU pipeline: each committed GPU journal recorded in format 1 or 2 (those
recorded in format 3 are left out) and re-encoded as format 3 by the writer's own encoder (export/journal/compact.py), with gzip'ed sizes for
reference, and where format 3's bytes go, by record kind and span name.

A request is a `request` stage span's end (`chat …`). Re-encoding gives each record what the writer would
have written for it: the same spans, readings and attributes (tests/analysis/test_journal_format3.py checks
that the analysis reads the same from both).

    PYTHONPATH=src python benchmarks/journal_bytes.py [JOURNAL.jsonl.gz ...]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import os
import platform
import socket
import sys
from collections.abc import Iterable
from pathlib import Path

import orjson

from vlmtrace import semconv as sc
from vlmtrace.export.journal.compact import Compactor

GPU = Path(__file__).resolve().parents[1] / "tests" / "analysis" / "data" / "gpu"


def reencoded(lines: Iterable[bytes]) -> list[bytes]:
    """A format 1 or 2 journal's lines as the format 3 writer writes them; a line that is no JSON object
    (zero bytes, faulthandler's text, a record cut by a crash) as it is."""
    compactor, out = Compactor(), []
    for line in lines:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            out.append(line)
            continue
        if type(record) is not dict:
            out.append(line)
            continue
        kind = record.get("k")
        if kind == "header":
            compactor.forget()
            record = {**record, "v": 3, "mem_keys": sc.JOURNAL_MEM_KEYS, "attr_keys": sc.JOURNAL_ATTR_KEYS}
        elif kind == "start":
            record = {"parent_id": None, "kind": "INTERNAL", "thread": None, "mem": {}, "links": [], **record}
        elif kind == "end":
            record = {
                "parent_id": None,
                "kind": "INTERNAL",
                "status": "UNSET",
                "status_message": None,
                "mem": {},
                "events": [],
                "links": [],
                **record,
            }
        out.append(compactor.encode(record))
    return out


def _request_ends(lines: list[bytes]) -> int:
    count = 0
    for line in lines:
        if line.startswith(b'{"k":"end"') and b'"vlmtrace.stage":"request"' in line:
            count += 1
    return count


def _breakdown(lines: list[bytes]) -> collections.Counter:
    """Format 3 bytes by record kind and span name (an end's name from its start)."""
    names: dict[str, str] = {}
    spent: collections.Counter = collections.Counter()
    for line in lines:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            spent["(not JSON)"] += len(line)
            continue
        kind = record.get("k")
        if kind == "start":
            names[record["span_id"]] = record["name"]
            spent[f"start {record['name']}"] += len(line)
        elif kind == "end":
            spent[f"end {record.get('name') or names.get(record['span_id'], '?')}"] += len(line)
        else:
            spent[kind] += len(line)
    return spent


def _version(path: Path) -> int:
    with gzip.open(path) as journal:
        return orjson.loads(journal.readline()).get("v", 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("journals", nargs="*", type=Path)
    parser.add_argument("--breakdown", type=int, default=6, help="rows of the per-span-kind breakdown a journal")
    args = parser.parse_args()
    journals = args.journals or [path for path in sorted(GPU.glob("*.jsonl.gz")) if _version(path) < 3]
    recorded_format3 = [path.name for path in journals if _version(path) >= 3]
    if recorded_format3:
        parser.error(f"recorded in format 3 already, nothing to re-encode: {', '.join(recorded_format3)}")
    print(f"# {' '.join(['python', *sys.argv])}")
    print(f"# {socket.gethostname()} {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"{'journal':34} {'requests':>8} {'recorded B/req':>14} {'v3 B/req':>9} {'ratio':>6} "
        f"{'gzip rec':>9} {'gzip v3':>8}"
    )
    breakdowns = []
    for path in journals:
        recorded = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
        version = orjson.loads(recorded[0]).get("v")
        compact = reencoded(recorded)
        requests = _request_ends(b"".join(recorded).splitlines()) or 1
        before, after = sum(map(len, recorded)), sum(map(len, compact))
        zipped_before = len(gzip.compress(b"".join(recorded), 6)) / requests
        zipped_after = len(gzip.compress(b"".join(compact), 6)) / requests
        print(
            f"{path.name:34} {requests:8d} {before / requests:10.0f} (v{version}) {after / requests:9.0f} "
            f"{after / before:6.2f} {zipped_before:9.0f} {zipped_after:8.0f}"
        )
        breakdowns.append((path.name, requests, _breakdown(compact)))
    print("\nformat 3 bytes a request by record kind and span name (the largest rows of each journal):")
    for name, requests, spent in breakdowns:
        print(f"  {name}")
        for key, size in spent.most_common(args.breakdown):
            print(f"    {key:44} {size / requests:8.0f}")


if __name__ == "__main__":
    main()
