"""Reading journal files in tests: JSON records, then whatever text follows them (faulthandler's report)."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from vlmtrace.analysis.readers.compact_records import FullRecords


def read_journal_file(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], str]:
    """The JSON records of one file in order, as format 2 writes them (a format 3 end completed from its
    start, readings as objects: what a reader makes of them), and the text from the first non-JSON line on.

    A process that died leaves the unused, zero-filled part of the journal's mapped tail between
    its last record and faulthandler's report: those zero bytes are not content.
    """
    with open(path, "rb") as journal:
        lines = journal.read().replace(b"\0", b"").split(b"\n")
    records: list[dict[str, Any]] = []
    full = FullRecords()
    for index, line in enumerate(lines):
        if not line:
            continue
        try:
            record = full.full(json.loads(line))
            assert record is not None, f"an end record without its start: {line[:200]!r}"
            records.append(record)
        except ValueError:
            return records, b"\n".join(lines[index:]).decode(errors="replace")
    return records, ""


def journal_files(directory: str | os.PathLike[str]) -> list[str]:
    """The journal files in a directory, oldest sequence number first."""
    return sorted(glob.glob(os.path.join(directory, "*.jsonl")), key=lambda p: int(p.rsplit(".", 2)[-2]))


def records_of(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records of all files in a directory, in sequence order (files must hold no fatal text)."""
    records: list[dict[str, Any]] = []
    for path in journal_files(directory):
        file_records, rest = read_journal_file(path)
        assert rest == "", f"{path} has non-JSON text: {rest[:200]!r}"
        records.extend(file_records)
    return records


def of_kind(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [record for record in records if record["k"] == kind]
