"""The crash-safe local journal (docs/journal.md).

- `records`: how each record is built and encoded (one encoder for every writer of records);
- `files`: file names, permissions, creation and locking;
- `tail`: the reserved, memory-mapped end of the current file that records are copied into;
- `stacks`: faulthandler's report of Python's stacks at a fatal signal, into the journal;
- `writer`: `JournalWriter`, one process's records into its files, rotation and the disk-full end;
- `processor`: `JournalSpanProcessor`, other instrumentations' SDK spans into the journal.
"""

from vlmtrace.export.journal.processor import JournalSpanProcessor
from vlmtrace.export.journal.records import FORMAT_VERSION
from vlmtrace.export.journal.writer import JournalWriter

__all__ = ["FORMAT_VERSION", "JournalSpanProcessor", "JournalWriter"]
