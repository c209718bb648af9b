"""LMDeploy 0.18's real pipeline (stand-in TurboMind on the CPU), instrumented journal-only: its journal is
written in format 3 (compact end records, readings as arrays, attribute names as the header's indices) and read back as the same spans and samples
as the same records written out whole in format 2."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from lmdeploy import GenerationConfig

import vlmtrace
from tests.export.journal_lines import journal_files
from tests.instrumentation.conftest import image, standin_engines  # noqa: F401 - fixture
from tests.support.cpu_lmdeploy import standin_pipeline
from vlmtrace import semconv as sc
from vlmtrace.analysis.readers.compact_records import FullRecords
from vlmtrace.analysis.readers.detect import read_inputs

GEN = GenerationConfig(max_new_tokens=4, top_k=1)
CALLS, PROMPTS = 4, 3


@pytest.mark.lmdeploy
def test_a_served_pipelines_format3_journal_reads_back_as_format2_would(standin_engines, tmp_path):  # noqa: F811
    journal = tmp_path / "journal"
    vlmtrace.instrument(journal=str(journal), sample_interval_ms=20)  # no tracer provider: the journal only
    try:
        pipe = standin_pipeline()
        for call in range(CALLS):
            pipe(
                [("describe this image", image(64 + 8 * i, 48, call * PROMPTS + i)) for i in range(PROMPTS)],
                gen_config=GEN,
            )
        pipe.close()
    finally:
        vlmtrace.uninstrument()

    (path,) = journal_files(journal)
    raw = [orjson.loads(line) for line in Path(path).read_bytes().splitlines()]
    assert raw[0]["v"] == 3 and raw[0]["mem_keys"] == list(sc.JOURNAL_MEM_KEYS)
    assert raw[0]["attr_keys"] == list(sc.JOURNAL_ATTR_KEYS)
    starts = [record for record in raw if record["k"] == "start"]
    ends = [record for record in raw if record["k"] == "end"]
    assert len(starts) == len(ends) > CALLS * PROMPTS * 3
    # Every end's start is in the file: each end leaves out the start's ids, name and start time.
    assert not any({"trace_id", "name", "start", "kind"} & record.keys() for record in ends)
    assert all(type(record["mem"]) is list for record in starts)  # host RSS and read time, as an array
    assert all(type(record["mem"]) is list for record in raw if record["k"] == "sample")
    # vlmtrace's own attribute names are written as their index in the header's list, never in full.
    assert all(key.isdigit() for record in starts for key in record["attrs"])
    assert (
        sum(record["attrs"].get(str(sc.JOURNAL_ATTR_KEYS.index(sc.STAGE))) == sc.STAGE_REQUEST for record in starts)
        == CALLS * PROMPTS
    )

    full = FullRecords()
    whole = [full.full(record) for record in raw]
    assert None not in whole
    format2 = tmp_path / "format2.jsonl"
    assert all(sc.STAGE in record["attrs"] for record in whole if record["k"] == "end")
    header = {key: value for key, value in whole[0].items() if key not in ("mem_keys", "attr_keys")}
    format2.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in [{**header, "v": 2}, *whole[1:]]))

    compact, written_whole = read_inputs([str(path)]), read_inputs([str(format2)])
    assert compact.problems == written_whole.problems == []
    spans = compact.spans.finish()
    assert spans.equals(written_whole.spans.finish())
    assert compact.samples.finish().equals(written_whole.samples.finish())
    requests = spans[spans["stage"] == sc.STAGE_REQUEST]
    assert len(requests) == CALLS * PROMPTS and requests["name"].str.startswith("chat ").all()
    assert spans["trace_id"].notna().all() and spans["thread"].notna().all()
    assert (requests[sc.MEM_HOST_RSS] > 0).all() and requests[sc.MEM_HOST_RSS + sc.DELTA_SUFFIX].notna().all()
