"""Running vlmtrace on hostile input as a user would: the CLI in a process of its own, under a memory
limit, with its peak memory and wall time measured, and every path of its directory compared before
and after (only the outputs it was asked to write may change).

The bounds are a gigabyte of peak memory (resident, of the command and the reading processes it forks)
and 30 s of wall time on the 2-core test machine. Memory is asserted as a bound. Time is enforced by
a timeout of WALL_BOUND_S times VLMTRACE_HOSTILE_SLACK (a loaded machine is slow; exhaustion is not),
and each case's measures are printed (`pytest -s`) and recorded as test properties (`--junitxml` with
`-o junit_family=xunit1` keeps them), not asserted as speed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

GiB = 1 << 30
RSS_BOUND_BYTES = 1 * GiB
WALL_BOUND_S = 30.0
ADDRESS_SPACE_BYTES = 8 * GiB  # a runaway fails with MemoryError instead of taking the machine's memory
SLACK = float(os.environ.get("VLMTRACE_HOSTILE_SLACK", "4"))
SOURCE = str(Path(__file__).resolve().parents[2] / "src")
CAPTURED = (".stdout", ".stderr")  # the command's output, captured beside its inputs


@dataclasses.dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_bytes: int

    @property
    def output(self) -> str:
        """stdout and stderr, lines joined (rich folds long lines at the console's width)."""
        return " ".join((self.stdout + "\n" + self.stderr).split())


# The command runs as the child of a small launcher, not of the test process: a process forked from pytest
# (hundreds of MiB into a full run) keeps that resident size as its peak through exec, and the launcher's own
# child starts from a few MiB. The launcher limits the address space, waits, writes the command's peak
# resident size (ru_maxrss, KiB, its forked readers included) to a file, and ends as the command ended.
LAUNCHER = """
import os, resource, signal, sys
limit, peak_file, *command = sys.argv[1:]
resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "vlmtrace", *command])
_, status, usage = os.wait4(pid, 0)
with open(peak_file, "w") as peak:
    peak.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def vlmtrace(*arguments: str, cwd: Path, env: dict[str, str] | None = None, record=None) -> Run:
    """`python -m vlmtrace ARGUMENTS` in `cwd`; its exit code, output and measures."""
    environment = {**os.environ, "PYTHONPATH": SOURCE, "COLUMNS": "200", "TERM": "dumb", **(env or {})}
    out, err = (cwd / name for name in CAPTURED)
    peak_file = cwd.parent / f".{cwd.name}.peak"  # beside the directory compared, not in it
    started = time.monotonic()
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(ADDRESS_SPACE_BYTES), str(peak_file), *arguments],
            cwd=cwd,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # the launcher and the command: killed together at the deadline
        )
    try:
        code = process.wait(timeout=WALL_BOUND_S * SLACK)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise AssertionError(f"vlmtrace {' '.join(arguments)} ran past {WALL_BOUND_S * SLACK:.0f} s") from None
    run = Run(
        code,
        out.read_text(errors="replace"),
        err.read_text(errors="replace"),
        time.monotonic() - started,
        int(peak_file.read_text()) * 1024,
    )
    out.unlink()
    err.unlink()
    peak_file.unlink()
    print(
        f"measured {run.wall_s:6.1f} s {run.peak_rss_bytes >> 20:5d} MiB  exit {run.code}  vlmtrace {' '.join(arguments)[:90]!r}"
    )
    if record is not None:
        record("wall_s", round(run.wall_s, 2))
        record("peak_rss_mib", run.peak_rss_bytes >> 20)
    assert run.peak_rss_bytes < RSS_BOUND_BYTES, f"peak memory {run.peak_rss_bytes >> 20} MiB"
    assert run.code != 3 and "Traceback" not in run.output, run.output
    return run


def tree(root: Path) -> dict[str, tuple]:
    """Every path under `root` with its type, size, modification time and inode (links not followed)."""
    found = {}
    for directory, names, files in os.walk(root):
        for name in names + [name for name in files if name not in CAPTURED]:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            found[os.path.relpath(path, root)] = (
                stat.S_IFMT(info.st_mode),
                info.st_size,
                info.st_mtime_ns,
                info.st_ino,
            )
    return found


def changed(before: dict[str, tuple], after: dict[str, tuple]) -> set[str]:
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
