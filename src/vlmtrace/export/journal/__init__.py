"""The crash-safe local journal (docs/journal.md).

- `records`: how each record is built (one builder for every writer of records);
- `compact`: how records are encoded as format 3 writes them (readings as arrays, compact end records);
- `redaction`: what looks like a secret in the header's command line;
- `files`: file names, permissions, creation and locking;
- `rotation`: the writer's files: the first, rotation by size, a stalled journal, the end at a full disk;
- `tail`: the reserved, memory-mapped end of the current file that records are copied into;
- `batching`: records queued on the request path, written by the journal's flushing thread;
- `stacks`: at a fatal signal, Python's stacks (faulthandler) and the queued records, into the journal;
- `writer`: `JournalWriter`, one process's records into its files, in order; forks and close;
- `processor`: `JournalSpanProcessor`, other instrumentations' SDK spans into the journal.
"""

from typing import Any

from vlmtrace.export.journal.records import FORMAT_VERSION
from vlmtrace.export.journal.writer import JournalWriter


def __getattr__(name: str) -> Any:
    """`JournalSpanProcessor` needs the OpenTelemetry SDK, which the base install lacks: imported when asked for."""
    if name == "JournalSpanProcessor":
        from vlmtrace.export.journal.processor import JournalSpanProcessor

        return JournalSpanProcessor
    raise AttributeError(name)


__all__ = ["FORMAT_VERSION", "JournalSpanProcessor", "JournalWriter"]
