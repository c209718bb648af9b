"""A span's two memory readings: written apart on the request path, merged the same way by the
journal reader and onto the SDK span at its end (docs/journal.md)."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.export.journal_lines import of_kind, read_journal_file
from tests.export.test_journal_records import open_writer
from vlmtrace import semconv as sc
from vlmtrace.analysis.readers.journal import read_journal
from vlmtrace.config import Options
from vlmtrace.export.journal import records
from vlmtrace.export.journal.records import Later
from vlmtrace.export.recorder import SpanRecorder
from vlmtrace.instrumentation.runtime import Telemetry
from vlmtrace.probes.memory import Reading

AT_START = {sc.MEM_HOST_RSS: 100, sc.MEM_GPU_TOTAL: 80, sc.MEM_TORCH_ALLOCATED: 7}
AT_END = {sc.MEM_HOST_RSS: 160, sc.MEM_GPU_TOTAL: 80}  # torch went unreadable: no value, no delta


class Readings:
    """A span read at two moments, then a span that starts and ends on one shared reading (a sample)."""

    stage_tags = None  # no heap counter preloaded

    def __init__(self) -> None:
        shared = Reading(2, AT_END)
        self._readings = iter([Reading(0, AT_START), Reading(1, AT_END), shared, shared])

    def read(self) -> Reading:
        return next(self._readings)


def test_readings_are_written_apart_and_merged_alike_by_the_reader_and_the_export(tmp_path):
    writer = open_writer(tmp_path / "j")
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(SpanRecorder(writer, provider.get_tracer("vlmtrace")), Readings(), Options())

    # the token count as the vision layer gives it: worked out where the record is encoded and the SDK span ends
    telemetry.start("work", "vision.preprocess", {"vlmtrace.vision.images": 2}, context=Context()).end(
        {"vlmtrace.vision.tokens": Later(sum, [50, 4])}
    )
    telemetry.start("steady", "engine.stream", context=Context()).end()
    writer.close()

    records, _ = read_journal_file(writer.path)
    start, _ = of_kind(records, "start")
    end, steady_end = of_kind(records, "end")
    assert start["mem"] == AT_START and not any(key.startswith("vlmtrace.mem.") for key in start["attrs"])
    assert (end["mem0"], end["mem"]) == (AT_START, AT_END)
    assert steady_end["mem"] == steady_end["mem0"] == AT_END
    # One reading at both ends: written once, on the start record; the end record leaves both out.
    raw_steady_end = json.loads(Path(writer.path).read_bytes().splitlines()[-2])
    assert raw_steady_end["k"] == "end" and "mem" not in raw_steady_end and "mem0" not in raw_steady_end
    assert end["attrs"] == {sc.STAGE: "vision.preprocess", "vlmtrace.vision.images": 2, "vlmtrace.vision.tokens": 54}

    merged = {sc.MEM_HOST_RSS: 160, sc.MEM_HOST_RSS + sc.DELTA_SUFFIX: 60, sc.MEM_GPU_TOTAL: 80}
    unchanged = {sc.MEM_HOST_RSS: 160, sc.MEM_HOST_RSS + sc.DELTA_SUFFIX: 0, sc.MEM_GPU_TOTAL: 80}
    exported, steady = exporter.get_finished_spans()
    assert {k: v for k, v in exported.attributes.items() if k.startswith("vlmtrace.mem.")} == merged
    assert {k: v for k, v in steady.attributes.items() if k.startswith("vlmtrace.mem.")} == unchanged
    assert exported.attributes["vlmtrace.vision.tokens"] == 54

    frame = read_journal([writer.path]).spans.finish()
    row, steady_row = frame.iloc[0], frame.iloc[1]
    assert row[sc.MEM_HOST_RSS] == 160 and row[sc.MEM_HOST_RSS + sc.DELTA_SUFFIX] == 60
    assert row[sc.MEM_TORCH_ALLOCATED] != row[sc.MEM_TORCH_ALLOCATED]  # absent at end: NaN, not the start value
    assert steady_row[sc.MEM_HOST_RSS + sc.DELTA_SUFFIX] == 0


def test_a_value_worked_out_off_the_request_path_that_fails_is_left_empty_not_raised():
    def broken() -> int:
        raise RuntimeError("a tensor freed under us")

    line = records.encode({"attrs": {"tokens": Later(broken), "past_64_bits": Later(lambda: 1 << 70)}})
    assert json.loads(line) == {"attrs": {"tokens": None, "past_64_bits": str(1 << 70)}}
