"""Which process a journal file's records belong to: its header's (host, pid, resource, versions, command line,
format version), or, for a file whose header is missing, the one its name says."""

from __future__ import annotations

import os
import re
from typing import Any

from vlmtrace.analysis.readers import budget
from vlmtrace.analysis.readers.depth import text, within_depth
from vlmtrace.analysis.trace_data import TraceData

WRITER_FILE_NAME = re.compile(r"^vlmtrace-(?P<host>.+)-(?P<pid>\d{1,10})-\d+\.\d+\.jsonl$")
# The journal format versions this reader knows (docs/journal.md); a header of another is refused.
KNOWN_VERSIONS = (1, 2, 3)


def known_version(data: TraceData, header: dict, source: str, lineno: int) -> bool:
    """Whether the header's format version is one this reader knows (a header without one is an
    early writer's); the records under another are skipped, and the report names the version."""
    version = header.get("v")
    if version is None or (type(version) is int and version in KNOWN_VERSIONS):
        return True
    shown = text(version, 40)
    data.problem(
        source,
        lineno,
        f"journal format version {shown} is not one this vlmtrace reads "
        f"({', '.join(map(str, KNOWN_VERSIONS))}); its records were skipped",
    )
    return False


def of_header(data: TraceData, record: dict, source: str, lineno: int, headers_seen: set[int]) -> int:
    """The process whose records follow a header (its resource, versions and command line kept)."""
    resource = _kept(record, "resource", dict, source) or {}
    label = process_label(record, os.path.basename(source))
    host, pid, service = record.get("host"), record.get("pid"), resource.get("service.name")
    process = data.process(
        label,
        host=host if isinstance(host, str) else None,
        pid=pid if type(pid) is int and 0 <= pid < 2**63 else None,
        service=service if isinstance(service, str) else None,
        resource=resource,
        versions=_kept(record, "versions", dict, source),
        argv=_kept(record, "argv", list, source),
        from_journal=True,
    )
    info = data.processes[process]
    if source not in info.sources:
        info.sources.append(source)
    if headers_seen and process not in headers_seen:
        data.problem(
            source,
            lineno,
            f"records of another process ({label}) are interleaved in this file; "
            "records after this header are attributed to it",
            "note",
        )
    headers_seen.add(process)
    return process


def of_headless_file(data: TraceData, source: str, lineno: int) -> int:
    """A file whose header is missing or unreadable (cut, overwritten, deleted by rotation): its process
    is the one its name says (`vlmtrace-HOST-PID-START.N.jsonl`, as the writer names files), else named
    after the file; the report says which."""
    named = WRITER_FILE_NAME.match(os.path.basename(source))
    if named is None:
        data.problem(source, lineno, "journal records before any header; process named after the file", "note")
        process = data.process(os.path.basename(source), sources=[source], from_journal=True)
    else:
        host, pid = named["host"], int(named["pid"])
        data.problem(
            source,
            lineno,
            f"journal records before any header; process taken from the file name (host {host}, pid {pid})",
            "note",
        )
        process = data.process(f"{host}:{pid}", host=host, pid=pid, sources=[source], from_journal=True)
        info = data.processes[process]
        if source not in info.sources:
            info.sources.append(source)
    return process


def process_label(header: dict, fallback: str) -> str:
    host, pid = header.get("host"), header.get("pid")
    pid = pid if type(pid) is int else None
    if isinstance(host, str) and pid is not None:
        return f"{host[:200]}:{pid}"
    if pid is not None:
        return f"pid {pid}"
    return fallback


def _kept(header: dict, key: str, kind: type, source: str) -> Any:
    """A header's `key` where it is a `kind`, cut at the depth bound (the cuts counted on the budget); else None."""
    value = header.get(key)
    if not isinstance(value, kind):
        return None
    value, cut = within_depth(value)
    budget.current().cut_deep(f"the header's {key!r} of {source}", cut)
    return value
