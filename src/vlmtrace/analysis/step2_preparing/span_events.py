"""Which stage's work ran between two readings: a process's spans as boundary events.

Its *candidates* for an interval between consecutive readings are the stages whose work ran in it
(`SpanEvents.candidates`): the spans handed the work by the boundary events in it (a start hands it
from parent to child, an end back), the innermost working span of a thread that runs one call at a
time, and, where neither says anything, the working spans open across it (their work may run on
threads they wait for), then the containers open around it, then nothing of ours. A container (pipeline
call, request, prompt processing) suspended at an `await` while other requests run is not a candidate.
For readings far apart (the sampler's), `span_counts` counts each stage's spans instead. stages.py
splits each interval's change among its candidates; docs/analysis.md, "Where", has the why.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from vlmtrace import semconv as sc
from vlmtrace.analysis.rules import CONTAINER_SHARE
from vlmtrace.analysis.step1_loading.column_keys import NO_SPAN
from vlmtrace.analysis.step2_preparing.tables import rows_of

CONTAINER_SAMPLE = 100_000  # spans (in start order) enough to tell which stages hold others
# A boundary took the reading it carries when it is the first event to carry it, the reading is not a
# background sample's, and it was read within this of the boundary's timestamp: a live read of torch's
# counters inside a busy PyTorch engine takes 30–90 µs before the boundary's own timestamp is taken
# (docs/gpu.md).
FRESH_WINDOW_NS = 1_000_000
MAX_NESTING = 64  # spans open inside one another at one time, at most: deeper nesting is a loop in the parents

SPAN_COLUMNS = ["start_ns", "end_ns", "start_read_ns", "end_read_ns", "label", "thread", "parent"]


def _read_times(spans: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """When each span's start and end readings were taken (the boundary itself where not recorded)."""
    end = spans[sc.MEM_READ_TIME].to_numpy() if sc.MEM_READ_TIME in spans else np.full(len(spans), np.nan)
    delta = (
        spans[sc.MEM_READ_TIME + sc.DELTA_SUFFIX].to_numpy()
        if sc.MEM_READ_TIME + sc.DELTA_SUFFIX in spans
        else np.full(len(spans), np.nan)
    )
    return _recorded_or(end - delta, spans["start_ns"].to_numpy()), _recorded_or(end, spans["end_ns"].to_numpy())


def _recorded_or(recorded: np.ndarray, boundary: np.ndarray) -> np.ndarray:
    """Recorded read times where there are some, else the boundary's: in int64 (ns since the epoch do
    not fit float64 exactly, and the readings table keeps the boundaries exact)."""
    result = boundary.astype(np.int64, copy=True)
    known = np.isfinite(recorded)
    result[known] = recorded[known].astype(np.int64)
    return result


