"""Growth after the response, at one request in flight on the PyTorch engine: the request's own work
once its last output has gone (session cleanup, post-processing), as recorded on the H200
(`pt-host-after_response-1x120-*`: 1-2 MiB of host memory kept by `SessionManager.remove`).

The engine's steps are root spans of their own; when the last one ends the work goes back to nothing
of ours as well as to the request, so the interval up to the request's end has two candidates and the
rates of neither explain the change: without the response reading it falls "outside any span". The reading at the last
output (`RESPONSE_END_KEYS`) brackets what follows, where no step runs: `request.response`.
Journals built here by hand, in the shape of the recorded ones (docs/journal.md)."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest

from vlmtrace import semconv as sc
from vlmtrace.analysis.pipeline import analyze
from vlmtrace.analysis.readers.detect import read_inputs
from vlmtrace.analysis.step1_loading.column_keys import NO_SPAN

MiB = 1 << 20
MS = 1_000_000
T0 = 1_790_000_000_000_000_000
REQUESTS = 240


class _Journal:
    def __init__(self) -> None:
        self.records: list[dict] = [
            {
                "k": "header",
                "v": 2,
                "t": T0,
                "pid": 7,
                "ppid": 1,
                "host": "h",
                "seq": 0,
                "resource": {
                    "service.name": "vlm",
                    "host.name": "h",
                    "process.pid": 7,
                    sc.RESOURCE_HOST_AT_BOUNDARIES: True,
                },
                "versions": {"vlmtrace": "0.1.0", "lmdeploy": "0.18.0", "python": "3.12"},
                "argv": ["serve.py"],
            }
        ]
        self.ids = itertools.count(1)
        self.rss = 1500 * MiB

    def reading(self, t: int) -> dict:
        return {sc.MEM_HOST_RSS: int(self.rss), sc.MEM_READ_TIME: t - 20_000}

    def span(
        self,
        name: str,
        stage: str,
        start: int,
        end: int,
        parent: dict | None,
        thread: str,
        work: dict[int, float] | None = None,
        attributes: dict | None = None,
    ) -> dict:
        """A span, its records emitted in time order by `flush`; `work`: host bytes added at given times."""
        span = {
            "name": name,
            "stage": stage,
            "start": start,
            "end": end,
            "thread": thread,
            "trace_id": parent["trace_id"] if parent else f"{next(self.ids):032x}",
            "span_id": f"{next(self.ids):016x}",
            "parent_id": parent["span_id"] if parent else None,
            "work": work or {},
            "attrs": attributes or {},
        }
        return span

    def play(self, spans: list[dict], extra_events: list[tuple[int, object]]) -> None:
        events = []
        for span in spans:
            events.append((span["start"], 0, ("start", span)))
            events.append((span["end"], 2, ("end", span)))
            events += [(when, 1, ("work", amount)) for when, amount in span["work"].items()]
        events += [(when, 1, action) for when, action in extra_events]
        for t, _, (kind, payload) in sorted(events, key=lambda e: (e[0], e[1])):
            if kind == "work":
                self.rss += payload
            elif kind == "read":
                payload(self.reading(t))
            elif kind == "start":
                payload["start_reading"] = self.reading(t)
                self.records.append(
                    {
                        "k": "start",
                        "t": t,
                        "trace_id": payload["trace_id"],
                        "span_id": payload["span_id"],
                        "parent_id": payload["parent_id"],
                        "name": payload["name"],
                        "kind": "INTERNAL",
                        "thread": payload["thread"],
                        "attrs": {sc.STAGE: payload["stage"], **payload["start_reading"]},
                        "links": [],
                    }
                )
            else:
                end = self.reading(t)
                deltas = {key + sc.DELTA_SUFFIX: end[key] - payload["start_reading"][key] for key in end}
                self.records.append(
                    {
                        "k": "end",
                        "t": t,
                        "start": payload["start"],
                        "trace_id": payload["trace_id"],
                        "span_id": payload["span_id"],
                        "parent_id": payload["parent_id"],
                        "name": payload["name"],
                        "kind": "INTERNAL",
                        "status": "OK",
                        "status_message": "",
                        "attrs": {sc.STAGE: payload["stage"], **payload["attrs"], **end, **deltas},
                        "events": [],
                        "links": [],
                    }
                )

    def write(self, path: Path) -> Path:
        path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in self.records))
        return path


def _one_in_flight(path: Path, response_end_reading: bool) -> Path:
    """REQUESTS pipeline calls of one prompt: the request's prompt and vision preprocessing, a prefill
    step and a decode run (root spans on the request's thread), and 1 MiB kept after the last output;
    between calls the caller's own code churns host memory (as a driver that builds images between calls does)."""
    journal = _Journal()
    t = T0 + 10 * MS
    for index in range(REQUESTS):
        pipeline = journal.span(sc.SPAN_PIPELINE_INFER, sc.STAGE_PIPELINE, t, t + 64 * MS, None, "MainThread")
        attributes = {
            sc.GEN_AI_OPERATION_NAME: "chat",
            sc.REQUEST_IMAGES: 1,
            sc.REQUEST_IMAGE_PIXELS: 200_000 + index % 7,
            sc.GEN_AI_USAGE_INPUT_TOKENS: 80,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: 16,
        }
        request = journal.span(
            "chat tiny",
            sc.STAGE_REQUEST,
            t + 1 * MS,
            t + 63 * MS,
            pipeline,
            "Thread-2",
            work={t + 62 * MS: MiB},
            attributes=attributes,
        )
        preprocess = journal.span(
            sc.SPAN_VISION_PREPROCESS,
            sc.STAGE_VISION_PREPROCESS,
            t + 2 * MS,
            t + 20 * MS,
            request,
            "Thread-2",
            work={t + 10 * MS: 256 * 1024, t + 19 * MS: -256 * 1024},
        )
        prefill = journal.span(
            sc.SPAN_PYTORCH_FORWARD, sc.STAGE_ENGINE_FORWARD, t + 25 * MS, t + 30 * MS, None, "Thread-2"
        )
        decode = journal.span(
            sc.SPAN_PYTORCH_FORWARD,
            sc.STAGE_ENGINE_FORWARD,
            t + 31 * MS,
            t + 60 * MS,
            None,
            "Thread-2",
            work={t + 40 * MS: 64 * 1024, t + 59 * MS: -64 * 1024},
        )
        extra = []
        if response_end_reading:

            def keep(reading: dict, chat: dict = request) -> None:
                chat["attrs"].update({sc.RESPONSE_END_KEYS[key]: value for key, value in reading.items()})

            extra.append((t + 61 * MS, ("read", keep)))
        churn = 96 * 1024 if index % 2 == 0 else -64 * 1024  # the caller's code between calls, no span of ours
        extra.append((t + 66 * MS, ("work", churn)))
        journal.play([pipeline, request, preprocess, prefill, decode], extra)
        t += 70 * MS
    return journal.write(path)


def _host(path: Path):
    (verdict,) = [v for v in analyze(read_inputs([str(path)])).summary.verdicts if v.component == "host"]
    return verdict


@pytest.mark.parametrize("with_reading", [False, True])
def test_growth_after_the_response_at_one_in_flight(tmp_path: Path, with_reading: bool):
    host = _host(_one_in_flight(tmp_path / "journal.jsonl", response_end_reading=with_reading))
    assert host.klass == "host_growth", host.evidence
    assert host.slope_bytes_per_request == pytest.approx(MiB, rel=0.1)
    if with_reading:
        assert host.stage == sc.STAGE_RESPONSE, host.evidence
        assert host.evidence["stage_share"] >= 0.9
    else:  # without the response reading: the bracket holds the engine's hand-back to nothing as well
        assert host.stage != sc.STAGE_RESPONSE
        assert NO_SPAN in host.evidence["retained_by_stage"]
