"""The heap counter (probes/heap_counter.c, probes/heap.py): built with the installation, preloaded
into a process of its own, it counts malloc's chunks where they are made and freed, and the memory probe
reads it beside RSS; a process without it reads no heap key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vlmtrace import semconv as sc
from vlmtrace.launch import environment
from vlmtrace.probes import heap

MiB = 1 << 20
SOURCE = Path(heap.__file__).with_name("heap_counter.c")

CHILD = """
import ctypes, json, threading
from vlmtrace.probes.heap import in_use_reader
from vlmtrace.probes.memory import MemoryProbe
from vlmtrace import semconv as sc
read = in_use_reader()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, (ctypes.c_void_p,)
before = read()
untouched = libc.malloc(8 << 20)  # no page touched: RSS does not see it, the counter does
after_malloc = read()
libc.free(untouched)
after_free = read()
kept = []
worker = threading.Thread(target=lambda: kept.append(bytearray(3 << 20)))  # made on one thread,
worker.start(); worker.join()
after_thread = read()
kept.clear()  # freed on another
after_other_free = read()
probe = MemoryProbe(probes=("host",), nvml=None)
print(json.dumps({"malloc": after_malloc - before, "free": after_free - after_malloc,
                  "thread": after_thread - after_free, "other_free": after_other_free - after_thread,
                  "reading": sorted(probe.read().attributes), "sample": sorted(probe.sample().attributes)}))
"""


@pytest.fixture(scope="module")
def library():
    assert heap.library_path() is not None, "the heap counter is built with the installation: pip install -e ."
    return str(heap.library())


def _child(preload: str | None, code: str = CHILD) -> dict:
    """What `code`, run in a process of its own (with `preload` preloaded), printed last, as JSON."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_preloaded_counter_follows_malloc_and_free_across_threads(library):
    counted = _child(library)
    # usable sizes: at least what was asked, at most a page more (glibc's chunk header and rounding)
    assert 8 * MiB <= counted["malloc"] <= 8 * MiB + 4096
    assert counted["free"] == pytest.approx(-counted["malloc"], abs=16 * 1024)
    assert 3 * MiB <= counted["thread"] <= 3 * MiB + 4096
    assert counted["other_free"] == pytest.approx(
        -counted["thread"], abs=16 * 1024
    )  # the interpreter's own small changes between reads
    for reading in ("reading", "sample"):
        assert {sc.MEM_HOST_RSS, sc.MEM_HOST_HEAP} <= set(counted[reading])


STAGES_CHILD = """
import json, random, threading
from vlmtrace import semconv as sc
from vlmtrace.probes.heap import stage_tags
tags = stage_tags()
def bytes_of(stage):
    return tags.read()[sc.MEM_HOST_HEAP_BY_STAGE][sc.HEAP_STAGE_TAGS.index(stage)]
result = {}
outer = tags.enter("vision.preprocess")
handed = bytearray(2 << 20)  # allocated by vision preprocessing ...
small = [bytearray(1000) for _ in range(100)]  # below the large chunks' size: not charged to a stage
result["handed"] = bytes_of("vision.preprocess")
tags.enter("engine.stream")
del handed  # ... freed by the engine stream: given back to vision preprocessing
kept = [bytearray(1 << 20)]  # and the engine stream's own
result["after_hand_off"] = {stage: bytes_of(stage) for stage in ("vision.preprocess", "engine.stream")}
def worker():
    tags.enter("vision.forward")
    kept.append(bytearray(3 << 20))
thread = threading.Thread(target=worker)
thread.start(); thread.join()
result["other_thread"] = bytes_of("vision.forward")
tags.enter("request")
grown = bytearray(100 << 10)
for _ in range(20):
    grown.extend(bytes(100 << 10))  # realloc: charged anew to the stage that resized it
result["realloc"] = bytes_of("request") - len(grown)
del grown
result["realloc_freed"] = bytes_of("request")
tags.enter("pipeline")  # many chunks at once, freed in another order: the table's deletions keep every tag
many = [bytearray(random.randint(64 << 10, 256 << 10)) for _ in range(20000)]
random.shuffle(many)
result["many"] = bytes_of("pipeline") - sum(len(block) for block in many)
del many
result["many_freed"] = bytes_of("pipeline")
tags.restore(outer)
result["outer"] = outer
print(json.dumps(result))
"""


def test_large_chunks_stay_charged_to_the_stage_that_allocated_them(library):
    result = _child(library, STAGES_CHILD)
    assert 2 * MiB <= result["handed"] <= 2 * MiB + 4096  # the small blocks are not in it
    assert result["after_hand_off"]["vision.preprocess"] == 0
    assert MiB <= result["after_hand_off"]["engine.stream"] <= MiB + 4096
    assert 3 * MiB <= result["other_thread"] <= 3 * MiB + 4096
    assert 0 <= result["realloc"] <= MiB // 2 and result["realloc_freed"] == 0  # bytearray keeps spare room
    assert 0 <= result["many"] <= 20000 * 4096 and result["many_freed"] == 0
    assert result["outer"] == 0  # a thread starts outside every stage