def _known_requests(spans: pd.DataFrame, requests: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The requests whose span is among `spans`, and that span's row."""
    request_rows = rows_of(spans, requests["span_id"])
    known = request_rows >= 0
    return requests[known], request_rows[known]


def with_prompt_spans(
    spans: pd.DataFrame, requests_with_prompt: pd.DataFrame, requests_with_response: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The process's spans as the attribution needs them (SPAN_COLUMNS: `label` is the stage, or the name
    of a span without one; `parent` a row number), in start order, plus one prompt-processing span per
    request that recorded where it ended (from the request's start to that reading), holding the
    request's children that started inside it, and one after-the-response span per request that
    recorded a reading at its last output (from that reading to the request's end: what the request
    does once it has answered, where the engine's steps no longer run for it). A request that recorded
    no stage detail (`detail_every`) is labelled sc.STAGE_WITHOUT_DETAIL: its vision and engine work ran
    inside it unseen, and charged to `request` it would make the request a working stage."""
    start_read, end_read = _read_times(spans)
    label = spans["stage"].astype(object).where(spans["stage"].notna(), spans["name"].astype(object))
    if sc.REQUEST_DETAIL_SKIPPED in spans:  # a request without its stages' spans: its work is a stage of its own
        label = label.where(spans[sc.REQUEST_DETAIL_SKIPPED].to_numpy() != 1, sc.STAGE_WITHOUT_DETAIL)
    table = pd.DataFrame(
        {
            "start_ns": spans["start_ns"].to_numpy(),
            "end_ns": spans["end_ns"].to_numpy(),
            "start_read_ns": start_read,
            "end_read_ns": end_read,
            "label": pd.Categorical(label.astype(str)),
            "thread": pd.Categorical(spans["thread"]) if "thread" in spans else pd.Categorical([None] * len(spans)),
            "parent": rows_of(spans, spans["parent_id"]),
        }
    )
    derived = []
    if not requests_with_prompt.empty:
        requests_with_prompt, request_rows = _known_requests(spans, requests_with_prompt)
        prompt_read = requests_with_prompt.get(
            sc.MEM_READ_TIME, pd.Series(np.nan, index=requests_with_prompt.index)
        ).to_numpy()
        prompt_end = requests_with_prompt["prompt_end_ns"].to_numpy()
        prompt_rows = len(table) + np.arange(len(request_rows))
        # The request's children that started before its prompt processing ended are prompt processing's.
        prompt_of_request = np.full(len(table), -1)
        prompt_of_request[request_rows] = prompt_rows
        end_of_request = np.full(len(table), np.iinfo(np.int64).min)
        end_of_request[request_rows] = prompt_end
        parent = table["parent"].to_numpy().copy()
        has_parent = parent >= 0
        inside = (
            has_parent
            & (prompt_of_request[np.maximum(parent, 0)] >= 0)
            & (table["start_ns"].to_numpy() < end_of_request[np.maximum(parent, 0)])
        )
        parent[inside] = prompt_of_request[parent[inside]]
        table["parent"] = parent
        derived.append(
            pd.DataFrame(
                {
                    "start_ns": table["start_ns"].to_numpy()[request_rows],
                    "end_ns": prompt_end,
                    "start_read_ns": table["start_read_ns"].to_numpy()[request_rows],
                    "end_read_ns": _recorded_or(prompt_read, prompt_end),
                    "label": pd.Categorical([sc.STAGE_PROMPT] * len(request_rows)),
                    "thread": table["thread"].to_numpy()[request_rows],
                    "parent": request_rows,
                }
            )
        )
    if requests_with_response is not None and not requests_with_response.empty:
        responded, request_rows = _known_requests(spans, requests_with_response)
        read = responded["response_end_ns"].to_numpy()
        derived.append(
            pd.DataFrame(
                {
                    "start_ns": read,
                    "end_ns": table["end_ns"].to_numpy()[request_rows],
                    "start_read_ns": read,
                    "end_read_ns": table["end_read_ns"].to_numpy()[request_rows],
                    "label": pd.Categorical([sc.STAGE_RESPONSE] * len(request_rows)),
                    "thread": table["thread"].to_numpy()[request_rows],
                    "parent": request_rows,
                }
            )
        )
    if derived:  # after the spans, in this order: the prompt rows are numbered from len(table) above
        table = pd.concat([table, *derived], ignore_index=True)
        table["label"] = table["label"].astype("category")
        table["thread"] = table["thread"].astype("category")
    order = np.argsort(table["start_ns"].to_numpy(), kind="stable")
    new_row = np.empty(len(order), dtype=np.int64)
    new_row[order] = np.arange(len(order))
    table = table.iloc[order].reset_index(drop=True)
    parent = table["parent"].to_numpy()
    table["parent"] = np.where(parent >= 0, new_row[np.maximum(parent, 0)], -1)
    return table


def _stage_codes(spans: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Each span's stage as a small integer code (int32: a million spans' codes are held twice as events),
    and the names."""
    codes, names = pd.factorize(spans["label"])
    return codes.astype(np.int32), [str(name) for name in names]


def _containers(parents: np.ndarray, codes: np.ndarray, count: int) -> np.ndarray:
    """Stages whose spans mostly have children (pipeline, request, prompt processing): they hold work
    more than they do it. Spans are in start order, so a leading stretch holds whole traces."""
    head = parents[:CONTAINER_SAMPLE]
    has_child = np.zeros(len(head), dtype=bool)
    has_child[head[(head >= 0) & (head < len(head))]] = True
    head_codes = codes[:CONTAINER_SAMPLE]
    with_child = np.bincount(head_codes, weights=has_child, minlength=count)
    return with_child >= CONTAINER_SHARE * np.bincount(head_codes, minlength=count)


def _interval_of(times: np.ndarray, instants: np.ndarray) -> np.ndarray:
    """The interval between consecutive `times` that holds each instant (−1 before the first), in int32:
    two million events' positions are 8 MB less each."""
    interval = np.searchsorted(times, instants, "right").astype(np.int32)
    interval -= 1
    return interval


def _open_stages(
    codes: np.ndarray, chosen: np.ndarray, starts: np.ndarray, ends: np.ndarray, left: np.ndarray, right: np.ndarray
) -> np.ndarray:
    """(interval × stage) whether a span of each chosen stage was open in the interval (left, right]."""
    result = np.zeros((len(left), int(chosen.sum())), dtype=bool)
    for column, code in enumerate(np.flatnonzero(chosen)):
        mine = codes == code
        opened = np.searchsorted(np.sort(starts[mine]), right, "left")
        closed = np.searchsorted(np.sort(ends[mine]), left, "right")
        result[:, column] = opened > closed
    return result


def _enclosing(starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """For spans in start order: each one's innermost enclosing span (−1), or None when they do not nest
    properly (one inside another or one after another, as on a thread that runs one call at a time; an
    event loop's tasks interleave theirs). Decided on the first CONTAINER_SAMPLE spans."""
    enclosing = np.full(len(starts), -1, dtype=np.int32)
    open_rows: list[int] = []
    end_list = ends.tolist()
    for row, start in enumerate(starts.tolist()):
        while open_rows and end_list[open_rows[-1]] <= start:
            open_rows.pop()
        if open_rows and row < CONTAINER_SAMPLE and end_list[open_rows[-1]] < end_list[row]:
            return None
        enclosing[row] = open_rows[-1] if open_rows else -1
        open_rows.append(row)
    return enclosing


def _innermost_open(times: np.ndarray, starts: np.ndarray, ends: np.ndarray, enclosing: np.ndarray) -> np.ndarray:
    """For properly nested spans in start order: the index of the innermost one open at each time (−1)."""
    owner = _interval_of(starts, times)
    for _ in range(MAX_NESTING):
        closed = owner >= 0
        closed[closed] = ends[owner[closed]] <= times[closed]
        if not closed.any():
            break
        owner[closed] = enclosing[owner[closed]]
    return owner


class SpanEvents:
    """A process's spans as boundary events, prepared once; `candidates` places them on a series of
    readings (docs/analysis.md, "Where"). `spans` in start order, with SPAN_COLUMNS."""

    def __init__(self, spans: pd.DataFrame, sample_read_ns: np.ndarray | None = None) -> None:
        """`sample_read_ns`: when the background samples were read (a boundary that carries one reused it)."""
        self.spans = spans
        self.codes, names = _stage_codes(spans)
        self.names = [*names, NO_SPAN]
        stage_count = len(names)
        parent_row = spans["parent"].to_numpy()
        has_parent = parent_row >= 0
        parent_row = np.where(has_parent, parent_row, 0)
        self.container = _containers(spans["parent"].to_numpy(), self.codes, stage_count)
        if sc.STAGE_PROMPT in names:
            self.container[names.index(sc.STAGE_PROMPT)] = True
        self.starts, self.ends = spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()
        parent_code = np.where(has_parent, self.codes[parent_row], stage_count)
        self.event_times = np.concatenate([self.starts, self.ends])
        self.read_times = np.concatenate([spans["start_read_ns"].to_numpy(), spans["end_read_ns"].to_numpy()])
        # The event that took a reading is the earliest of those that have it; the later ones reused it.
        first_user = pd.Series(self.event_times).groupby(self.read_times // 1000).transform("min").to_numpy()
        self.took_reading = (first_user == self.event_times) & (self.read_times >= self.event_times - FRESH_WINDOW_NS)
        del first_user  # two million events: what is held while the threads below are prepared counts
        if sample_read_ns is not None and len(sample_read_ns):
            self.took_reading &= ~np.isin(self.read_times, sample_read_ns)
        # Events are the starts, then the ends: a start hands the work from the parent to the span, an end back.
        self.after_code = np.concatenate([self.codes, parent_code])
        self.before_code = np.concatenate([parent_code, self.codes])
        del parent_code
        # A child that starts with its parent (prompt processing opens with the request) takes over at
        # once: the parent runs neither after its start nor before its child's.
        with_parent = has_parent & (self.starts[parent_row] == self.starts)
        handed_on = np.zeros(len(spans), dtype=bool)
        handed_on[parent_row[with_parent]] = True
        # Likewise a child that ends with its parent (the request's work after the response ends with
        # the request): the parent runs neither before its end nor after its child's.
        ends_with_parent = has_parent & (self.ends[parent_row] == self.ends)
        handed_back = np.zeros(len(spans), dtype=bool)
        handed_back[parent_row[ends_with_parent]] = True
        self.after_ok = np.concatenate([~handed_on, ~ends_with_parent])
        self.before_ok = np.concatenate([~with_parent, ~handed_back])
        self.threads = self._sequential_threads(~self.container)
        self.unseen = np.array([name == sc.STAGE_WITHOUT_DETAIL for name in names], dtype=bool)
        self._last: tuple[np.ndarray, np.ndarray] | None = None

    def _sequential_threads(self, working: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Threads that run one call at a time: their spans' rows, stage codes where the span does work
        itself (−1 for a container: a pipeline call on the main thread mostly waits for its children on
        another thread, and its own code shows by its events), and each span's enclosing span."""
        found = []
        threads = self.spans["thread"].cat.codes.to_numpy()
        for thread in np.unique(threads[threads >= 0]):
            rows = np.flatnonzero(threads == thread)
            enclosing = _enclosing(self.starts[rows], self.ends[rows]) if len(rows) >= 2 else None
            if enclosing is None:
                continue
            codes = self.codes[rows]
            found.append((rows, np.where(working[codes], codes, -1), enclosing))
        return found

    def candidates(self, times: np.ndarray) -> np.ndarray:
        """Boolean table (interval between consecutive reading `times` × stage, the last column
        `NO_SPAN`) of the stages whose work ran in each interval.

        A boundary event hands the work from one span to another: a span's start from its parent to it,
        its end back to the parent (to nothing, for a root). The span that ran *after* an event ran in
        the interval holding the event; the one that ran *before* it, in the interval before the event's
        own reading when that reading was taken there, else in the same interval (a reused reading). A
        thread that runs one call at a time (a vision worker) runs its innermost open span all along. An
        interval with none of these was run by the working spans open across it (their work may run on
        threads they wait for), else by the containers open around it, else by nothing of ours. A request
        without stage detail open across an interval is always among its candidates."""
        if self._last is not None and np.array_equal(self._last[0], times):
            return self._last[1]  # tensor and reserved are read together: one series
        intervals = len(times) - 1
        ran = np.zeros((intervals, len(self.names)), dtype=bool)
        during = _interval_of(times, self.event_times)
        reading = _interval_of(times, self.read_times)
        at_reading = times[np.clip(reading, 0, len(times) - 1)] == self.read_times
        before = np.where(at_reading & self.took_reading, reading - 1, during)
        for interval, code, ok in (
            (during, self.after_code, self.after_ok),
            (before, self.before_code, self.before_ok),
        ):
            valid = ok & (interval >= 0) & (interval < intervals)
            ran[interval[valid], code[valid]] = True
        left, right = times[:-1], times[1:]
        middle = left // 2 + right // 2
        for rows, codes, enclosing in self.threads:
            owner = _innermost_open(middle, self.starts[rows], self.ends[rows], enclosing)
            stage = np.where(owner >= 0, codes[np.maximum(owner, 0)], -1)
            running = stage >= 0
            ran[np.flatnonzero(running), stage[running]] = True
        if self.unseen.any():  # a request without stage detail may have worked unseen in any interval it was open
            ran[:, np.flatnonzero(self.unseen)] |= _open_stages(
                self.codes, self.unseen, self.starts, self.ends, left, right
            )
        for fallback in (~self.container, self.container):
            idle = np.flatnonzero(~ran.any(axis=1))
            if len(idle):
                ran[np.ix_(idle, np.flatnonzero(fallback))] = _open_stages(
                    self.codes, fallback, self.starts, self.ends, left[idle], right[idle]
                )
        ran[~ran.any(axis=1), len(self.names) - 1] = True
        self._last = (times, ran)
        return ran


def span_counts(times: np.ndarray, events: SpanEvents) -> np.ndarray:
    """For readings far apart (the sampler's): how many requests' worth of each stage have their
    midpoint in each interval, the last column counting intervals with none. A per-request cause then
    scales with its stage's count, and the intervals that cut between a request's stages tell the
    stages apart. A stage with several spans per request (the PyTorch engine's steps) counts each as
    its share of a request: counted whole, 30 steps a request outweighed the one span of the stage that
    did the damage (docs/analysis.md, "Where")."""
    middle = (events.starts // 2) + (events.ends // 2)
    interval = np.searchsorted(times, middle, "right") - 1
    valid = (interval >= 0) & (interval < len(times) - 1)
    stages = len(events.names) - 1
    per_span = np.ones(stages)
    if sc.STAGE_REQUEST in events.names:
        spans = np.bincount(events.codes, minlength=stages).astype(float)
        requests = spans[events.names.index(sc.STAGE_REQUEST)]
        if requests > 0:
            per_span = np.where(spans > requests, requests / np.maximum(spans, 1), 1.0)
    counts = np.zeros((len(times) - 1, len(events.names)))
    np.add.at(counts, (interval[valid], events.codes[valid]), per_span[events.codes[valid]])
    counts[:, -1] = ~counts[:, :-1].any(axis=1)
    return counts
