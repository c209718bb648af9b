"""The committed journals graded as recorded and as `detail_every` K would have recorded them.

    PYTHONPATH=src:benchmarks python3 benchmarks/sampling_regrade.py [--every 4,16] [--young 200,0] [--only ID,...]

Every committed journal (benchmarks/matrix_keep.py's: the GPU matrices' kept journals, the CPU matrix's,
the GPU fixtures) is analysed as recorded, then once per (K, young): in each process, by request start, a
request past the first `young` whose count is not a multiple of K loses its stage detail as the served
process would drop it (instrumentation/detail.py): the spans under it, the readings where its prompt ended
and where it answered, its sampling parameters; it gains `vlmtrace.request.detail_skipped` and the header
declares the sampling. The simulation is the strictest case: no request is kept for suspected growth.
`young` 0 is no product setting: it samples from the first request, to test the stage attribution where
nearly every request lacks detail. Journals recorded with the heap counter are left out (with it the
served process records every request's detail).

Prints, per journal and component, the verdict's class, stage and rate (MiB a request) as recorded and
sampled, the grade's changes where the scenario is known, and the counts of what moved.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import tempfile
from pathlib import Path

import gpu_matrix
import matrix_keep
import orjson

from vlmtrace import semconv as sc
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.detect import read_inputs

DROPPED_ATTRIBUTES = frozenset(
    {
        sc.GEN_AI_REQUEST_MAX_TOKENS,
        sc.GEN_AI_REQUEST_TEMPERATURE,
        sc.GEN_AI_REQUEST_TOP_P,
        sc.GEN_AI_REQUEST_TOP_K,
        sc.GEN_AI_REQUEST_SEED,
        sc.GEN_AI_REQUEST_STOP_SEQUENCES,
        *sc.PROMPT_END_KEYS.values(),
        *sc.RESPONSE_END_KEYS.values(),
    }
)
GRADED = ("class_right", "stage_right", "slope_right")


def read_records(paths: list[str]) -> list[dict]:
    """The journal's records; a line cut by a crash is left out (both copies, recorded and sampled, lack it)."""
    records = []
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as file:
            for line in file:
                with contextlib.suppress(orjson.JSONDecodeError):
                    records.append(orjson.loads(line))
    return records


def heap_counted(records: list[dict]) -> bool:
    return any(
        record.get("k") == "sample" and sc.MEM_HOST_HEAP in (record.get("attrs") or {}) for record in records[:2000]
    )


def sampled(records: list[dict], every: int, young: int) -> list[dict]:
    """The records as a served process with `detail_every` `every` would have written them (format 2)."""
    if any(record.get("k") == "header" and record.get("v", 2) > 2 for record in records):
        raise SystemExit("format 3 journals are not simulated here: re-encode as format 2 first")
    starts = {r["span_id"]: r for r in records if r.get("k") == "start"}
    skipped: set[str] = set()
    seen: dict[int, int] = {}  # requests started, per header (one process each)
    process = 0
    for record in records:
        kind = record.get("k")
        if kind == "header":
            process += 1
        elif kind == "start" and (record.get("attrs") or {}).get(sc.STAGE) == sc.STAGE_REQUEST:
            count = seen.get(process, 0)
            seen[process] = count + 1
            if count >= young and count % every:
                skipped.add(record["span_id"])

    def under_skipped(span_id: str) -> bool:
        parent = starts.get(span_id, {}).get("parent_id")
        for _ in range(64):
            if parent is None or parent not in starts:
                return False
            if parent in skipped:
                return True
            parent = starts[parent].get("parent_id")
        return False

    dropped = {span_id for span_id in starts if under_skipped(span_id)}
    out = []
    for given in records:
        kind = given.get("k")
        if kind in ("start", "end") and given.get("span_id") in dropped:
            continue
        record = given
        if kind == "header":
            declared = {sc.RESOURCE_DETAIL_EVERY: every, sc.RESOURCE_DETAIL_YOUNG: young}
            record = {**given, "resource": {**(given.get("resource") or {}), **declared}}
        elif kind in ("start", "end") and given.get("span_id") in skipped:
            attributes = {k: v for k, v in given["attrs"].items() if k not in DROPPED_ATTRIBUTES}
            attributes[sc.REQUEST_DETAIL_SKIPPED] = 1
            record = {**given, "attrs": attributes}
        out.append(record)
    return out