SURVIVORS_CHILD = """
import json, time
from vlmtrace import semconv as sc
from vlmtrace.probes.heap import stage_tags
tags = stage_tags()
empty = tags.survivors()
kept, working = [], []
tags.enter("vision.preprocess")
for step in range(3):  # a leak of 1 MiB and a working set of 2 MiB every 20 ms
    kept.append(bytearray(1 << 20))
    working.append(bytearray(2 << 20))
    time.sleep(0.02)
tags.enter("engine.stream")
kept.append(bytearray(3 << 20))
tags.enter(None)
working.clear()  # given back, by another stage than allocated it
survivors = tags.survivors()[sc.MEM_HOST_HEAP_SURVIVORS]
late = bytearray(1 << 20)  # allocated after 256 intervals of the first width: they merge, and the width doubles
time.sleep(0.016 * 256 + 0.1)
late2 = bytearray(1 << 20)
merged = tags.survivors()[sc.MEM_HOST_HEAP_SURVIVORS]
del late, late2
freed_after_merge = tags.survivors()[sc.MEM_HOST_HEAP_SURVIVORS]
def row(reading, stage):
    return reading["bytes"][sc.HEAP_STAGE_TAGS.index(stage)]
print(json.dumps({"empty": empty, "origin_ms": survivors["origin_ms"], "now_ms": time.time() * 1000,
                  "width": survivors["width_ms"], "preprocess": row(survivors, "vision.preprocess"),
                  "stream": row(survivors, "engine.stream"), "unused": row(survivors, "vision.forward"),
                  "merged_width": merged["width_ms"], "merged_outside": row(merged, None),
                  "freed_outside": row(freed_after_merge, None), "merged_preprocess": row(merged, "vision.preprocess")}))
"""


def test_what_each_stage_still_holds_is_kept_by_when_it_was_allocated(library):
    result = _child(library, SURVIVORS_CHILD)
    assert result["empty"] == {} or sc.MEM_HOST_HEAP_SURVIVORS in result["empty"]
    assert result["width"] == 16 and result["merged_width"] == 32
    assert 0 < result["now_ms"] - result["origin_ms"] < 120_000  # unix milliseconds, before now
    preprocess = result["preprocess"]
    assert len(preprocess) == 256 and result["unused"] == []
    held = [value for value in preprocess if value]
    # Only the leak's 1 MiB of each step is left, in the intervals it was allocated in.
    assert len(held) >= 2 and all(MiB <= value <= 2 * MiB + 8192 for value in held)
    assert 3 * MiB <= sum(preprocess) <= 3 * MiB + 3 * 8192
    assert 3 * MiB <= sum(result["stream"]) <= 3 * MiB + 4096
    # After the width doubled, neighbours merged: the same bytes, in half as many intervals.
    assert sum(result["merged_preprocess"]) == sum(preprocess)
    assert 2 * MiB <= sum(result["merged_outside"]) - sum(result["freed_outside"]) <= 2 * MiB + 8192


TASKS_CHILD = """
import asyncio, json, sys
from vlmtrace import semconv as sc
from vlmtrace.probes.heap import stage_tags
tags = stage_tags()
def bytes_of(stage):
    return tags.read()[sc.MEM_HOST_HEAP_BY_STAGE][sc.HEAP_STAGE_TAGS.index(stage)]
kept = []
async def keep(stage):
    tags.enter(stage)
    await asyncio.sleep(0)  # the other task runs here, in its own stage
    kept.append(bytearray(1 << 20))
    return stage
async def fail():
    tags.enter("vision.forward")
    await asyncio.sleep(0)
    raise ValueError("raised through the carried coroutine")
async def cancelled():
    await asyncio.sleep(10)
async def decode():  # LMDeploy decodes a request's images on the loop's default executor
    tags.enter("vision.preprocess")
    await asyncio.get_running_loop().run_in_executor(None, lambda: kept.append(bytearray(1 << 20)))
    return "decoded"
async def main():
    done = await asyncio.gather(keep("engine.stream"), keep("request.prompt"), fail(), decode(), return_exceptions=True)
    waiting = asyncio.ensure_future(cancelled())
    await asyncio.sleep(0)
    waiting.cancel()
    try:
        await waiting
    except asyncio.CancelledError:
        done.append("cancelled")
    return [repr(item) if isinstance(item, Exception) else item for item in done]
runner = {runner!r}
if runner == "uvloop imported first":  # uvicorn imports it when it starts serving: before or after
    import uvloop
tags.carry_tasks()
if runner == "asyncio":
    result = asyncio.run(main())
else:
    import uvloop
    result = uvloop.run(main())
loop_class = sys.modules["uvloop"].Loop if "uvloop" in sys.modules else asyncio.BaseEventLoop
tags.stop_carrying_tasks()
job = tags.submitted(print)
print(json.dumps({"charged_once": tags.submitted(job) is job and job is not print, "results": result, "stream": bytes_of("engine.stream"), "prompt": bytes_of("request.prompt"),
                  "executor": bytes_of("vision.preprocess"),
                  "carrying": [loop_class.create_task.__qualname__, loop_class.run_in_executor.__qualname__]}))
"""


