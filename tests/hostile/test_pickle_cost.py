"""`vlmtrace report` on PyTorch memory snapshots built to cost memory, stack or CPU time without running
any code: each is refused or stopped at a bound with a message naming it, within a gigabyte, beside a
good journal that is still reported."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import orjson
import pytest

from tests.analysis.synthetic import write_journal
from tests.hostile.cli import changed, tree, vlmtrace
from tests.hostile.test_reading import LEAK

PROTO = b"\x80\x04"


def _binunicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _segments_dict(value: bytes) -> bytes:
    """A pickle of {"segments": [], "x": <value>}: a snapshot in form, whatever `value` costs."""
    return PROTO + b"}(" + _binunicode("segments") + b"]" + _binunicode("x") + value + b"u."


def colliding_keys(count: int) -> bytes:
    """A dict whose integer keys all hash alike (multiples of 2**61 - 1)."""
    return pickle.dumps({"segments": [], "x": {k * (2**61 - 1): 0 for k in range(1, count)}}, protocol=4)


# name: (pickle bytes, extra report arguments, what the output says)
CASES: dict[str, tuple[bytes, tuple[str, ...], str]] = {
    "a memo index of 2**32 - 1 is one entry": (
        PROTO + b"]r\xff\xff\xff\xff0" + _segments_dict(b"N")[2:],
        (),
        "report:",
    ),
    "a memo index read before it was stored": (
        PROTO + b"j\xff\xff\xff\x7f.",
        (),
        "memo entry 2147483647 was never stored",
    ),
    "7 MB of empty sets": (_segments_dict(b"(" + b"\x8f" * (7 << 20) + b"l"), (), "needs more than 536,870,912 bytes"),
    "9 MB of empty dicts": (_segments_dict(b"(" + b"}" * (9 << 20) + b"l"), (), "needs more than 536,870,912 bytes"),
    "5 MB of empty dicts, within the bound": (_segments_dict(b"(" + b"}" * (5 << 20) + b"l"), (), "report:"),
    "a memo of 2 million empty lists": (
        _segments_dict(b"(" + b"]\x94" * 2_000_000 + b"l"),
        ("--max", "snapshot-bytes=64M"),
        "needs more than 67,108,864 bytes",
    ),
    "1M nested 1-tuples as a dict key": (
        _segments_dict(b"}N" + b"\x85" * 1_000_000 + b"Ns"),
        (),
        "a tuple as a dict key",
    ),
    "1M nested 1-tuples as a value": (_segments_dict(b"N" + b"\x85" * 1_000_000), (), "report:"),
    "a million marks": (PROTO + b"(" * 1_000_000 + b".", (), "marks nested deeper than 1000"),
    "60k colliding integer keys": (colliding_keys(60_000), (), "an integer past ±2**20 as a dict key"),
    "a set of colliding floats": (
        _segments_dict(b"\x8f(" + (b"G" + struct.pack(">d", 1.5)) * 3 + b"\x90"),
        (),
        "a float as a set member",
    ),
    "a 1 GB string length in 20 bytes": (
        PROTO + b"\x8d" + (1 << 30).to_bytes(8, "little") + b"abc",
        (),
        "needs more than",
    ),
    "a long of 2**31 bytes": (
        PROTO + b"\x8b" + struct.pack("<i", 2**31 - 1) + b"\x01",
        (),
        "an integer of 2,147,483,647 bytes",
    ),
    "a class by GLOBAL": (pickle.dumps(Path("/"), protocol=2), (), "refusing to load pathlib.PosixPath"),
    "a call by REDUCE": (PROTO + b"NNR.", (), "snapshots hold plain data only"),
    "a dict key as a list": (_segments_dict(b"}]Ns"), (), "a list as a dict key"),
    "a truncated pickle": (
        pickle.dumps({"segments": [{"blocks": list(range(1000))}]}, protocol=4)[:-50],
        (),
        "ends in the middle",
    ),
    "a memo written by PUT (protocol 0-1)": (PROTO + b"]p0\n.", (), "not one of a plain-data pickle"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_costly_snapshot_is_refused_or_stopped_and_the_journal_beside_it_is_reported(
    tmp_path: Path, case: str, record_property
):
    content, arguments, message = CASES[case]
    runs = tmp_path / "runs"
    runs.mkdir()
    write_journal(LEAK, runs / "good.jsonl")
    (runs / "snapshot.pickle").write_bytes(content)
    before = tree(tmp_path)
    run = vlmtrace(
        "report", "runs", *arguments, "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property
    )
    assert message in run.output, run.output
    summary = orjson.loads((tmp_path / "s.json").read_bytes())
    assert summary["leak_found"] and summary["requests_completed"] == LEAK.requests
    assert changed(before, tree(tmp_path)) == {"r.html", "s.json"}


def test_the_cpu_budget_stops_a_slow_snapshot(tmp_path: Path, record_property):
    """Ten million small opcodes, each cheap: the CPU bound, not the file's size, ends the decoding."""
    (tmp_path / "slow.pickle").write_bytes(_segments_dict(b"(" + b"N0" * 10_000_000 + b"l"))
    run = vlmtrace(
        "report",
        "slow.pickle",
        "--max",
        "cpu-seconds=0.5",
        "-o",
        "r.html",
        "--json",
        "s.json",
        cwd=tmp_path,
        record=record_property,
    )
    assert run.code == 2 and "bound of 0.5 CPU seconds" in run.output, run.output


def test_a_snapshot_pickled_by_protocol_5_is_summarised_as_by_protocol_4(tmp_path: Path, record_property):
    frames = [{"filename": "/srv/app/model.py", "line": 7, "name": "forward"}]
    snapshot = {
        "segments": [
            {
                "device": 0,
                "total_size": 4 << 20,
                "blocks": [
                    {"size": 1 << 20, "state": "active_allocated", "frames": frames},
                    {"size": 3 << 20, "state": "inactive", "frames": []},
                ],
            }
        ]
    }
    summaries = []
    for protocol in (4, 5):
        (tmp_path / "s.pickle").write_bytes(pickle.dumps(snapshot, protocol=protocol))
        run = vlmtrace("report", "s.pickle", "-o", "r.html", "--json", "s.json", cwd=tmp_path, record=record_property)
        assert run.code == 0, run.output
        summaries.append(orjson.loads((tmp_path / "s.json").read_bytes())["snapshots"])
    assert summaries[0] == summaries[1] and "forward (model.py:7)" in str(summaries[0])
