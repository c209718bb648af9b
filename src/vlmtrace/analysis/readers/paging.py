"""Every trace of a search, page by page, in time windows.

A trace search (Jaeger API v3 and v1, Tempo) answers at most `n` traces of a time window, chosen as its
store likes (the last received, at random), and offers no cursor. So a window whose answer
is full may hold more: it is split and each part asked again. A window whose answer is not full holds no
other trace. Windows are read newest first, and a pull stops at the first bound it meets (a trace count,
bytes, the time of a response, a failed request), so what was read is every trace between two times: a
stretch of the run, never traces scattered over it, whose per-request rates are that stretch's.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection
from typing import Any

MAX_PARTS = 16


@dataclasses.dataclass
class Page:
    """One answer: each trace it holds with its earliest span start (ns), and the answer itself."""

    starts: dict[str, int]
    body: Any = None


class Cut(Exception):
    """A bound stopped the pull: `bound` is "limit" (the user's --limit: a sample), "count" (more traces in one
    window than a page holds), "bytes", "time" or "error"."""

    def __init__(self, bound: str, reason: str) -> None:
        super().__init__(reason)
        self.bound = bound
        self.reason = reason


@dataclasses.dataclass
class Paged:
    read: dict[str, int]  # the traces kept, with their starts
    matched: int  # the traces the search was seen to match, read or not: all of them where `bound` is None
    pages: int
    bound: str | None = None
    reason: str | None = None

    @property
    def complete(self) -> bool:
        return self.bound is None


Ask = Callable[[int, int, int], Page]  # (window start, window end, most traces) -> the answer
Keep = Callable[[Page, Collection[str]], None]  # read these traces (one or more) of the answer


def page_through(
    ask: Ask, keep: Keep, start_ns: int, end_ns: int, page: int, limit: int | None, resolution_ns: int
) -> Paged:
    """Ask for [start_ns, end_ns] (both ends included, in whole `resolution_ns`) `page` traces at a time,
    newest window first, keeping at most `limit` traces (the newest)."""
    start_ns -= start_ns % resolution_ns
    end_ns += -end_ns % resolution_ns
    pending = [(start_ns, end_ns, 2)]
    seen: set[str] = set()
    paged = Paged({}, 0, 0)
    try:
        while pending:
            low, high, parts = pending[-1]
            answer = ask(low, high, page)
            paged.pages += 1
            seen.update(answer.starts)
            pending.pop()
            if len(answer.starts) >= page:
                windows = split(low, high, answer.starts.values(), resolution_ns, parts)
                if not windows:
                    pending.append((low, high, parts))
                    raise Cut("count", f"more than {page} traces start within one window of {resolution_ns} ns")
                pending.extend(windows)
                continue
            new = {trace: start for trace, start in answer.starts.items() if trace not in paged.read}
            if limit is not None and len(paged.read) + len(new) >= limit:
                newest = sorted(new.items(), key=lambda item: -item[1])[: limit - len(paged.read)]
                keep(answer, [trace for trace, _ in newest])
                paged.read.update(newest)
                if len(newest) < len(new) or _more_in(ask, pending, seen, paged):
                    raise Cut("limit", f"--limit {limit}")
                break
            if new:
                keep(answer, new.keys())
            paged.read.update(new)
    except Cut as cut:
        paged.bound, paged.reason = cut.bound, cut.reason
    paged.matched = len(seen | paged.read.keys())
    return paged


def _more_in(ask: Ask, pending: list[tuple[int, int, int]], seen: set[str], paged: Paged) -> bool:
    """Whether the windows not read hold a trace not read (one more request, for one trace)."""
    if not pending:
        return False
    if seen - paged.read.keys():
        return True
    answer = ask(min(window[0] for window in pending), max(window[1] for window in pending), 1)
    paged.pages += 1
    seen.update(answer.starts)
    return bool(seen - paged.read.keys())


def split(low: int, high: int, starts: Collection[int], resolution_ns: int, parts: int) -> list[tuple[int, int, int]]:
    """A full window `[low, high]` in windows, oldest first, sharing their ends (a trace starting on one is in
    both and read once), each with the number of parts it is split into if its answer is full too; [] where
    the window is one `resolution_ns` wide.

    The page's starts cut `[earliest start, high]` into `parts` windows holding equal shares of them, and
    `[low, earliest start]` is the rest. A store that answers the newest traces first gets windows of a
    fraction of a page, and the rest is read alike; one that answers at random gets windows of equal shares
    of the traces, whatever their spread in time. A share that comes back full again was cut from too thin
    a sample of a dense window: it is cut into twice as many parts (MAX_PARTS at most)."""
    ordered = sorted(min(max(start, low), high) for start in starts)

    def on_grid(moment: int) -> int:
        return moment - (moment - low) % resolution_ns

    cuts = sorted({on_grid(ordered[len(ordered) * i // parts]) for i in range(parts)} | {low, high})
    windows = list(itertools.pairwise(cuts))
    if len(windows) < 2:  # every start in one grid step: halves
        steps = (high - low) // resolution_ns
        if steps < 2:
            return []
        windows = [(low, low + steps // 2 * resolution_ns), (low + steps // 2 * resolution_ns, high)]
    rest = on_grid(ordered[0]) > low
    return [(first, last, parts if rest and first == low else min(2 * parts, MAX_PARTS)) for first, last in windows]
