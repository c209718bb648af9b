"""Records queued on the request path and written by the journal's flushing thread (docs/journal.md,
Crash safety): no record waits longer than 10 ms to reach the kernel. A fatal signal writes nothing of
what is queued (no Python runs in a signal handler): the last interval's records are not in the journal."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

# The promise is that no record waits longer than 10 ms to reach the kernel. The flushing thread wakes
# this often; when it wakes it may wait up to the GIL's switch interval (5 ms) for a thread running
# Python code to let it in.
FLUSH_INTERVAL_S = 0.004
MAX_PENDING = 1 << 16  # records waiting for the flushing thread; beyond, records are counted as lost

WriteLines = Callable[[list[bytes]], None]


class RecordQueue:
    """Records as they were made (a `deque` append is the cheapest thing the request path can do), or a
    span's fields with the builder that makes its record of them (records.start_from_ids), built, encoded and
    written in batches by a thread of its own."""

    def __init__(
        self,
        encode: Callable[[Any], bytes],
        write_lines: WriteLines,
        room: Callable[[], int],
        lost: Callable[[int], None],
    ) -> None:
        """`encode(record)` makes a record's line (compact.Compactor); `write_lines(lines)` writes whole
        encoded lines and empties the list, under the lock that orders the copies; `room()` is how many
        bytes the current file takes before it rotates; `lost(n)` counts records that could not be encoded
        or queued."""
        self._encode = encode
        self._write_lines = write_lines
        self._room = room
        self._lost = lost
        self._stopped = False
        self._reset()

    def _reset(self) -> None:
        self.pending: collections.deque[Mapping[str, Any]] = collections.deque()
        self._lock = threading.Lock()

    def put(self, record: Mapping[str, Any]) -> None:
        pending = self.pending
        if len(pending) < MAX_PENDING:
            pending.append(record)
        else:
            self._lost(1)

    def start(self) -> None:
        threading.Thread(target=self._flush_regularly, name="vlmtrace-journal", daemon=True).start()

    def stop(self) -> None:
        """The flushing thread ends within FLUSH_INTERVAL_S; what is queued stays for a last `drain`."""
        self._stopped = True

    def after_fork_in_child(self) -> None:
        """The parent's queued records are the parent's to write; threads do not survive a fork."""
        self._reset()
        if not self._stopped:
            self.start()

    def _flush_regularly(self) -> None:
        while not self._stopped:
            time.sleep(FLUSH_INTERVAL_S)
            if self.pending:
                self.drain()

    def drain(self, timeout_s: float = -1) -> bool:
        """Encode the queued records and write them, one copy per batch. `timeout_s`: how long to wait for
        another drain to finish; -1 waits as long as it takes. False if the queue is not empty after."""
        if self._lock.acquire(timeout=timeout_s):
            try:
                self._drain_held()
            finally:
                self._lock.release()
        return not self.pending

    def _drain_held(self) -> None:
        """The drain, by the holder of the lock."""
        pending, encode, lines = self.pending, self._encode, []
        size, room = 0, self._room()
        for _ in range(len(pending)):  # only what is queued now: under constant load the drain still ends
            try:
                line = encode(pending.popleft())
            except Exception:  # noqa: BLE001 - a record that cannot be encoded is counted, never raised
                self._lost(1)
                continue
            lines.append(line)
            size += len(line)
            if size >= room:  # the file passes its size limit with this record: write (it rotates), go on
                self._write_lines(lines)
                size, room = 0, self._room()
        if lines:
            self._write_lines(lines)