def verdicts(paths: list[str]) -> tuple[dict, object]:
    summary = analyze(read_inputs(paths)).summary
    found = {
        v.component: (v.klass, v.stage, round(v.slope_bytes_per_request / gpu_matrix.MiB, 3))
        for v in summary.verdicts
        if v.klass != "no_growth"
    }
    return found, summary


def shown(verdict: tuple | None) -> str:
    if verdict is None:
        return "no growth"
    klass, stage, rate = verdict
    return f"{klass}, {stage or 'no stage'}, {rate}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", default="4,16", help="comma-separated K")
    parser.add_argument("--young", default="200,0", help="comma-separated young request counts")
    parser.add_argument("--only", default="", help="comma-separated journal ids (default: all)")
    args = parser.parse_args()
    variants = [(int(k), int(y)) for y in args.young.split(",") for k in args.every.split(",")]
    only = set(filter(None, args.only.split(",")))
    moved = {variant: {"class": 0, "stage": 0, "rate": 0, "grade": 0, "sampled": 0} for variant in variants}
    journals = heap = 0
    names = " | ".join(f"K={k} after {y}" for k, y in variants)
    print(f"| journal | requests | component | recorded | {names} |")
    print("| --- | ---: | --- | --- | " + " | ".join("---" for _ in variants) + " |")
    with tempfile.TemporaryDirectory() as folder:
        for identifier, paths, entry in matrix_keep._committed_journals(matrix_keep.MATRIX):
            if only and identifier not in only:
                continue
            records = read_records(paths)
            if heap_counted(records):
                heap += 1
                continue
            journals += 1
            recorded = Path(folder) / f"{identifier}.recorded.jsonl"  # read as the sampled copies are
            recorded.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
            full, summary = verdicts([str(recorded)])
            grade = gpu_matrix.grade(entry, summary) if entry else {}
            rows: dict[str, list[str]] = {c: [shown(v)] for c, v in full.items()}
            notes = []
            for done, variant in enumerate(variants):
                path = Path(folder) / f"{identifier}.jsonl"
                written = sampled(records, *variant)
                path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in written))
                found, sampled_summary = verdicts([str(path)])
                if any(sc.REQUEST_DETAIL_SKIPPED in (r.get("attrs") or {}) for r in written if r.get("k") == "end"):
                    moved[variant]["sampled"] += 1
                for component in full.keys() | found.keys():
                    rows.setdefault(component, [shown(None)] * (1 + done))
                    was, now = full.get(component), found.get(component)
                    if (was or (None,))[0] != (now or (None,))[0]:
                        moved[variant]["class"] += 1
                    elif was and now and was[1] != now[1]:
                        moved[variant]["stage"] += 1
                    elif was and now and abs(now[2] - was[2]) > 0.1 * max(abs(was[2]), 1e-3):
                        moved[variant]["rate"] += 1
                for component, row in rows.items():
                    row.append(shown(found.get(component)))
                if entry:
                    new = gpu_matrix.grade(entry, sampled_summary)
                    changed = [
                        f"{key} {grade.get(key)}→{new.get(key)}" for key in GRADED if grade.get(key) != new.get(key)
                    ]
                    if changed:
                        moved[variant]["grade"] += 1
                        notes.append(f"K={variant[0]} after {variant[1]}: " + ", ".join(changed))
            for component, row in sorted(rows.items()):
                cells = [row[0]] + [cell if cell != row[0] else "=" for cell in row[1:]]
                print(f"| {identifier} | {summary.requests} | {component} | " + " | ".join(cells) + " |")
            for note in notes:
                print(f"| {identifier} | | grade | {note} |" + " |" * (len(variants) - 1))
    print(f"\n{journals} journals regraded ({heap} recorded with the heap counter left out).\n")
    print(
        "| sampling | journals with requests sampled out | class moved | stage moved | rate moved >10 % | grade moved |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for (k, y), count in moved.items():
        print(
            f"| K={k} after {y} | {count['sampled']} | {count['class']} | {count['stage']} | {count['rate']} | "
            f"{count['grade']} |"
        )


if __name__ == "__main__":
    main()
