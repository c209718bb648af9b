"""A process killed inside nested spans: the journal still says which spans were in flight and under what memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.export.child_process import HERE, SRC, start_python
from tests.export.journal_lines import journal_files, of_kind, read_journal_file
from vlmtrace import semconv
from vlmtrace.export import fatal_guard

CHILD = os.path.join(HERE, "crash_child.py")
ABORT_STRESS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks", "abort_stress.py")
IN_FLIGHT = [semconv.SPAN_PIPELINE_INFER, "chat tiny-vl", semconv.SPAN_TURBOMIND_STREAM]


def run_child(mode: str, journal, *args: str, **env: str):
    child = start_python(CHILD, mode, str(journal), *args, **env)
    try:
        _out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    return child.returncode, err


def in_flight_spans(records):
    ended = {r["span_id"] for r in of_kind(records, "end")}
    return [r for r in of_kind(records, "start") if r["span_id"] not in ended]


def assert_in_flight_spans_and_last_memory(records):
    flying = in_flight_spans(records)
    assert [r["name"] for r in flying] == IN_FLIGHT
    pipeline, request, stream = flying
    assert request["parent_id"] == pipeline["span_id"] and stream["parent_id"] == request["span_id"]
    assert pipeline["attrs"][semconv.PIPELINE_PROMPTS] == 40
    assert request["attrs"][semconv.LMDEPLOY_SESSION_ID] == 17
    assert stream["attrs"][semconv.MEM_TORCH_ALLOCATED] == 6 << 30
    assert all(r["thread"] == "MainThread" for r in flying)
    assert [r["name"] for r in of_kind(records, "end")][-1] == semconv.SPAN_VISION_PREPROCESS
    assert of_kind(records, "sample")[-1]["attrs"] == {
        semconv.MEM_TORCH_ALLOCATED: 7 << 30,
        semconv.MEM_GPU_USED: 80 << 30,
        semconv.MEM_GPU_PROCESS + semconv.PER_DEVICE_SUFFIX: [40 << 30, 40 << 30],
    }
    assert of_kind(records, "end_marker") == []


@pytest.fixture(scope="module", autouse=True)
def fatal_signal_guard():
    """The guard, from the compiled core built with the installation (pip install -e . builds it in place)."""
    assert fatal_guard.guard() is not None, "the compiled core is missing: pip install -e . builds it"


@pytest.mark.parametrize("mode", ["abort-in-thread", "abort-main"])
def test_abort_inside_nested_spans_leaves_in_flight_spans_memory_and_python_stacks(tmp_path, mode, refused_endpoint):
    returncode, _ = run_child(mode, tmp_path / "j", refused_endpoint)

    assert returncode == -signal.SIGABRT
    (path,) = journal_files(tmp_path / "j")
    records, fatal = read_journal_file(path)
    assert records[0]["k"] == "header"
    assert_in_flight_spans_and_last_memory(records)
    assert fatal.startswith("Fatal Python error: Aborted")
    assert 'crash_child.py", line' in fatal
    assert " in die" in fatal and " in main" in fatal
    if mode == "abort-in-thread":
        assert fatal.count("Thread 0x") + fatal.count("Current thread 0x") >= 2  # all threads, not just the dying one


def test_a_native_library_taking_sigabrt_over_gets_faulthandler_put_back_in_front_of_it(tmp_path):
    """TurboMind replaces SIGABRT's handler once its engine is up; the journal's samples notice and re-arm,
    and the library's handler still runs after the stacks (here it exits with status 6)."""
    returncode, _ = run_child("native-handler-abort", tmp_path / "j")

    assert returncode == signal.SIGABRT  # the native handler's _exit(6), not a death by the signal
    (path,) = journal_files(tmp_path / "j")
    records, fatal = read_journal_file(path)
    assert_in_flight_spans_and_last_memory(records)
    assert fatal.startswith("Fatal Python error: Aborted") and " in die" in fatal
    (warning,) = of_kind(records, "warning")
    assert warning["source"] == "faulthandler" and "SIGABRT" in warning["message"]
    assert "(by libc.so.6 (_exit))" in warning["message"]  # who took it over, named by dladdr