@pytest.mark.parametrize("runner", ["asyncio", "uvloop imported first", "uvloop imported later"])
def test_each_asyncio_task_step_is_charged_to_its_own_stage(library, runner):
    if runner != "asyncio":
        pytest.importorskip("uvloop")
    result = _child(library, TASKS_CHILD.replace("{runner!r}", repr(runner)))
    # Results, exceptions and cancellation pass through the carried coroutines unchanged.
    assert result["results"] == [
        "engine.stream",
        "request.prompt",
        "ValueError('raised through the carried coroutine')",
        "decoded",
        "cancelled",
    ]
    assert MiB <= result["stream"] <= MiB + 4096 and MiB <= result["prompt"] <= MiB + 4096
    assert MiB <= result["executor"] <= MiB + 4096  # the default executor's job, charged to its submitter's stage
    assert result["charged_once"]  # handed on to an executor that charges jobs too, a job is not wrapped again
    # stop_carrying_tasks put the loop's own back (uvloop's: its compiled loop's, inherited again)
    owner = "BaseEventLoop" if runner == "asyncio" else "Loop"
    assert result["carrying"] == [f"{owner}.create_task", f"{owner}.run_in_executor"]


def test_without_the_counter_readings_have_no_heap_key():
    counted = subprocess.run(
        [sys.executable, "-c", "from vlmtrace.probes.heap import in_use_reader; print(in_use_reader())"],
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert counted.stdout.strip() == "None"
    from vlmtrace.probes.memory import MemoryProbe

    if heap.in_use_reader() is None:  # this test process itself runs without it
        assert sc.MEM_HOST_HEAP not in MemoryProbe(probes=("host",), nvml=None).read().attributes


def test_an_installation_without_it_or_a_library_that_does_not_load_is_named(tmp_path, monkeypatch, library):
    monkeypatch.setattr(heap, "library_path", lambda: None)
    with pytest.raises(heap.HeapCounterUnavailable, match="this installation of vlmtrace has no heap counter"):
        heap.library()
    not_elf = tmp_path / "not-a-library.so"  # the loader refuses it: a program started with it would not run
    not_elf.write_text("not-elf")
    monkeypatch.setattr(heap, "library_path", lambda: not_elf)
    with pytest.raises(heap.HeapCounterUnavailable, match="the heap counter does not load here"):
        heap.library()


def test_vlmtrace_run_preloads_it_first_and_keeps_the_users_preloads(tmp_path, library):
    env = environment({"LD_PRELOAD": "/opt/a.so:/opt/b.so"}, journal=str(tmp_path / "j"), heap_counter=library)
    assert env["LD_PRELOAD"].split() == [library, "/opt/a.so", "/opt/b.so"]
    assert "LD_PRELOAD" not in environment({}, journal=str(tmp_path / "j"))


def test_doctor_says_whether_it_is_loaded_and_whether_this_installation_has_it(monkeypatch, library):
    from vlmtrace.cli import doctor

    monkeypatch.setattr(heap, "in_use_reader", lambda: None)  # this process runs without it
    assert doctor._heap_counter() == f"not loaded ({library}; `vlmtrace run --heap-counter` preloads it)"
    monkeypatch.setattr(heap, "library_path", lambda: None)
    assert doctor._heap_counter() == "not in this installation (it is built with the wheel on Linux)"
    monkeypatch.setattr(heap, "in_use_reader", lambda: lambda: 1)
    assert doctor._heap_counter().startswith("loaded")


def test_a_counter_built_before_the_survivors_still_charges_stages_and_reads_none(tmp_path):
    """A library preloaded by hand and kept across an upgrade lacks `vlmtrace_heap_survivors`: the stage charges
    still work, the survivors' reading is empty, and instrumenting does not fail."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    source = tmp_path / "older_heap_counter.c"
    source.write_text(SOURCE.read_text().replace("vlmtrace_heap_survivors", "vlmtrace_heap_not_yet"))
    library = tmp_path / "older_heap_counter.so"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", str(source), "-o", str(library)], check=True, timeout=120)
    result = _child(
        str(library),
        """
import json
from vlmtrace import semconv as sc
from vlmtrace.probes.heap import stage_tags
import vlmtrace
tags = stage_tags()
tags.enter("vision.preprocess")
kept = bytearray(1 << 20)
charged = tags.read()[sc.MEM_HOST_HEAP_BY_STAGE][sc.HEAP_STAGE_TAGS.index("vision.preprocess")]
vlmtrace.instrument(journal=False)
vlmtrace.uninstrument()
print(json.dumps({"charged": charged, "survivors": tags.survivors()}))
""",
    )
    assert result["charged"] >= MiB and result["survivors"] == {}
