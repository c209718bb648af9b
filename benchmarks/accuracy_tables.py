"""How far to trust a verdict, as Markdown tables: the graded GPU scenario runs held out from tuning, by
backend and class (rows) and prompts in flight (columns), for docs/accuracy.md and the README.

    python3 benchmarks/accuracy_tables.py [--results tests/analysis/data/gpu/matrix/results.json]

Each row of the results file is one run of benchmarks/gpu_matrix.py with a known injected cause (or
none: a negative), graded by the analyzer named in its `graded_at`. Runs in a tuning half are left out.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "tests/analysis/data/gpu/matrix/results.json"
BACKENDS = {"tm": "TurboMind", "pt": "PyTorch engine"}
CLASSES = ("host_growth", "tensor_leak", "cache_retention", "native_growth", "negative")
SHAPE = re.compile(r"-(\d+)x(\d+)")


def held_out(rows: list[dict]) -> list[dict]:
    return [row for row in rows if row["half"].startswith("held_out") and row["expected"] in CLASSES]


def in_flight(row: dict) -> int:
    return int(SHAPE.search(row["id"]).group(1))


def cell(rows: list[dict], key: str) -> str:
    graded = [row for row in rows if row.get(key) is not None]
    return f"{sum(row[key] is True for row in graded)}/{len(graded)}" if graded else "–"


def class_table(rows: list[dict]) -> str:
    """Class right (for a negative: no leak called), by backend and class, per prompts in flight."""
    widths = sorted({in_flight(row) for row in rows})
    lines = [
        "| backend | injected | " + " | ".join(f"{n} in flight" for n in widths) + " | all |",
        "| --- | --- | " + " | ".join("---:" for _ in widths) + " | ---: |",
    ]
    groups = collections.defaultdict(list)
    for row in rows:
        groups[(row["id"][:2], row["expected"])].append(row)
    for (backend, expected), group in sorted(groups.items(), key=lambda g: (g[0][0], CLASSES.index(g[0][1]))):
        by_width = [cell([row for row in group if in_flight(row) == n], "class_right") for n in widths]
        lines.append(
            f"| {BACKENDS[backend]} | {expected.replace('_', ' ')} | "
            + " | ".join(by_width)
            + f" | {cell(group, 'class_right')} |"
        )
    return "\n".join(lines)


def stage_table(rows: list[dict]) -> str:
    """Of the leaks with a stage to find: named right, withheld (with the reason), named wrong; slope within 10 %."""
    lines = [
        "| backend | leaks | stage right | stage withheld | stage wrong | slope within 10 % |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for backend, name in BACKENDS.items():
        leaks = [row for row in rows if row["id"].startswith(backend) and row["expected"] != "negative"]
        staged = [row for row in leaks if row.get("stage_right") is not None]
        count = collections.Counter(str(row["stage_right"]) for row in staged)
        lines.append(
            f"| {name} | {len(leaks)} | {count['True']} | {count['withheld']} | {count['False']} | "
            f"{cell(leaks, 'slope_right')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    rows = held_out(json.loads(parser.parse_args().results.read_text()))
    requests = sorted(row["requests"] for row in rows)
    print(f"{len(rows)} held-out runs, {requests[0]}-{requests[-1]} requests each\n")
    print(class_table(rows) + "\n")
    print(stage_table(rows))


if __name__ == "__main__":
    main()