def test_a_native_handler_that_never_returns_cannot_keep_an_aborting_process_alive(tmp_path):
    """The guard in front of faulthandler ends the process with SIGABRT's default action once the chain
    behind it (faulthandler's stacks, then the library's handler, which waits forever) passes its bound."""
    started = time.monotonic()
    returncode, _ = run_child("hanging-handler-abort", tmp_path / "j")

    assert returncode == -signal.SIGABRT
    assert time.monotonic() - started < 30  # the child's start, its spans, then at most the guard's bound
    (path,) = journal_files(tmp_path / "j")
    records, fatal = read_journal_file(path)
    assert_in_flight_spans_and_last_memory(records)
    assert fatal.startswith("Fatal Python error: Aborted") and " in die" in fatal


def test_aborts_while_threads_make_spans_die_by_sigabrt_with_stacks_every_time(tmp_path):
    """benchmarks/abort_stress.py, 3 runs of each way of aborting with each kind of journal (the benchmark
    runs 50 or 100): never a hang, never a SIGSEGV, always faulthandler's stacks in the journal."""
    done = subprocess.run(
        [
            sys.executable,
            ABORT_STRESS,
            "--runs",
            "3",
            "--within-s",
            "10",
            "--src",
            SRC,
            "--json",
            str(tmp_path / "runs.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "0 of 36 runs did not die" in done.stdout


def test_sigkill_inside_nested_spans_leaves_in_flight_spans_and_memory(tmp_path):
    child = start_python(CHILD, "sigkill", str(tmp_path / "j"))
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.communicate()

    assert child.returncode == -signal.SIGKILL
    (path,) = journal_files(tmp_path / "j")
    records, rest = read_journal_file(path)
    assert rest == ""  # nothing was mid-write: every record is whole
    assert_in_flight_spans_and_last_memory(records)


def test_a_process_killed_10_ms_after_its_last_span_started_has_it_in_the_journal(tmp_path):
    """SIGKILL leaves no handler a chance: what holds is the time bound, every record older than 10 ms is in."""
    returncode, _ = run_child("kill-self", tmp_path / "j")

    assert returncode == -signal.SIGKILL
    (path,) = journal_files(tmp_path / "j")
    records, rest = read_journal_file(path)
    assert rest == ""
    assert_in_flight_spans_and_last_memory(records)


def test_fatal_stacks_follow_the_journal_across_rotations(tmp_path):
    returncode, _ = run_child("rotate-abort", tmp_path / "j")

    assert returncode == -signal.SIGABRT
    files = journal_files(tmp_path / "j")
    # max_files, and one more where the abort came while the flushing thread rotated (the next file
    # opened, the oldest not deleted yet)
    assert len(files) in (3, 4)
    assert read_journal_file(files[0])[0][0]["seq"] > 3
    records, fatal = [], []
    for path in files:
        file_records, rest = read_journal_file(path)
        records.extend(file_records)
        if rest:
            fatal.append((path, rest))
    ((path, text),) = fatal
    assert text.startswith("Fatal Python error: Aborted")
    assert path in files[-2:]  # the file under the journal's descriptor when the signal came
    assert [r["name"] for r in in_flight_spans(records)] == IN_FLIGHT


def test_a_faulthandler_the_application_enabled_is_left_alone_and_the_journal_says_so(tmp_path):
    returncode, stderr = run_child("abort-main", tmp_path / "j", APP_FAULTHANDLER="1")

    assert returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in stderr  # where the application asked for it
    (path,) = journal_files(tmp_path / "j")
    records, rest = read_journal_file(path)
    assert rest == ""
    assert [w["source"] for w in of_kind(records, "warning")] == ["faulthandler"]
    assert_in_flight_spans_and_last_memory(records)


def test_a_normal_exit_writes_the_end_marker_from_atexit(tmp_path, refused_endpoint):
    returncode, _ = run_child("exit", tmp_path / "j", refused_endpoint)

    assert returncode == 0
    (path,) = journal_files(tmp_path / "j")
    records, rest = read_journal_file(path)
    assert rest == ""
    assert in_flight_spans(records) == []
    marker = records[-1]
    assert marker["k"] == "end_marker" and marker["clean"] is True
    assert marker["spans_started"] == marker["spans_ended"] == 4
    assert of_kind(records, "dropped")[-1]["otlp_spans"] == 4  # the endpoint refused them all


def test_the_handler_chain_stays_a_chain_across_journals_reclaims_rotations_and_a_fork(tmp_path):
    """Journals opened and closed (re-instrumenting), a library taking SIGABRT over with a handler that
    never returns, the upkeep putting the guard and faulthandler back in front of it, rotations, a forked
    child: an abort still ends the process by SIGABRT, with the stacks in the journal open at the time."""
    script = """if True:
        import ctypes, os, signal, sys
        from vlmtrace.export.journal import JournalWriter
        def journal(name, **extra):
            return JournalWriter.open(os.path.join(sys.argv[1], name), max_bytes=extra.get("max_bytes", 1 << 20),
                                      max_files=3, resource={}, versions={})
        first, second = journal("first"), journal("second")
        libc = ctypes.CDLL(None)
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signal.SIGABRT, ctypes.cast(libc.pause, ctypes.c_void_p))
        second.maintain()
        second.maintain()
        second.close()
        first.close()
        third = journal("third", max_bytes=4096)
        third.maintain()
        for i in range(100):
            third.write_sample(i, {"pad": "x" * 200})
        third.flush()
        pid = os.fork()
        if pid == 0:
            third.write_sample(0, {"who": "child"})
            third.close()
            os._exit(0)
        os.waitpid(pid, 0)
        third.maintain()
        os.abort()
        """
    started = time.monotonic()
    child = start_python("-c", script, str(tmp_path))
    _, stderr = child.communicate(timeout=60)

    assert child.returncode == -signal.SIGABRT, stderr
    assert time.monotonic() - started < 30
    newest = [path for path in journal_files(tmp_path / "third") if read_journal_file(path)[0][0]["pid"] == child.pid][
        -1
    ]
    _, fatal = read_journal_file(newest)
    assert fatal.startswith("Fatal Python error: Aborted")


def test_sigterm_writes_the_end_record_and_dies_by_sigterm_within_the_shutdown_timeout(tmp_path, blackhole_endpoint):
    """A hung collector cannot hold a SIGTERM'd process past shutdown_timeout_ms (500 ms here): the journal
    ends first, the export gets what is left of the timeout, then the process dies by the signal."""
    child = start_python(CHILD, "sigkill", str(tmp_path / "j"), blackhole_endpoint)  # waits to be signalled
    try:
        assert child.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        child.kill()
        child.communicate()

    assert child.returncode == -signal.SIGTERM
    assert took < 0.5 + 1.5  # the timeout, and a loaded machine's scheduling
    (path,) = journal_files(tmp_path / "j")
    records, rest = read_journal_file(path)
    assert rest == ""
    assert_in_flight_spans_and_last_memory([r for r in records if r["k"] != "end_marker"])
    marker = records[-1]
    assert marker["k"] == "end_marker" and marker["ended_by"] == "SIGTERM"
    assert marker["spans_started"] == marker["spans_ended"] + 3  # the three spans it was inside


def test_sigterm_ends_a_process_whose_main_thread_is_in_a_long_native_call(tmp_path):
    """Python runs vlmtrace's SIGTERM handler only when the main thread runs Python again; the guard's C
    handler bounds that wait (the shutdown timeout and 1 s) and then ends the process by SIGTERM's default
    action, as it would have ended at once without vlmtrace. The native call here would take ~30 s."""
    child = start_python(
        "-c",
        """if True:
        import hashlib, sys
        from vlmtrace.export.journal import JournalWriter
        writer = JournalWriter.open(sys.argv[1], max_bytes=1 << 20, max_files=2, resource={}, versions={})
        writer.write_sample(1, {"i": 1})
        print("ready", flush=True)
        hashlib.pbkdf2_hmac("sha256", b"a long native call", b"the GIL released", 30_000_000)
        print("returned", flush=True)
        """,
        str(tmp_path / "j"),
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        child.kill()
        out, _ = child.communicate()

    assert child.returncode == -signal.SIGTERM
    assert "returned" not in out
    assert took < 10
