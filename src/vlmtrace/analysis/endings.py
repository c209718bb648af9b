"""How each journaled process ended, in one phrase, and the fatal-signal reports it left.

A journal's end record says the process ended cleanly, and what ended it (`process_ending`). Without
one, the journal still tells the rest: faulthandler's report means a fatal signal (crashed); a file
still locked means its process is alive (still running: the journal's writer holds an advisory lock
as long as it runs, seen where the report runs on the same host); otherwise it was killed (SIGKILL,
the OOM killer), and its last record says when.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import sys

from vlmtrace.analysis import copied
from vlmtrace.analysis.readers.journal import rotation_order
from vlmtrace.analysis.trace_data import FatalBlock, ProcessInfo, TraceData

LOCK_LOOKS = 5  # listings of a journal's files while looking for its writer's lock (a rotation may race one)
_THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
# faulthandler's title for each fatal signal ("Fatal Python error: Aborted")
_SIGNAL_OF_TITLE = {
    "Aborted": "SIGABRT",
    "Segmentation fault": "SIGSEGV",
    "Floating point exception": "SIGFPE",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
}


@dataclasses.dataclass
class FatalReport:
    source: str
    line: int
    title: str
    threads: list[dict]
    text: str  # cut at copied.FATAL_TEXT_CHARS
    lines_left_out: int = 0  # thread headers and frames past copied.FATAL_LINES

    @property
    def stacks(self) -> list[dict]:
        """Threads with identical frames as one entry (a thread pool's idle workers): `threads` lists
        their ids, the current thread's stack first."""
        grouped: dict[tuple, dict] = {}
        for thread in self.threads:
            key = (thread["current"], tuple(thread["frames"]))
            entry = grouped.setdefault(key, {"current": thread["current"], "threads": [], "frames": thread["frames"]})
            entry["threads"].append(thread["thread"])
        return sorted(grouped.values(), key=lambda entry: not entry["current"])


def fatal_signal(report: FatalReport) -> str:
    """The signal's name from faulthandler's title; the title itself for one it does not name."""
    reason = report.title.removeprefix("Fatal Python error: ").strip()
    return _SIGNAL_OF_TITLE.get(reason, reason or "a fatal signal")


def still_running(sources: list[str]) -> bool:
    """Whether a live process still holds one of its journal files (its writer's advisory lock): the files
    read, or any file of theirs the writer rotated to since (`x.7.jsonl` after `x.6.jsonl`). A writer locks
    its next file before it lets go of the last, so the files are listed again while new ones appear."""
    if sys.platform == "win32":  # no advisory locks to tell a running writer by
        return False
    listed: set[str] = set()
    for _ in range(LOCK_LOOKS):
        files = set(sources) | _rotated_siblings(sources)
        if files <= listed:
            return False  # no file appeared since the last look: nobody is writing
        if any(_locked(path) for path in sorted(files - listed, key=rotation_order, reverse=True)) or any(
            _locked(path) for path in sorted(listed & files, key=rotation_order, reverse=True)
        ):
            return True
        listed = files
    return False


def _rotated_siblings(sources: list[str]) -> set[str]:
    """The files beside `sources` that belong to the same writer's rotation (same name before the sequence)."""
    prefixes = {rotation_order(source)[0] for source in sources}
    stems = tuple({os.path.basename(prefix) for prefix in prefixes})
    found = set()
    for directory in {os.path.dirname(source) for source in sources}:
        try:
            names = os.listdir(directory or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith(stems):  # most names in a directory of many writers' files stop here
                path = os.path.join(directory, name)
                if rotation_order(path)[0] in prefixes:
                    found.add(path)
    return found


def _locked(path: str) -> bool:
    import fcntl

    try:
        fd = os.open(
            path,
            os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0),
        )
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def process_ending(info: ProcessInfo, fatal: list[FatalReport]) -> str | None:
    """How a journaled process ended, in one phrase; None for a process without a journal (an export)."""
    if not info.from_journal:
        return None
    if info.clean_end:
        if info.ended_by and info.ended_by.startswith("SIG"):
            return f"stopped by {info.ended_by} (clean end)"
        return f"ended by an {info.ended_by} (clean end)" if info.ended_by else "clean end"
    if info.end_unread:
        return "unknown: the journal could not be read to its end"
    if fatal:
        current = next((stack for report in fatal for stack in report.stacks if stack["current"]), None)
        thread = f" in thread {current['threads'][0]}" if current else ""
        return f"crashed: {fatal_signal(fatal[0])}{thread}"
    last = _when(info.last_record_ns)
    if still_running(info.sources):
        return f"still running (its journal is open; last record at {last})"
    return f"killed: no end record, last record at {last}"


def _when(t_ns: int | None) -> str:
    if t_ns is None:
        return "an unknown time"
    return (
        datetime.datetime.fromtimestamp(t_ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        + " UTC"
    )


def process_endings(data: TraceData) -> list[str | None]:
    """`process_ending` of every process, in `data.processes`' order."""
    return [process_ending(info, fatal_of(data, index)[0]) for index, info in enumerate(data.processes)]


def fatal_of(data: TraceData, process: int) -> tuple[list[FatalReport], int]:
    """The first copied.FATAL_REPORTS faulthandler reports of `process`, and how many more it left."""
    blocks = [block for block in data.fatal if block.process == process]
    return [parse_fatal(block) for block in blocks[: copied.FATAL_REPORTS]], max(0, len(blocks) - copied.FATAL_REPORTS)


def parse_fatal(block: FatalBlock) -> FatalReport:
    """Split faulthandler's text into its title and one entry per thread with its frames: at most
    copied.FATAL_LINES thread headers and frames, each cut at copied.LINE_CHARS."""
    lines = block.text.splitlines()
    title = next((line for line in lines if line.startswith("Fatal Python error")), lines[0] if lines else "")
    threads: list[dict] = []
    kept = left_out = 0
    for line in lines:
        header = _THREAD_HEADER.match(line)
        frame = bool(threads) and line.startswith("  ") and bool(line.strip())
        if not (header or frame):
            continue
        if kept == copied.FATAL_LINES:
            left_out += 1
            continue
        kept += 1
        if header:
            threads.append({"thread": header.group(2), "current": header.group(1) == "Current thread", "frames": []})
        else:
            threads[-1]["frames"].append(copied.cut(line.strip(), copied.LINE_CHARS))
    return FatalReport(
        block.source,
        block.line,
        copied.cut(title, copied.LINE_CHARS),
        threads,
        copied.cut(block.text, copied.FATAL_TEXT_CHARS),
        left_out,
    )
