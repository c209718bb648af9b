"""The committed scenario matrices (tests/analysis/data/gpu/matrix/): add a graded matrix to them, and grade
their rows again after an analyzer change.

    python3 benchmarks/matrix_keep.py keep --manifest M --graded G --journals J --graded-at 291a4ae --keep ID,ID
    python3 benchmarks/matrix_keep.py regrade --graded-at 951fa32 [--journals J ...]
    python3 benchmarks/matrix_keep.py verdicts --out before.json
    python3 benchmarks/matrix_keep.py changes before.json after.json

`verdicts` analyses every committed journal (the GPU matrices' kept journals, the CPU matrix's kept journals,
the GPU fixtures) and writes each one's verdicts and, where its scenario is known, its grade; `changes` prints,
as a markdown table, every journal whose class, stage or grade differs between two such files.

`keep` appends a matrix's manifest entries and its rows as `gpu_matrix.py analyse --results` graded them
(`graded_at`: the analyzer that graded them) and copies the journals of the runs named in `--keep`, which the
CPU suite then re-grades at every change (tests/analysis/test_graded_gpu_runs.py). `regrade` grades again every row
whose journal is at hand (committed, or under one of `--journals`, ID/ per run as the device returns them),
rewrites the rows that changed with the new `graded_at`, and prints what changed; the rest keep the grade of
the last analyzer that had their journal.
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
from pathlib import Path

import gpu_matrix

MATRIX = Path(__file__).resolve().parents[1] / "tests" / "analysis" / "data" / "gpu" / "matrix"
# What a change of analyzer may change in a row (the rest describes the run).
GRADED = (
    "found",
    "leak_found",
    "class_right",
    "stage_found",
    "stage_right",
    "stage_share",
    "slope_found",
    "slope_right",
    "allocating_stage",
    "allocating_right",
)


def load(matrix: Path) -> tuple[list[dict], list[dict]]:
    return (json.loads((matrix / "manifest.json").read_text()), json.loads((matrix / "results.json").read_text()))


def save(matrix: Path, manifest: list[dict], results: list[dict]) -> None:
    (matrix / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (matrix / "results.json").write_text(json.dumps(results, indent=1) + "\n")


def keep(matrix: Path, manifest_path: str, graded_path: str, journals: str, graded_at: str, kept: set[str]) -> None:
    manifest, results = load(matrix)
    known = {entry["id"] for entry in manifest}
    new = json.loads(Path(manifest_path).read_text())
    rows = {row["id"]: row for row in json.loads(Path(graded_path).read_text())}
    if unknown := kept - {entry["id"] for entry in new}:
        raise SystemExit(f"not in the manifest: {', '.join(sorted(unknown))}")
    if repeated := known & {entry["id"] for entry in new}:
        raise SystemExit(f"already committed: {', '.join(sorted(repeated))}")
    copies = []
    for entry in new:
        entry["committed"] = entry["id"] in kept
        manifest.append(entry)
        results.append({**rows[entry["id"]], "graded_at": graded_at})
        if entry["committed"]:
            (source,) = glob.glob(f"{journals}/{entry['id']}/*.jsonl.gz")
            copies.append((source, matrix / f"{entry['id']}.jsonl.gz"))
    for source, target in copies:
        shutil.copy(source, target)
    save(matrix, manifest, results)
    print(
        f"{len(new)} runs added, {len(copies)} journals kept; {len(manifest)} runs, "
        f"{sum(entry['committed'] for entry in manifest)} journals in all"
    )


def regrade(matrix: Path, graded_at: str, journals: list[str]) -> list[str]:
    """The ids whose grade changed (their rows rewritten)."""
    from vlmtrace.analysis.pipeline import analyze
    from vlmtrace.analysis.readers.detect import read_inputs

    manifest, results = load(matrix)
    entries = {entry["id"]: entry for entry in manifest}
    changed = []
    for index, row in enumerate(results):
        entry = entries[row["id"]]
        if entry["committed"]:
            paths = [str(matrix / f"{row['id']}.jsonl.gz")]
        else:
            paths = [path for folder in journals for path in gpu_matrix.journal_paths(folder, row["id"])]
        if not paths:
            continue
        new = gpu_matrix.grade(entry, analyze(read_inputs(paths)).summary)
        differences = {key: (row.get(key), new.get(key)) for key in GRADED if row.get(key) != new.get(key)}
        if differences:
            print(row["id"], row["graded_at"], differences)
            results[index] = {**new, "graded_at": graded_at}
            changed.append(row["id"])
    save(matrix, manifest, results)
    return changed


DATA = MATRIX.parent.parent
VERDICT_KEYS = ("klass", "stage", "slope", "decided_by", "runner_up")


def _committed_journals(matrix: Path) -> list[tuple[str, list[str], dict | None]]:
    """(id, journal paths, manifest entry or None) for every committed journal."""
    import cpu_matrix

    manifest, _ = load(matrix)
    found = [(e["id"], [str(matrix / f"{e['id']}.jsonl.gz")], e) for e in manifest if e["committed"]]
    known = {s.id: s for s in cpu_matrix.scenarios()}
    for folder in sorted((DATA / "cpu_matrix").iterdir()):
        scenario = known.get(folder.name.removesuffix("-loaded"))
        entry = None
        if scenario is not None:
            entry = {
                **scenario.manifest_entry(),
                "id": folder.name,
                "injected_bytes": scenario.rate_bytes * scenario.requests,
            }
        found.append((folder.name, sorted(glob.glob(f"{folder}/*.jsonl.gz")), entry))
    found += [
        (Path(path).name.removesuffix(".jsonl.gz"), [path], None)
        for path in sorted(glob.glob(f"{DATA / 'gpu'}/*.jsonl.gz"))
    ]
    return found


def verdicts(matrix: Path, out: str) -> None:
    from vlmtrace.analysis.pipeline import analyze
    from vlmtrace.analysis.readers.detect import read_inputs

    table = {}
    for identifier, paths, entry in _committed_journals(matrix):
        summary = analyze(read_inputs(paths)).summary
        table[identifier] = {
            "verdicts": {
                f"{v.process}/{v.component}": {
                    "klass": v.klass,
                    "stage": v.stage,
                    "slope": round(v.slope_bytes_per_request / gpu_matrix.MiB, 3),
                    "decided_by": (v.evidence.get("decision") or {}).get("explanation"),
                    "runner_up": ((v.evidence.get("decision") or {}).get("runner_up") or {}).get("explanation"),
                }
                for v in summary.verdicts
            },
            "grade": None
            if entry is None
            else {key: value for key, value in gpu_matrix.grade(entry, summary).items() if key in GRADED},
        }
    Path(out).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(table)} journals analysed")


def changes(before_path: str, after_path: str) -> None:
    before, after = json.loads(Path(before_path).read_text()), json.loads(Path(after_path).read_text())
    print("| journal | component | before | after |")
    print("| --- | --- | --- | --- |")
    for identifier in sorted(before.keys() & after.keys()):
        old, new = before[identifier], after[identifier]
        for key in sorted(old["verdicts"].keys() | new["verdicts"].keys()):
            was, now = old["verdicts"].get(key, {}), new["verdicts"].get(key, {})
            if (was.get("klass"), was.get("stage")) != (now.get("klass"), now.get("stage")):
                said = [
                    f"{v.get('klass')} in {v.get('stage') or 'no stage'}, {v.get('slope')} MiB/req" for v in (was, now)
                ]
                print(f"| {identifier} | {key.split('/')[-1]} | {said[0]} | {said[1]} |")
        grades = [{k: v for k, v in (g or {}).items() if k.endswith("_right")} for g in (old["grade"], new["grade"])]
        if grades[0] != grades[1]:
            moved = ", ".join(
                f"{k}: {grades[0].get(k)} → {grades[1].get(k)}"
                for k in sorted(grades[0].keys() | grades[1].keys())
                if grades[0].get(k) != grades[1].get(k)
            )
            print(f"| {identifier} | grade | | {moved} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matrix", type=Path, default=MATRIX, help="the committed matrices' folder")
    commands = parser.add_subparsers(dest="command", required=True)
    adding = commands.add_parser("keep", help="add a graded matrix and keep some of its journals")
    adding.add_argument("--manifest", required=True, help="the matrix's matrix-manifest.json")
    adding.add_argument("--graded", required=True, help="its rows, from gpu_matrix.py analyse --results")
    adding.add_argument("--journals", required=True, help="its unpacked journals, ID/ per run")
    adding.add_argument("--graded-at", required=True, help="the analyzer that graded it: its git commit")
    adding.add_argument("--keep", default="", help="comma-separated ids whose journals are committed")
    again = commands.add_parser("regrade", help="grade again every row whose journal is at hand")
    again.add_argument("--graded-at", required=True, help='the analyzer grading now, as "stop N"')
    again.add_argument("--journals", nargs="*", default=[], help="folders of journals not committed, ID/ per run")
    table = commands.add_parser("verdicts", help="analyse every committed journal and write its verdicts")
    table.add_argument("--out", required=True)
    diff = commands.add_parser("changes", help="the journals whose verdicts differ between two verdicts files")
    diff.add_argument("before")
    diff.add_argument("after")
    args = parser.parse_args()
    if args.command == "verdicts":
        verdicts(args.matrix, args.out)
    elif args.command == "changes":
        changes(args.before, args.after)
    elif args.command == "keep":
        keep(
            args.matrix,
            args.manifest,
            args.graded,
            args.journals,
            args.graded_at,
            set(filter(None, args.keep.split(","))),
        )
    else:
        regrade(args.matrix, args.graded_at, args.journals)


if __name__ == "__main__":
    main()
