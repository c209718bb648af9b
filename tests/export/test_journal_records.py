"""The journal's records, as docs/journal.md specifies them, written through the real OpenTelemetry SDK."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tests.export.journal_lines import journal_files, of_kind, read_journal_file, records_of
from vlmtrace import semconv
from vlmtrace.export.journal import FORMAT_VERSION, JournalSpanProcessor, JournalWriter
from vlmtrace.export.journal import writer as journal_writer
from vlmtrace.export.journal.redaction import REDACTED, redacted_argv


def open_writer(target, **overrides) -> JournalWriter:
    settings = {
        "max_bytes": 64 * 1024 * 1024,
        "max_files": 8,
        "resource": {"service.name": "lmdeploy", "process.pid": os.getpid()},
        "versions": {"vlmtrace": "0.1.0", "lmdeploy": "0.18.0", "torch": None},
    }
    settings.update(overrides)
    writer = JournalWriter.open(str(target), **settings)
    assert writer is not None
    return writer


def traced(writer: JournalWriter) -> TracerProvider:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(JournalSpanProcessor(writer))
    return provider


def test_header_describes_the_process(tmp_path):
    writer = open_writer(tmp_path / "j")
    writer.close()

    records, rest = read_journal_file(writer.path)
    header = records[0]
    assert rest == ""
    assert header["k"] == "header"
    assert header["v"] == FORMAT_VERSION == 3
    assert header["mem_keys"] == list(semconv.JOURNAL_MEM_KEYS)  # the order of a reading written as an array
    assert header["pid"] == os.getpid()
    assert header["ppid"] == os.getppid()
    assert header["host"] == socket.gethostname()
    assert header["seq"] == 0
    assert header["resource"] == {"service.name": "lmdeploy", "process.pid": os.getpid()}
    assert header["versions"] == {"vlmtrace": "0.1.0", "lmdeploy": "0.18.0"}  # absent values omitted
    assert header["argv"] == redacted_argv(sys.argv)  # pytest's own command line, secrets (and -p values) redacted
    assert header["argv"][0] == sys.argv[0]
    assert abs(header["t"] - time.time_ns()) < 60 * 10**9


def test_span_start_and_end_records_carry_ids_times_kind_thread_and_attributes(tmp_path):
    writer = open_writer(tmp_path / "j")
    tracer = traced(writer).get_tracer("test")
    seen = {}

    def request_thread():
        with tracer.start_as_current_span(
            "chat tiny-vl",
            kind=SpanKind.SERVER,
            attributes={
                semconv.STAGE: semconv.STAGE_REQUEST,
                semconv.GEN_AI_REQUEST_MODEL: "tiny-vl",
                semconv.MEM_TORCH_ALLOCATED: 1_000_000,
                semconv.MEM_DEVICES: (0, 1),
            },
        ) as request:
            with tracer.start_as_current_span(
                "lmdeploy.vision.preprocess", links=[Link(request.get_span_context())]
            ) as vision:
                vision.set_attribute(semconv.VISION_IMAGE_WIDTHS, (640, 1024))
                vision.add_event("slice", {"vlmtrace.vision.pixels": 655360})
                vision.set_status(Status(StatusCode.ERROR, "image too large"))
                seen["vision"] = vision.get_span_context()
            request.set_attribute(semconv.MEM_TORCH_ALLOCATED, 3_000_000)
            seen["request"] = request.get_span_context()

    thread = threading.Thread(target=request_thread, name="lmdeploy-loop")
    thread.start()
    thread.join()
    writer.close()

    records = records_of(tmp_path / "j")
    starts = {r["name"]: r for r in of_kind(records, "start")}
    ends = {r["name"]: r for r in of_kind(records, "end")}
    request_id = f"{seen['request'].span_id:016x}"
    trace_id = f"{seen['request'].trace_id:032x}"

    request_start = starts["chat tiny-vl"]
    assert request_start["trace_id"] == trace_id
    assert request_start["span_id"] == request_id
    assert request_start["parent_id"] is None
    assert request_start["kind"] == "SERVER"
    assert request_start["thread"] == "lmdeploy-loop"
    assert request_start["attrs"][semconv.MEM_TORCH_ALLOCATED] == 1_000_000  # the reading at start
    assert request_start["attrs"][semconv.MEM_DEVICES] == [0, 1]  # tuples become lists
    assert request_start["links"] == []

    request_end = ends["chat tiny-vl"]
    assert request_end["attrs"][semconv.MEM_TORCH_ALLOCATED] == 3_000_000  # the reading at end
    assert request_end["start"] == request_start["t"] < request_end["t"]
    assert request_end["status"] == "UNSET"

    vision_start, vision_end = starts["lmdeploy.vision.preprocess"], ends["lmdeploy.vision.preprocess"]
    assert vision_start["parent_id"] == request_id
    assert vision_start["kind"] == "INTERNAL"
    assert vision_start["links"] == [{"trace_id": trace_id, "span_id": request_id}]
    assert vision_end["span_id"] == f"{seen['vision'].span_id:016x}"
    assert vision_end["attrs"] == {semconv.VISION_IMAGE_WIDTHS: [640, 1024]}
    assert vision_end["status"] == "ERROR"
    assert vision_end["status_message"] == "image too large"
    assert [(e["name"], e["attrs"]) for e in vision_end["events"]] == [("slice", {"vlmtrace.vision.pixels": 655360})]
    assert vision_start["t"] <= vision_end["events"][0]["t"] <= vision_end["t"]
    assert vision_end["links"] == vision_start["links"]
    # every start precedes its end in the file
    order = [(r["k"], r["name"]) for r in records if r["k"] in ("start", "end")]
    assert order == [
        ("start", "chat tiny-vl"),
        ("start", "lmdeploy.vision.preprocess"),
        ("end", "lmdeploy.vision.preprocess"),
        ("end", "chat tiny-vl"),
    ]


def test_samples_and_warnings(tmp_path):
    writer = open_writer(tmp_path / "j")
    writer.write_sample(123, {semconv.MEM_GPU_USED: 5 << 30, semconv.MEM_GPU_PROCESS + ".per_device": (1, 2)})
    writer.warn("nvml", "NVML is not available")
    writer.warn("nvml", "NVML is not available")
    writer.warn("torch", "CUDA not initialised")
    writer.close()

    records = records_of(tmp_path / "j")
    assert of_kind(records, "sample") == [
        {
            "k": "sample",
            "t": 123,
            "attrs": {semconv.MEM_GPU_USED: 5 << 30, semconv.MEM_GPU_PROCESS + ".per_device": [1, 2]},
        }
    ]
    assert [(w["source"], w["message"]) for w in of_kind(records, "warning")] == [
        ("nvml", "NVML is not available"),
        ("torch", "CUDA not initialised"),
    ]


def test_dropped_records_are_rate_limited_and_the_final_total_is_written_at_close(tmp_path):
    writer = open_writer(tmp_path / "j")
    for total in (3, 10, 25):
        writer.note_dropped(total)
    writer.close()

    records = records_of(tmp_path / "j")
    dropped = of_kind(records, "dropped")
    assert [d["otlp_spans"] for d in dropped] == [3, 25]  # the first at once, the rest held back, the total at close
    assert all(d["journal_records"] == 0 for d in dropped)
    assert records[-2]["k"] == "dropped" and records[-1]["k"] == "end_marker"


class LaterClock:
    """The time module as the writer sees it, with its monotonic clock moved on by `ahead_ns`."""

    def __init__(self) -> None:
        self.ahead_ns = 0

    def __getattr__(self, name: str):
        return getattr(time, name)

    def monotonic_ns(self) -> int:
        return time.monotonic_ns() + self.ahead_ns


def test_a_pending_dropped_record_is_written_by_the_maintenance_step_after_a_second(tmp_path, monkeypatch):
    clock = LaterClock()
    monkeypatch.setattr(journal_writer, "time", clock)
    writer = open_writer(tmp_path / "j")
    writer.note_dropped(1)
    writer.note_dropped(7)
    writer.write_sample(1, {})
    writer.maintain()  # within the second: still held back
    clock.ahead_ns = 1_000_000_000
    writer.write_sample(2, {})
    writer.maintain()
    assert writer.flush()
    records = records_of(tmp_path / "j")
    writer.close()

    kinds = [(r["k"], r.get("otlp_spans")) for r in records[1:]]
    assert kinds == [("dropped", 1), ("sample", None), ("sample", None), ("dropped", 7)]


def test_end_marker_counts_spans_and_close_is_idempotent(tmp_path):
    writer = open_writer(tmp_path / "j")
    tracer = traced(writer).get_tracer("test")
    with tracer.start_as_current_span("outer"), tracer.start_as_current_span("inner"):
        pass
    in_flight = tracer.start_span("never ended")
    writer.close(clean=True)
    writer.close(clean=True)
    writer.write_sample(5, {"ignored": 1})
    writer.warn("late", "ignored")
    in_flight.end()

    records = records_of(tmp_path / "j")
    markers = of_kind(records, "end_marker")
    assert len(markers) == 1
    assert markers[0]["clean"] is True
    assert markers[0]["spans_started"] == 3
    assert markers[0]["spans_ended"] == 2
    assert records[-1] is markers[0]


def test_values_json_cannot_hold_natively_are_written_as_strings(tmp_path):
    writer = open_writer(tmp_path / "j")
    writer.write_sample(1, {"huge": 2**70, "bytes": b"\x01"})
    writer.close()

    sample = of_kind(records_of(tmp_path / "j"), "sample")[0]
    assert sample["attrs"] == {"huge": str(2**70), "bytes": str(b"\x01")}


def test_concurrent_writers_produce_whole_lines_across_rotations(tmp_path):
    writer = open_writer(tmp_path / "j", max_bytes=64 * 1024, max_files=1000)
    threads_count, per_thread = 8, 2000

    def write_many(index):
        for i in range(per_thread):
            writer.write_sample(i, {"thread": index, "i": i, "pad": "x" * 40})

    threads = [threading.Thread(target=write_many, args=(n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()

    records = records_of(tmp_path / "j")  # fails on any torn line
    samples = of_kind(records, "sample")
    assert len(samples) == threads_count * per_thread
    for index in range(threads_count):
        assert [s["attrs"]["i"] for s in samples if s["attrs"]["thread"] == index] == list(range(per_thread))
    headers = of_kind(records, "header")
    assert len(headers) > 20
    assert [h["seq"] for h in headers] == list(range(len(headers)))
    for path in journal_files(tmp_path / "j"):  # rotation keeps up: at most a few records past the limit
        assert os.path.getsize(path) < 64 * 1024 + 4096


def test_the_header_keeps_secrets_on_the_command_line_out_of_the_journal(tmp_path, monkeypatch):
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "lmdeploy",
            "serve",
            "api_server",
            "model",
            "--api-keys",
            "sk-one",
            "sk-two",
            "--server-port",
            "23333",
            "--hf-token=hf_abc",
            "--PASSWORD",
            "hunter2",
            "--tp",
            "-1",
            "OPENAI_API_KEY=sk-three",
            "sk-four",
            "--session-len=4096",
            "--secret-file",
            "/run/secret",
        ],
    )
    writer = open_writer(tmp_path / "j")
    writer.close()

    header = records_of(tmp_path / "j")[0]
    assert header["argv"] == [
        "lmdeploy",
        "serve",
        "api_server",
        "model",
        "--api-keys",
        REDACTED,
        REDACTED,
        "--server-port",
        "23333",
        f"--hf-token={REDACTED}",
        "--PASSWORD",
        REDACTED,
        "--tp",
        "-1",
        f"OPENAI_API_KEY={REDACTED}",
        REDACTED,
        "--session-len=4096",
        "--secret-file",
        REDACTED,
    ]
    with open(writer.path, "rb") as journal:
        text = journal.read()
    assert b"sk-" not in text and b"hunter2" not in text and b"hf_abc" not in text


def test_with_sync_each_record_is_in_the_file_when_the_call_returns(tmp_path):
    writer = open_writer(tmp_path / "j", sync=True)
    writer.write_sample(1, {"at": "once"})

    assert of_kind(read_journal_file(writer.path)[0], "sample") == [{"k": "sample", "t": 1, "attrs": {"at": "once"}}]
    writer.close()


def test_queued_records_are_in_the_file_after_flush_and_in_order(tmp_path):
    writer = open_writer(tmp_path / "j")
    tracer = traced(writer).get_tracer("test")
    for i in range(50):
        with tracer.start_as_current_span(f"span {i}"):
            writer.write_sample(i, {"i": i})

    assert writer.flush()
    records = read_journal_file(writer.path)[0]
    assert [r["name"] for r in of_kind(records, "start")] == [f"span {i}" for i in range(50)]
    assert [r["k"] for r in records[1:4]] == ["start", "sample", "end"]
    writer.close()


def test_a_span_record_without_the_recorders_fields_is_written_as_given_not_dropped(tmp_path):
    # A start and end of format 1's shape (memory readings among the attributes, no `mem`): the compact
    # encoder cannot take them apart, so they are written whole, and the end needs no remembered start.
    writer = open_writer(tmp_path / "j")
    start = {"k": "start", "t": 10, "trace_id": "ab" * 16, "span_id": "cd" * 8, "parent_id": None, "name": "chat m"}
    start["attrs"] = {semconv.STAGE: semconv.STAGE_REQUEST, semconv.MEM_HOST_RSS: 1 << 30}
    end = {**start, "k": "end", "t": 20, "start": 10, "status": "OK"}
    end["attrs"] = {semconv.STAGE: semconv.STAGE_REQUEST, semconv.MEM_HOST_RSS: 2 << 30}
    writer.write_span_start(start)
    writer.write_span_end(end)
    writer.close()

    records = records_of(tmp_path / "j")
    (start_read,), (end_read,) = of_kind(records, "start"), of_kind(records, "end")
    assert {key: start_read[key] for key in start} == start  # the reader adds the defaults left out
    assert {key: end_read[key] for key in end} == end
    assert "dropped" not in {record["k"] for record in records}
